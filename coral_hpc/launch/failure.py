"""Why a replica's job failed: the last error line of its logs, for ``status`` and the cool-down.

A replica that crashes while starting (vLLM refusing a ``max_model_len`` its KV cache cannot
hold, a missing checkpoint, an out-of-memory kill) says why in its logs, not to Slurm: Slurm only
knows FAILED and an exit code. The logs are the ones ``coral-hpc logs`` shows
(``<state_dir>/logs``): the entrypoint's and the engine's per rank (``<replica>.<job>.rank<r>
[.engine].log``) and submitit's ``<job>_*.err``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["failure_line", "last_error_line", "replica_log_files"]

#: an exception's closing line as Python prints it (``ValueError: ...``), anywhere in a log line:
#: vLLM prefixes its engine-core lines with ``(EngineCore_DP0 pid=…)`` or ``ERROR 12-03 …``
_EXCEPTION = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (\S.*)$")
#: a wrapper that only points back at the real error above it. vLLM 0.11-0.32
#: (``vllm/v1/engine/utils.py``): "Engine core initialization failed. See root cause above.";
#: ``vllm/v1/engine/exceptions.py``: "... See stack trace (above) for the root cause."
_WRAPPER = re.compile(r"root cause above|stack trace \(above\)", re.IGNORECASE)
#: a log record below ERROR, in vLLM's format ``LEVEL MM-DD HH:MM:SS [file.py:line]``: its
#: words may quote an exception it survived ("Failed to create oneDNN linear, fallback to torch
#: linear. Exception: ...", vLLM's CPU build), and Python's logging's ``LEVEL:name:``
_NOT_AN_ERROR = re.compile(r"\b(DEBUG|INFO|WARNING) (\d\d-\d\d \d\d:\d\d:\d\d|\S+:\d+\])"
                           r"|^(DEBUG|INFO|WARNING):")
#: the entrypoint's own summary when the engine died before /health (coral_hpc.launch.entrypoint)
_ENTRYPOINT = re.compile(r"engine (exited|timeout|stopped) before answering /health.*$")
#: how much of a log's end is read: an engine's start-up log is a few hundred KB at most
TAIL_BYTES = 256 * 1024
#: the longest reason kept (status shows it in one table cell)
MAX_CHARS = 400


def _tail(path: Path) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            return handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def last_error_line(lines: Iterable[str]) -> str | None:
    """The last exception line (``Type: message``) of ``lines`` that is not a wrapper pointing
    at the one above it; failing that, the last wrapper; None when there is none."""
    found: str | None = None
    wrapper: str | None = None
    for line in lines:
        match = _EXCEPTION.search(line.rstrip())
        if match is None or _NOT_AN_ERROR.search(line[:match.start()]):
            continue
        text = f"{match.group(1)}: {match.group(2)}"
        if _WRAPPER.search(text):
            wrapper = text
        else:
            found = text
    last = found or wrapper
    return None if last is None else last[:MAX_CHARS]


def replica_log_files(logs_dir: Path, replica_id: str, job_id: str | None) -> list[Path]:
    """The log files of one replica's job: engine logs first (they hold the root cause), then
    the entrypoint's, then submitit's standard error."""
    if not job_id:
        return []
    engine = sorted(logs_dir.glob(f"{replica_id}.{job_id}.rank*.engine.log"))
    entry = sorted(p for p in logs_dir.glob(f"{replica_id}.{job_id}.rank*.log") if p not in engine)
    return engine + entry + sorted(logs_dir.glob(f"{job_id}_*.err"))


def failure_line(logs_dir: Path, replica_id: str, job_id: str | None) -> str | None:
    """Why the replica's job failed, in one line: the last error line of its engine logs, else of
    its other logs, else the entrypoint's "engine exited before answering /health"; None when
    its logs say nothing (or are not there: another host's filesystem, already cleaned)."""
    files = replica_log_files(logs_dir, replica_id, job_id)
    engine = [line for p in files if p.name.endswith(".engine.log") for line in _tail(p)]
    other = [line for p in files if not p.name.endswith(".engine.log") for line in _tail(p)]
    found = last_error_line(engine) or last_error_line(other)
    if found is not None:
        return found
    summaries = [m.group(0) for line in other if (m := _ENTRYPOINT.search(line))]
    return summaries[-1][:MAX_CHARS] if summaries else None
