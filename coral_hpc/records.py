"""The store's records: plain frozen data, no database.

:mod:`coral_hpc.store` writes and reads them; the decide step, the status function and the
triggers read them without importing the database (their imports do no I/O: the import
contract in pyproject.toml checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coral_hpc.types import Excluded, ExclusionKind, ReplicaLayout


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica: what was asked for, and the facts observed about its job since."""

    id: str
    model: str
    template_id: str
    #: None only for a job adopted without a readable spec.json (its layout is unknown)
    layout: ReplicaLayout | None
    partitions: tuple[str, ...]
    throughput: float
    cost_per_hour: float
    created_at: float
    replaces: str | None = None
    reason: str = ""
    job_id: str | None = None
    time_limit_s: float | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    ready_at: float | None = None
    endpoint: str | None = None
    slurm_state: str | None = None
    slurm_reason: str | None = None
    nodes: str | None = None
    last_seen_at: float | None = None
    health_ok_at: float | None = None
    health_failures: int = 0
    drain_requested_at: float | None = None
    cancelled_at: float | None = None
    ended_at: float | None = None
    end_state: str | None = None
    #: while PENDING: when Slurm expects the job to start (squeue --start); None when unknown
    expected_start: float | None = None
    #: why its job failed, when it failed unasked: the last error line of its logs
    #: (:func:`coral_hpc.launch.failure.failure_line`); None when they said nothing
    failure: str | None = None

    @property
    def live(self) -> bool:
        """True until the replica's end is recorded."""
        return self.ended_at is None


@dataclass(frozen=True)
class PlanRecord:
    """A plan as stored: its rows are plain dicts (template, partitions, count, …)."""

    id: int
    time: float
    cost_per_hour: float
    solve_s: float
    status: str
    rows: list[dict[str, Any]]
    demand: dict[str, float]


@dataclass(frozen=True)
class Event:
    """Something that happened, for people: a submission, a drain, a cool-down, an error."""

    id: int
    time: float
    kind: str
    message: str
    model: str | None = None
    replica_id: str | None = None


@dataclass(frozen=True)
class DemandInterval:
    """Gateway counters for one model (and API key) over ``[start, end)``: deltas, not totals.

    ``requests`` counts every arrival, ``rejected`` those of them turned away for lack of a READY
    replica (the gateway's own convention); tokens are those of the answered requests.
    """

    start: float
    end: float
    model: str
    requests: int
    prompt_tokens: int
    generated_tokens: int
    rejected: int
    api_key: str = ""


@dataclass(frozen=True)
class StartupObservation:
    """Seconds from submission to READY of one replica."""

    time: float
    replica_id: str
    template_id: str
    gpu_type: str
    seconds: float


@dataclass(frozen=True)
class Exclusion:
    """A template or shape kept out of plans until ``until`` (crash cool-down, pending timeout)."""

    target: Excluded
    kind: ExclusionKind
    since: float
    until: float
    reason: str

    @property
    def key(self) -> str:
        return self.target.key
