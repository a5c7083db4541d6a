"""Times for people: local wall-clock times with their zone, ages and durations (no raw epochs).
``--json`` keeps epoch seconds; only the tables use these."""

from __future__ import annotations

from datetime import datetime


def local_time(epoch: float, now: float | None = None) -> str:
    """``2026-12-01 10:04:31 UTC`` — the local zone's name included; the date is left out when
    ``now`` is given and falls on the same day (``10:04:31 UTC``)."""
    when = datetime.fromtimestamp(epoch).astimezone()
    same_day = now is not None and datetime.fromtimestamp(now).astimezone().date() == when.date()
    text = when.strftime("%H:%M:%S %Z" if same_day else "%Y-%m-%d %H:%M:%S %Z")
    return text.strip()


def duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 d 04 h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def ago(epoch: float, now: float) -> str:
    """``12 min ago`` (or ``in 3 s`` for a time ahead, as a clock skew shows it)."""
    delta = now - epoch
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"
