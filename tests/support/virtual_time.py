"""Virtual time for loops under test: a settable clock and a stop event whose waits advance it."""

from __future__ import annotations

import threading


class VirtualClock:
    """A monotonic clock the test moves: ``clock()`` is ``clock.now``."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


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
