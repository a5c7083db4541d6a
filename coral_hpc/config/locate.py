"""Field paths and the lines of the YAML file they were written on: ``models[1].slo.ttft_s``
from a path, and the line of a field (or of its nearest parent present in the file)."""

from __future__ import annotations

from pathlib import Path

from coral_hpc.config.source import FieldLines, FieldPath, SourceError, load_yaml


def _dotted(loc: FieldPath) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _nearest_line(lines: FieldLines, loc: FieldPath) -> int:
    # a mapping key written as a number (`1: x`) is indexed by its text
    as_text = tuple(str(part) for part in loc)
    for cut in range(len(loc), -1, -1):
        for key in (loc[:cut], as_text[:cut]):
            if key in lines:
                return lines[key]
    return 1


def field_line(path: str | Path, loc: FieldPath) -> int:
    """The 1-based line of field ``loc`` (``("models", 2, "min_replicas")``) in the YAML file at
    ``path``, or of its nearest parent present there; 1 when the file cannot be read. For errors
    found after loading (a plan that cannot meet ``min_replicas``) that must still name a line."""
    try:
        source = load_yaml(path)  # the same bounded reader as load_deployment
    except SourceError:
        return 1
    return _nearest_line(source.lines, tuple(loc))
