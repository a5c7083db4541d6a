"""The values the decide step reads and returns: how fresh the observation is, the actions, the
decision. Plain frozen data, so the act step, status and tests share one vocabulary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coral_hpc.plan.desired import Slot
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaStatus
from coral_hpc.types import Excluded, ExclusionKind

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Observation:
    """How fresh and complete the facts are. Times are when Slurm last answered (None: never)."""

    jobs_at: float | None  # own jobs (squeue/sacct)
    cluster_at: float | None  # nodes and partitions (sinfo/scontrol)
    complete: bool = True  # False when the last Slurm call failed or answered partially

    def jobs_fresh(self, now: float, settings: ReconcileSettings) -> bool:
        return (
            self.complete and self.jobs_at is not None
            and now - self.jobs_at <= settings.stale_after_s
        )

    def cluster_fresh(self, now: float, settings: ReconcileSettings) -> bool:
        return (
            self.jobs_fresh(now, settings) and self.cluster_at is not None
            and now - self.cluster_at <= settings.stale_after_s
        )


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Submit:
    """Start a new replica of ``slot`` (``replaces``: the replica it takes over from, if any)."""

    slot: Slot
    reason: str
    replaces: str | None = None


@dataclass(frozen=True)
class Drain:
    """Take a replica out of the routing table; it is cancelled after the drain grace."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Cancel:
    """Cancel a replica's Slurm job (with a grace signal first)."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Forget:
    """Record that a replica never reached Slurm (no tagged job exists): end it in the store."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Exclude:
    """Keep a template or a shape (template on partitions) out of plans until ``until``."""

    target: Excluded
    kind: ExclusionKind
    until: float
    reason: str
    model: str | None = None


@dataclass(frozen=True)
class Keep:
    """A replica that stays as it is (for status: plan vs actual)."""

    replica_id: str


Action = Submit | Drain | Cancel | Forget | Exclude | Keep


@dataclass(frozen=True)
class Decision:
    """What to do now, and why the plan itself is out of date (empty: it is not)."""

    actions: tuple[Action, ...]
    replan: tuple[str, ...] = ()
    #: set when destructive actions or submissions were withheld, saying why
    held_back: str | None = None
    statuses: Mapping[str, ReplicaStatus] = field(default_factory=dict)

    def of(self, kind: type) -> list[Any]:
        """The actions of one kind, in order."""
        return [a for a in self.actions if isinstance(a, kind)]
