"""Scale to zero: the durations ``idle_after`` and ``wake_timeout`` and the ``wake`` mode, as
``policy:`` defaults and per model, and what a model ends up with (:func:`scale_to_zero`).

A duration is a number of seconds or a number with a unit: ``90s``, ``20m``, ``1.5h``, ``1d``.
``idle_after: never`` (or ``0``) keeps a model's replicas up however idle it is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

#: ``20m``, ``1.5h``, ``90s``, ``1d``, or a bare number of seconds
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*")
_UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

#: idle_after at most a week: a model idle for longer than that costs a week of GPUs, and
#: the measured demand the daemon keeps in full detail (retention.demand_compact_after_days)
#: is two days; at least a minute: below that every pause between two chats drains a replica
MIN_IDLE_AFTER_S = 60.0
MAX_IDLE_AFTER_S = 7 * 86400.0
#: a request is held at most an hour: no client waits longer for an answer
MAX_WAKE_TIMEOUT_S = 3600.0
#: The default hold: below the OpenAI Python client's default timeout of 600 s
#: (openai-python, ``DEFAULT_TIMEOUT``), so a held request is answered, or refused, before the
#: client gives up on it by itself; a replica that starts in a few minutes fits.
DEFAULT_WAKE_TIMEOUT_S = 300.0

WakeMode = Literal["hold", "reject"]
WAKE_MODES: tuple[str, ...] = ("hold", "reject")


def parse_duration(value: Any, what: str) -> float:
    """Seconds from ``value`` (a number of seconds, or ``<number><s|m|h|d>``); ValueError naming
    ``what`` and the forms accepted otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a duration such as 20m, got yes/no ({value})")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration: give seconds (1200) or a number with "
                         "a unit: 90s, 20m, 1.5h, 1d")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a duration: it must be 0 or more seconds")
    return seconds


def idle_after_value(value: Any) -> float | None:
    """``idle_after`` in seconds: 0 for ``never`` (or 0), None when not given (inherited)."""
    if value is None:
        return None
    if value == "never":
        return 0.0
    seconds = parse_duration(value, "idle_after")
    if seconds and not MIN_IDLE_AFTER_S <= seconds <= MAX_IDLE_AFTER_S:
        raise ValueError(f"idle_after {value!r} is {seconds:g} s: give 1m .. 7d, or never "
                         "(keep the model's replicas however idle it is)")
    return seconds


def wake_timeout_value(value: Any) -> float | None:
    """``wake_timeout`` in seconds (1 s .. 1 h); None when not given (inherited)."""
    if value is None:
        return None
    seconds = parse_duration(value, "wake_timeout")
    if not 1.0 <= seconds <= MAX_WAKE_TIMEOUT_S:
        raise ValueError(f"wake_timeout {value!r} is {seconds:g} s: give 1s .. 1h (a request "
                         "is held at most this long while its model wakes)")
    return seconds


@dataclass(frozen=True)
class ScaleToZero:
    """What one model does when idle: its ``idle_after`` (seconds; 0 = never goes cold), how
    long a request waits for it to wake and whether requests wait at all (``hold``) or are
    answered 503 with Retry-After at once (``reject``)."""

    idle_after_s: float
    wake_timeout_s: float
    wake: WakeMode

    @property
    def enabled(self) -> bool:
        """True when the model goes cold after ``idle_after_s`` without requests."""
        return self.idle_after_s > 0


def scale_to_zero(model: Any, policy: Any) -> ScaleToZero:
    """``model``'s settings (a :class:`~coral_hpc.config.ModelConfig`): its own fields, else the
    ``policy:`` defaults. The policy's ``idle_after`` applies only to models whose
    ``min_replicas`` is 0: a model that asks for replicas whatever the demand keeps them."""
    own = model.idle_after
    if own is not None:
        idle = own
    elif model.min_replicas == 0 and policy.idle_after is not None:
        idle = policy.idle_after
    else:
        idle = 0.0
    timeout = model.wake_timeout if model.wake_timeout is not None else policy.wake_timeout
    return ScaleToZero(idle, timeout, model.wake or policy.wake)
