"""Slurm's time formats: durations (``2-00:00:00``, ``29:52``) and timestamps
(``2026-11-29T22:00:10``, local time). Pure."""

from __future__ import annotations

import functools
from datetime import datetime

from coral_hpc.types import slurm_duration_s

_NO_VALUE = {"", "N/A", "NONE", "None", "Unknown", "UNLIMITED", "INFINITE", "INVALID", "NOT_SET", "(null)"}


@functools.lru_cache(maxsize=65536)
def parse_duration(text: str | None) -> int | None:
    """Seconds in a Slurm duration: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``. None for UNLIMITED / N/A / INVALID and empty values. Raises ValueError when
    the text is none of these."""
    if text is None or text.strip() in _NO_VALUE:
        return None
    return slurm_duration_s(text)


@functools.lru_cache(maxsize=65536)
def parse_timestamp(text: str | None) -> float | None:
    """Epoch seconds of a Slurm timestamp (ISO 8601 without zone, in the local time zone, as
    Slurm prints it); None for N/A, Unknown, None and empty values. Raises ValueError otherwise."""
    if text is None or text.strip() in _NO_VALUE:
        return None
    text = text.strip()
    if len(text) != 19 or text[10] != "T":
        raise ValueError(f"{text!r} is not a Slurm timestamp")
    # fromisoformat is C code, ~10x faster than strptime (10,000 jobs x 3 times per cycle)
    return datetime.fromisoformat(text).timestamp()
