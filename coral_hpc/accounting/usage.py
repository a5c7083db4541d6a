"""GPU-seconds and billing-unit-seconds of a deployment's jobs over a time range. Pure.

Input: :class:`coral_hpc.slurm.snapshot.AccountingRecord` from sacct (one per allocation: a
hetjob gives one per component, a requeued job one per run). Output: :class:`Usage` slices, each
one run's time inside ``[since, until)`` and inside one time bin (a day by default).

Rules, each the reason for a line below:

- A run counts from its start to its end; a running job (no end) up to ``now``.
- Only the part inside ``[since, until)`` counts (jobs crossing either boundary are clipped).
- A run is identified by (job id, start time): the same run listed twice (two reads merged, or a
  running and a finished view of it) counts once, taking the later end. Each run of a requeued
  job has its own start time, so every run counts once.
- Hetjob components are separate records with their own partition, GPUs and billing; they are
  simply added.
- Slurm times have one-second granularity, so every figure here is a whole number of seconds
  until it is divided into hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from itertools import pairwise

from coral_hpc.slurm.snapshot import AccountingRecord
from coral_hpc.types import JobTag

#: GPU type shown when neither AllocTRES nor the partition says which GPUs a job had.
UNKNOWN_GPU_TYPE = "unknown"


@dataclass(frozen=True)
class Run:
    """One allocation of one job component of this deployment, as accounting sees it."""

    job_id: str
    model: str
    replica_id: str
    partition: str
    gpu_type: str
    gpus: int
    #: Slurm's billing units of the allocation (AllocTRES billing=N); None when absent
    billing: float | None
    state: str
    start: float
    #: None while running
    end: float | None

    def end_or(self, now: float) -> float:
        """The run's end, or ``now`` while it runs."""
        return self.end if self.end is not None else now


@dataclass(frozen=True)
class Usage:
    """One run's use inside one time bin of the range."""

    run: Run
    bin_start: float
    #: seconds of the run inside the range and the bin
    seconds: int

    @property
    def gpu_seconds(self) -> int:
        return self.run.gpus * self.seconds

    @property
    def billing_seconds(self) -> float | None:
        """Billing units × seconds; None when Slurm recorded no billing for the run."""
        return None if self.run.billing is None else self.run.billing * self.seconds


def runs_from_records(
    records: Iterable[AccountingRecord],
    deployment: str,
    partition_gpu_types: Mapping[str, Sequence[str]] | None = None,
    owns: Callable[[JobTag], bool] | None = None,
) -> list[Run]:
    """This deployment's runs among ``records``, one per (job id, start), oldest first.

    Records without a coral JobTag of ``deployment`` (someone else's jobs, other deployments) and
    allocations that never started are left out. With ``owns``, so are jobs whose tag it refuses:
    another instance's jobs (``coral_hpc.instance``: a second copy of the deployment under the
    same name) must not be billed to this one. The GPU type comes from AllocTRES
    (``gres/gpu:<type>``); where the site records only ``gres/gpu``, from the partition's single
    GPU type in ``partition_gpu_types``; else :data:`UNKNOWN_GPU_TYPE`.
    """
    partition_gpu_types = partition_gpu_types or {}
    by_key: dict[tuple[str, float], Run] = {}
    for record in records:
        tag = record.tag
        if tag is None or tag.deployment != deployment or record.start_time is None:
            continue
        if owns is not None and not owns(tag):
            continue
        gpu_type = record.gpu_type
        if gpu_type is None:
            known = tuple(partition_gpu_types.get(record.partition, ()))
            gpu_type = known[0] if len(known) == 1 else UNKNOWN_GPU_TYPE
        run = Run(
            job_id=record.job_id,
            model=tag.model,
            replica_id=tag.replica_id,
            partition=record.partition,
            gpu_type=gpu_type,
            gpus=record.gpus,
            billing=record.billing,
            state=record.state,
            start=float(record.start_time),
            end=None if record.end_time is None else float(record.end_time),
        )
        key = (run.job_id, run.start)
        seen = by_key.get(key)
        # the same run seen twice: keep the view that lasted longer (a finished one beats a
        # running one observed earlier; a running one is open-ended)
        if seen is None or _later_end(run, seen):
            by_key[key] = run
    return sorted(by_key.values(), key=lambda r: (r.start, r.job_id))


def _later_end(candidate: Run, current: Run) -> bool:
    if current.end is None:
        return False
    return candidate.end is None or candidate.end > current.end


def clip_seconds(run: Run, since: float, until: float, now: float) -> tuple[float, float] | None:
    """The part of ``run`` inside ``[since, until)`` as (start, end), or None when it has none.
    A running job counts up to ``now``."""
    start = max(run.start, since)
    end = min(run.end_or(now), until, now)
    return (start, end) if end > start else None


def day_bins(since: float, until: float, tz: tzinfo | None = None) -> list[float]:
    """Bin edges at midnight (in ``tz``, the local zone by default) covering ``[since, until)``:
    ``[since, midnight₁, midnight₂, …, until]``."""
    edges = [since]
    day: date = datetime.fromtimestamp(since, tz).date()
    while True:
        day = day + timedelta(days=1)
        midnight = datetime(day.year, day.month, day.day, tzinfo=tz)
        edge = midnight.timestamp() if tz is not None else midnight.astimezone().timestamp()
        if edge >= until:
            break
        edges.append(edge)
    edges.append(until)
    return edges


def even_bins(since: float, until: float, width_s: float) -> list[float]:
    """Bin edges every ``width_s`` seconds from ``since``, the last one at ``until``."""
    if width_s < 1:
        raise ValueError("bin width must be at least one second")
    width_s = int(width_s)  # whole seconds, like every Slurm time
    count = max(1, math.ceil((until - since) / width_s))
    edges = [since + i * width_s for i in range(count)]
    return edges + [until]


def usage(
    runs: Iterable[Run], since: float, until: float, now: float, edges: Sequence[float]
) -> list[Usage]:
    """Every run's seconds inside ``[since, until)``, split at the bin ``edges`` (which must
    start at ``since`` and end at ``until``). Runs with no time in the range give nothing."""
    if until <= since:
        raise ValueError(f"empty range: until ({until}) is not after since ({since})")
    if any(float(x) != int(x) for x in (since, until, now)):
        # sacct's times are whole seconds; fractional bounds would make figures inexact
        raise ValueError("since, until and now must be whole seconds (floor them first)")
    if not edges or edges[0] != since or edges[-1] != until:
        raise ValueError("bin edges must start at since and end at until")
    out: list[Usage] = []
    for run in runs:
        clipped = clip_seconds(run, since, until, now)
        if clipped is None:
            continue
        for bin_start, bin_end, seconds in _split(clipped, edges):
            if seconds > 0:
                out.append(Usage(run=run, bin_start=bin_start, seconds=seconds))
    return out


def _split(
    interval: tuple[float, float], edges: Sequence[float]
) -> Iterator[tuple[float, float, int]]:
    start, end = interval
    for left, right in pairwise(edges):
        low, high = max(start, left), min(end, right)
        if high > low:
            yield left, right, int(high - low)
