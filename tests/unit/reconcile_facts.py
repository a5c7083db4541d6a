"""Small builders of replica facts for the reconcile tests (a fake clock: times are plain floats)."""

from __future__ import annotations

from coral_hpc.reconcile import DesiredPlan, ReplicaFacts, Slot
from coral_hpc.store import ReplicaRecord
from coral_hpc.types import ReplicaLayout, StageLayout


def layout(partitions: tuple[str, ...] = ("a100",), tp: int = 1) -> ReplicaLayout:
    """A layout with one stage per partition, its GPU type named after the partition."""
    return ReplicaLayout(tp, tuple(StageLayout(p, p, 10) for p in partitions), "auto")

#: What each lifecycle point sets on a record, all times in seconds of a fake clock.
PHASES = {
    "submitting": {"job_id": None, "submitted_at": None, "slurm_state": None, "started_at": None,
                   "ready_at": None},
    "pending": {"slurm_state": "PENDING", "started_at": None, "ready_at": None},
    "starting": {"slurm_state": "RUNNING", "ready_at": None},
    "ready": {},
}


def rec(
    rid: str,
    phase: str = "ready",
    model: str = "m",
    template: str = "t1",
    partitions: tuple[str, ...] = ("a100",),
    throughput: float = 2.0,
    cost: float = 4.0,
    **facts,
) -> ReplicaRecord:
    """A replica record at a lifecycle ``phase``: created 0, submitted 1, started 10, READY 20,
    time limit 3600 s, healthy at 20; ``facts`` override any field."""
    base = {
        "id": rid,
        "model": model,
        "template_id": template,
        "layout": layout(tuple(partitions)),
        "partitions": partitions,
        "throughput": throughput,
        "cost_per_hour": cost,
        "created_at": 0.0,
        "job_id": f"job-{rid}",
        "submitted_at": 1.0,
        "slurm_state": "RUNNING",
        "started_at": 10.0,
        "ready_at": 20.0,
        "health_ok_at": 20.0,
        "time_limit_s": 3600.0,
        "endpoint": f"http://127.0.0.1:{9000 + sum(map(ord, rid))}",
    }
    base.update(PHASES[phase])
    base.update(facts)
    return ReplicaRecord(**base)


def facts(*records: ReplicaRecord, unavailable: frozenset[str] = frozenset()) -> list[ReplicaFacts]:
    """Wrap records; those whose id is in ``unavailable`` sit on a draining/down node."""
    return [ReplicaFacts(r, node_unavailable=r.id in unavailable) for r in records]


def slot(template="t1", count=1, model="m", partitions=("a100",), throughput=2.0, cost=4.0):
    return Slot(model, template, count, throughput, cost, layout(tuple(partitions)))


def plan(*slots: Slot, time: float = 0.0) -> DesiredPlan:
    return DesiredPlan(time=time, slots=tuple(slots))
