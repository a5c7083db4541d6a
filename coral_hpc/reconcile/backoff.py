"""Exponential backoff after transient errors (slurmctld restarting, a timeout). Pure: the
caller passes the time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """Delay before the next attempt: ``base_s × 2^(failures−1)``, at most ``max_s``; reset on
    success."""

    base_s: float = 2.0
    max_s: float = 120.0
    failures: int = 0
    not_before: float = 0.0

    def ready(self, now: float) -> bool:
        """Whether an attempt may be made at ``now``."""
        return now >= self.not_before

    def failed(self, now: float) -> float:
        """Record a transient failure at ``now``; returns the delay until the next attempt."""
        self.failures += 1
        delay = min(self.max_s, self.base_s * 2 ** (self.failures - 1))
        self.not_before = now + delay
        return delay

    def succeeded(self) -> None:
        """Record a success: the next failure starts from ``base_s`` again."""
        self.failures = 0
        self.not_before = 0.0
