"""Slurm's time formats: durations (``2-00:00:00``, ``29:52``) and timestamps
(``2026-11-29T22:00:10``, local time). Pure."""

from __future__ import annotations

import functools
import re
from datetime import datetime

_DURATION_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_NO_VALUE = {"", "N/A", "NONE", "None", "Unknown", "UNLIMITED", "INFINITE", "INVALID", "NOT_SET", "(null)"}


@functools.lru_cache(maxsize=65536)
def parse_duration(text: str | None) -> int | None:
    """Seconds in a Slurm duration: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``. None for UNLIMITED / N/A / INVALID and empty values. Raises ValueError when
    the text is none of these."""
    if text is None or text.strip() in _NO_VALUE:
        return None
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Slurm duration")
    days, first, second, third = match.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


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
