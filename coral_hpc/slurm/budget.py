"""One budget of Slurm calls per minute for everything a daemon asks Slurm.

Every command the daemon's Slurm client runs — the observe cycle's reads, ``sacct`` for jobs the
queue no longer holds, ``sacctmgr`` for limits, the ``sbatch --test-only`` start estimates, and
its acts (``sbatch``, ``scancel``) — is charged to one :class:`CallBudget`: at most
``cluster.slurm.calls_per_min`` (default 30) in any 60 seconds.

- Acts are never held back (a replacement or a cancel must not wait); they count, so the
  observe cycles after them wait a little longer.
- Start-estimate probes have a share of their own, ``probe_calls_per_min`` (default 6): while
  the daemon is probing (a probe in the last two minutes), the observe cycle leaves that share
  unspent, so the probes never push an observe cycle back and an observe cycle never takes a
  probe's place. A probe runs only when the window has room for it.
- The observe cycle gets the rest (:meth:`CallBudget.observe_pace`): it runs every poll
  interval, spaced evenly at what the budget leaves it (while probing, 24 of 30 calls a minute,
  3 a cycle: every 7.5 s instead of 6 s; not probing, 30: every 6 s), and only when the last
  60 s leave room for one cycle and the probes' unspent share. So the daemon never goes over its
  budget, and a burst of probes never pushes an observe cycle back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

#: calls of one steady-state observe cycle (scontrol show node, show partition, squeue)
OBSERVE_CYCLE_CALLS = 3
#: the window the budget is counted over
WINDOW_S = 60.0
#: probes within this long mean the daemon is probing: their share stays reserved
PROBING_S = 120.0


class CallBudget:
    """At most ``calls_per_min`` Slurm calls in any 60 s, ``probe_calls_per_min`` of them kept
    for start-estimate probes while probing. Thread-safe: the reconcile loop, the planner's
    probes and the acts share it."""

    def __init__(self, calls_per_min: float, *, probe_calls_per_min: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        if calls_per_min <= 0:
            raise ValueError("calls_per_min must be > 0")
        if not 0 <= probe_calls_per_min < calls_per_min:
            raise ValueError("probe_calls_per_min must be >= 0 and below calls_per_min")
        self.calls_per_min = float(calls_per_min)
        self.probe_calls_per_min = float(probe_calls_per_min)
        self.clock = clock
        self._calls: deque[float] = deque()  # when each call of the last window was made
        self._probes: deque[float] = deque()  # the probes among them (kept PROBING_S)
        self._lock = threading.Lock()
        #: calls charged over the budget's life (benches and metrics read it)
        self.spent = 0
        #: probes charged over the budget's life
        self.probes = 0

    def _expire(self, now: float) -> None:
        while self._calls and self._calls[0] <= now - WINDOW_S:
            self._calls.popleft()
        while self._probes and self._probes[0] <= now - PROBING_S:
            self._probes.popleft()

    def spend(self, calls: int = 1, *, probe: bool = False) -> None:
        """Charge ``calls`` made now, whatever the window holds (acts are never refused)."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            self._calls.extend([now] * calls)
            self.spent += calls
            if probe:
                self._probes.extend([now] * calls)
                self.probes += calls

    def _reserved(self, at: float) -> float:
        """The probes' share not yet spent in the window ending at ``at`` (0 when not probing)."""
        if not self._probes or self._probes[-1] <= at - PROBING_S:
            return 0.0
        spent = sum(1 for t in self._probes if t > at - WINDOW_S)
        return max(0.0, self.probe_calls_per_min - spent)

    def _used(self, at: float) -> int:
        return sum(1 for t in self._calls if t > at - WINDOW_S)

    def wait_s(self, calls: int = OBSERVE_CYCLE_CALLS) -> float:
        """Seconds until ``calls`` observe calls fit: the last 60 s then hold at most
        ``calls_per_min`` minus ``calls`` minus the probes' unspent share (0 when they fit now)."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            # the window only empties as calls age out: the answer is one of those moments
            for at in [now, *(t + WINDOW_S for t in self._calls)]:
                if at < now:
                    continue
                if self._used(at) + calls + self._reserved(at) <= self.calls_per_min:
                    return at - now
            return WINDOW_S

    def cycle_spacing_s(self, calls: int = OBSERVE_CYCLE_CALLS) -> float:
        """Seconds between observe cycles of ``calls`` that keep to the budget at an even pace:
        its whole rate, or what the probes leave of it while probing."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            probing = bool(self._probes) and self._probes[-1] > now - PROBING_S
            rate = self.calls_per_min - (self.probe_calls_per_min if probing else 0.0)
            return 60.0 * calls / rate

    def observe_pace(self, elapsed_s: float) -> float:
        """Seconds the next observe cycle must still wait, ``elapsed_s`` after the last one
        began: the even pace (:meth:`cycle_spacing_s`) and room in the window (:meth:`wait_s`)."""
        return max(self.cycle_spacing_s() - elapsed_s, self.wait_s())

    def has_room(self, calls: int = 1) -> bool:
        """Whether ``calls`` more fit in the last 60 s now (a probe asks before it runs)."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            return self._used(now) + calls <= self.calls_per_min
