"""Virtual time for loops under test: a settable clock and a stop event whose waits advance it."""

from __future__ import annotations

import threading


class VirtualClock:
    """A monotonic clock the test moves: ``clock()`` is ``clock.now``, moved on by ``tick_s``
    first (a clock that passes a little time per reading, as a real one does between two steps
    of a loop)."""

    def __init__(self, now: float = 1000.0, tick_s: float = 0.0):
        self.now = now
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now += self.tick_s
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``."""
        self.now += seconds


class VirtualStop(threading.Event):
    """A stop event whose waits pass virtual time, set once ``until`` is reached."""

    def __init__(self, clock: VirtualClock, until: float):
        super().__init__()
        self.clock, self.until = clock, until

    def is_set(self) -> bool:
        return self.clock.now >= self.until

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return self.is_set()
