"""One periodic loop of the daemon: a step function, its interval, errors logged at its boundary.

Sleeps wait on an Event, so setting ``stop`` ends the loop at once; another Event (``nudge``)
can cut a wait short, never below what ``pace`` (the Slurm call budget) asks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("coral_hpc.daemon")


class Loop:
    """Run ``step`` every ``interval_s`` until ``stop`` is set. A step returning True asks to run
    again at once (e.g. right after new exclusions). ``pace`` (given the seconds since the step
    began, the seconds the next one must still wait, e.g. for the Slurm call budget) can make
    the wait longer, never shorter. Errors are logged here and only here."""

    def __init__(self, name: str, interval_s: float, step: Callable[[], Any],
                 stop: threading.Event, on_error: Callable[[str], None] | None = None,
                 pace: Callable[[float], float] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 nudge: threading.Event | None = None) -> None:
        self.name = name
        self.monotonic = monotonic
        self.interval_s = interval_s
        self.step = step
        self.stop = stop
        self.on_error = on_error
        self.pace = pace or (lambda elapsed_s: 0.0)
        #: set by another thread to cut the interval short (a wake): the pace still holds
        self.nudge = nudge
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        """Step, then wait out the rest of the interval (or the pace), until ``stop``."""
        while not self.stop.is_set():
            began = self.monotonic()
            again = False
            try:
                again = bool(self.step())
            except Exception:  # the loop boundary: log, count, go on
                log.exception("%s loop step failed", self.name)
                if self.on_error:
                    self.on_error(self.name)
            elapsed = self.monotonic() - began
            wait = 0.0 if again else self.interval_s - elapsed
            paced = self.pace(elapsed)
            if self.nudge is None:
                self.stop.wait(max(0.0, wait, paced))
            else:
                self._wait_or_nudge(max(0.0, wait), paced)

    def _wait_or_nudge(self, wait_s: float, paced_s: float) -> None:
        """Wait ``wait_s``, or less once :attr:`nudge` is set — but never less than
        ``paced_s`` (the Slurm call budget)."""
        assert self.nudge is not None
        if paced_s > 0:
            self.stop.wait(paced_s)
        end = self.monotonic() + max(0.0, wait_s - paced_s)
        while not self.stop.is_set() and not self.nudge.is_set():
            left = end - self.monotonic()
            if left <= 0:
                break
            self.stop.wait(min(0.1, left))
        self.nudge.clear()

    def start(self) -> threading.Thread:
        """Run the loop on a daemon thread named after it; returns the thread."""
        self.thread = threading.Thread(target=self.run, name=f"coral-{self.name}", daemon=True)
        self.thread.start()
        return self.thread
