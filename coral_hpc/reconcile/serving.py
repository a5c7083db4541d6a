"""Which live replicas go on serving, and how the decide step groups and ranks them: the rules
its phases (matching the plan, settling the surplus) and the planner must share."""

from __future__ import annotations

from coral_hpc.reconcile.status import ReplicaState, ReplicaStatus
from coral_hpc.records import ReplicaRecord

#: The states a plan slot may keep, best first: a READY replica serves now, a STARTING one
#: sooner than a PENDING one. (DRAINING and ended replicas are never kept.)
KEEP_ORDER = {
    ReplicaState.READY: 0,
    ReplicaState.STARTING: 1,
    ReplicaState.PENDING: 2,
    ReplicaState.SUBMITTING: 3,
    ReplicaState.UNHEALTHY: 4,
}


def goes_on_serving(status: ReplicaStatus) -> bool:
    """Whether a live replica counts towards its plan slot: it serves or will, and needs no
    successor. The one rule for the decide step (which replicas a slot keeps) and the planner
    (which replicas go on serving, keep their GPUs and get the start-up credit)."""
    return (status.state in KEEP_ORDER and not status.needs_successor
            and not status.pending_too_long and not status.submit_lost)


def role_key(record: ReplicaRecord) -> tuple[str, str]:
    """(model, role) of a replica record; a replica adopted without its layout counts as both."""
    return record.model, record.layout.role if record.layout else "both"


def cost_per_rps(cost_per_hour: float, throughput: float) -> float:
    """Cost per request/s; a replica that sustains nothing counts as endlessly dear."""
    return cost_per_hour / max(throughput, 1e-9)


def time_left(status: ReplicaStatus) -> float:
    """Seconds left in the replica's job (no time limit: forever)."""
    return status.time_left_s if status.time_left_s is not None else float("inf")
