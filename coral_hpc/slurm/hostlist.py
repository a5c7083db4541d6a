"""Slurm hostlist expressions (``a100-[01-02],v100-01``) to and from node names. Pure."""

from __future__ import annotations

import functools
import itertools
import re

_BRACKET_RE = re.compile(r"\[([^\]]*)\]")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_range(spec: str) -> list[str]:
    values: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        low, sep, high = item.partition("-")
        if not sep:
            values.append(low)
            continue
        if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
            raise ValueError(f"bad hostlist range [{spec}]")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


@functools.lru_cache(maxsize=16384)
def expand_hostlist(expression: str | None) -> tuple[str, ...]:
    """``"a100-[01-02],gpu[1,3-4]"`` → ``("a100-01", "a100-02", "gpu1", "gpu3", "gpu4")``.

    Empty, ``None``, ``(null)`` and ``N/A`` give ``()``. Several bracket groups in one name
    expand as a product, as Slurm does. Raises ValueError on malformed ranges.
    """
    if not expression or expression in ("(null)", "N/A", "None"):
        return ()
    names: list[str] = []
    for part in _split_top_level(expression):
        pieces = _BRACKET_RE.split(part)
        # pieces alternate: literal, range, literal, range, ..., literal
        choices = [
            [piece] if index % 2 == 0 else _expand_range(piece)
            for index, piece in enumerate(pieces)
        ]
        names.extend("".join(combo) for combo in itertools.product(*choices))
    return tuple(names)


_TAIL_NUMBER_RE = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: list[str] | tuple[str, ...]) -> str:
    """The inverse of :func:`expand_hostlist` for names that end in numbers
    (``a100-01, a100-02`` → ``a100-[01-02]``); for display only."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        match = _TAIL_NUMBER_RE.match(name)
        if not match:
            plain.append(name)
            order.append(name)
            continue
        key = (match.group(1), len(match.group(2)))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(match.group(2)))
    out: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            out.append(entry)
            continue
        prefix, width = entry
        numbers = sorted(set(groups[entry]))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        ranges: list[str] = []
        start = prev = numbers[0]
        tail: list[int | None] = [*numbers[1:], None]
        for n in tail:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
