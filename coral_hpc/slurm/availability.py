"""When Slurm would start a job of each shape: ``sbatch --test-only`` within a call budget.

``sbatch --test-only`` asks slurmctld's scheduler when and where a job *would* start, with its
reservations, priorities and backfill plan of everyone's jobs (sbatch(1): "Validate the batch
script and return an estimate of when a job would be scheduled to run given the current job
queue and all the other arguments specifying the job requirements. No job is actually
submitted."). That is the one estimate a planner can trust more than its own guesses: it is
what the scheduler will do.

Each probe is one slurmctld RPC, so :class:`StartProber` keeps to a budget: a token bucket of
``calls_per_min`` probes a minute (default 6), which is the probes' share of the daemon's one
Slurm call budget (``coral_hpc.slurm.budget``: a probe runs only when that budget has room, and
the observe cycle leaves the share to the probes while they run). An estimate is reused until
it is ``ttl_s`` old (one plan epoch by default). Shapes are probed in the order given (the
caller puts the most useful first); a shape the budget does not reach keeps its last estimate,
or has none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from coral_hpc.errors import PermanentError, TransientError
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.snapshot import JobShape, ShapeEstimate


def shape_key(shape: JobShape) -> tuple:
    return (shape.partition, shape.gpu_type, shape.gpus_per_node, shape.nodes, shape.reservation)


class StartProber:
    """Cached, budgeted start estimates per job shape (see the module docstring)."""

    def __init__(self, client: Any, *, calls_per_min: float = 6.0, ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.time, budget: CallBudget | None = None):
        if calls_per_min <= 0:
            raise ValueError("calls_per_min must be > 0")
        self.client = client
        self.calls_per_min = float(calls_per_min)
        self.ttl_s = float(ttl_s)
        self.clock = clock
        self.budget = budget  # the daemon's whole Slurm call budget, when it has one
        self._tokens = float(calls_per_min)
        self._refilled = clock()
        self._cache: dict[tuple, ShapeEstimate] = {}
        #: probes sent over this prober's life (for benches and status)
        self.calls = 0

    def cached(self) -> tuple[ShapeEstimate, ...]:
        """The estimates of this epoch (younger than ``ttl_s``), without a Slurm call."""
        now = self.clock()
        return tuple(e for e in self._cache.values() if now - e.observed_at < self.ttl_s)

    def _refill(self, now: float) -> None:
        self._tokens = min(self.calls_per_min,
                           self._tokens + (now - self._refilled) * self.calls_per_min / 60.0)
        self._refilled = now

    def estimates(self, shapes: Sequence[JobShape]) -> tuple[ShapeEstimate, ...]:
        """An estimate per shape Slurm has answered for (fresh or cached), in the given order.
        A refused shape (no node could ever run it, or a QOS/association limit forbids it)
        comes back with ``start=None`` and Slurm's reason in ``error``."""
        out = []
        seen = set()
        for shape in shapes:
            key = shape_key(shape)
            if key in seen:
                continue
            seen.add(key)
            now = self.clock()
            cached = self._cache.get(key)
            if cached is not None and now - cached.observed_at < self.ttl_s:
                out.append(cached)
                continue
            self._refill(now)
            if self._tokens < 1.0 or (self.budget is not None and not self.budget.has_room(1)):
                if cached is not None:
                    out.append(cached)  # older than an epoch, still Slurm's last word
                continue
            self._tokens -= 1.0
            self.calls += 1
            estimate = self._probe(shape, now)
            if estimate is None:
                if cached is not None:
                    out.append(cached)
                continue
            self._cache[key] = estimate
            out.append(estimate)
        return tuple(out)

    def _probe(self, shape: JobShape, now: float) -> ShapeEstimate | None:
        try:
            answer = self.client.test_only(shape)
        except TransientError:
            return None  # Slurm busy or down: no new word, keep what we had
        except PermanentError as exc:
            return _estimate(shape, start=None, node_names=(), observed_at=now,
                             error=str(exc).strip()[:300])
        return _estimate(shape, start=answer.start, node_names=answer.nodes,
                         observed_at=answer.observed_at)


def _estimate(shape: JobShape, *, start: float | None, node_names: tuple[str, ...],
              observed_at: float, error: str | None = None) -> ShapeEstimate:
    """Slurm's answer for ``shape``, carrying the shape's own fields."""
    return ShapeEstimate(partition=shape.partition, gpu_type=shape.gpu_type,
                         gpus_per_node=shape.gpus_per_node, nodes=shape.nodes,
                         reservation=shape.reservation, start=start, node_names=node_names,
                         observed_at=observed_at, error=error)
