"""One budget of Slurm calls per minute for everything a daemon asks Slurm.

Every command the daemon's Slurm client runs — the observe cycle's reads, ``sacct`` for jobs the
queue no longer holds, ``sacctmgr`` for limits, the ``sbatch --test-only`` start estimates, and
its acts (``sbatch``, ``scancel``) — is charged to one :class:`CallBudget`
(``cluster.slurm.calls_per_min``, default 30), a token bucket refilled at that rate:

- acts are never held back (a replacement or a cancel must not wait for a token);
- start-estimate probes take their own share first, at most ``probe_calls_per_min`` of the
  budget (``coral_hpc.slurm.availability.StartProber``);
- the observe cycle gets the rest: it runs every poll interval when the bucket has the tokens
  for one cycle, and later when it has not (:meth:`CallBudget.wait_s`), so on a busy cluster
  with probes running the poll interval stretches (3 calls a cycle, 24 of 30 calls a minute
  left: one cycle every 7.5 s) instead of the daemon exceeding its budget.

The bucket holds at most ``burst`` tokens (default: one observe cycle's worth and a spare), so
a quiet spell never saves up a burst of calls for later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: calls of one steady-state observe cycle (scontrol show node, show partition, squeue)
OBSERVE_CYCLE_CALLS = 3


class CallBudget:
    """A token bucket of Slurm calls: ``calls_per_min`` tokens a minute, at most ``burst``
    saved up. Thread-safe: the reconcile loop, the planner's probes and the acts share it."""

    def __init__(self, calls_per_min: float, *, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if calls_per_min <= 0:
            raise ValueError("calls_per_min must be > 0")
        self.calls_per_min = float(calls_per_min)
        self.burst = float(burst if burst is not None else OBSERVE_CYCLE_CALLS + 1)
        self.clock = clock
        self._tokens = self.burst
        self._at = clock()
        self._lock = threading.Lock()
        #: calls charged over the budget's life (benches and metrics read it)
        self.spent = 0

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.calls_per_min / 60.0)
        self._at = now

    def tokens(self) -> float:
        """Tokens in the bucket now (negative after acts or probes spent ahead)."""
        with self._lock:
            self._refill()
            return self._tokens

    def spend(self, calls: float = 1.0) -> None:
        """Charge ``calls`` that are made now, whatever the bucket holds (it may go below 0:
        the observe cycle then waits until it is paid back)."""
        with self._lock:
            self._refill()
            self._tokens -= calls
            self.spent += int(calls)

    def wait_s(self, calls: float = OBSERVE_CYCLE_CALLS) -> float:
        """Seconds until the bucket holds ``calls`` tokens (0 when it does now)."""
        with self._lock:
            self._refill()
            missing = min(calls, self.burst) - self._tokens
            return max(0.0, missing * 60.0 / self.calls_per_min)
