"""The plan as the decide step needs it: slots of (template on partitions, count, layout).

Pure data with no solver objects, so ``coral_hpc.reconcile.decide`` reads it without importing
the solver. Stored in the ``plans`` table as plain rows (:func:`slot_rows`), read back by a
restarted daemon (:func:`plan_from_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coral_hpc.types import ReplicaLayout


@dataclass(frozen=True)
class Slot:
    """One plan row: ``count`` replicas of a template laid out as ``layout``."""

    model: str
    template_id: str
    count: int
    throughput: float  # per replica, requests/s: the routing weight
    cost_per_hour: float  # per replica
    layout: ReplicaLayout
    #: the job time limit when the partitions' MaxTime is shorter than the configured one
    time_limit_s: int | None = None
    #: seconds until Slurm expects to start a new replica of this slot (0 = now)
    expected_wait_s: float = 0.0
    #: beyond the horizon: submitted where Slurm expects to start it first, and left to wait
    queued: bool = False
    #: False for a queued slot Slurm gave no start estimate for (``expected_wait_s`` means
    #: nothing then)
    start_known: bool = True
    #: CPUs and memory (GB) the job asks per GPU, as the plan packed them
    #: (``coral_hpc.slurm.job_shape.replica_shape``); None: the configured ones
    cpus_per_gpu: int | None = None
    mem_per_gpu_gb: int | None = None

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partition of each pipeline stage."""
        return self.layout.partitions

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.template_id, self.partitions)


@dataclass(frozen=True)
class DesiredPlan:
    """The plan the cluster should converge to."""

    time: float
    slots: tuple[Slot, ...]

    def capacity(self, model: str, role: str | None = None) -> float:
        """Requests/s the plan's replicas of ``model`` sustain (of one ``role`` when given:
        a disaggregated model's prefill and decode replicas are sized apart)."""
        return sum(s.count * s.throughput for s in self.slots
                   if s.model == model and (role is None or s.layout.role == role))


def slot_rows(plan: DesiredPlan) -> list[dict[str, Any]]:
    """Plain rows of a desired plan, for the store's ``plans`` table and ``status``."""
    return [
        {
            "model": s.model,
            "template_id": s.template_id,
            "partitions": list(s.partitions),
            "count": s.count,
            "throughput": s.throughput,
            "cost_per_hour": s.cost_per_hour,
            "layout": s.layout.to_dict(),
            "time_limit_s": s.time_limit_s,
            "expected_wait_s": s.expected_wait_s,
            "queued": s.queued,
            "start_known": s.start_known,
            "cpus_per_gpu": s.cpus_per_gpu,
            "mem_per_gpu_gb": s.mem_per_gpu_gb,
        }
        for s in plan.slots
    ]


def plan_from_rows(rows: list[dict[str, Any]], time: float) -> DesiredPlan:
    """The inverse of :func:`slot_rows` (a restarted daemon reads its last plan back)."""
    return DesiredPlan(
        time=time,
        slots=tuple(
            Slot(
                model=r["model"],
                template_id=r["template_id"],
                count=int(r["count"]),
                throughput=float(r["throughput"]),
                cost_per_hour=float(r["cost_per_hour"]),
                layout=ReplicaLayout.from_dict(r["layout"]),
                time_limit_s=r.get("time_limit_s"),
                expected_wait_s=float(r.get("expected_wait_s") or 0.0),
                queued=bool(r.get("queued", False)),
                start_known=bool(r.get("start_known", True)),
                cpus_per_gpu=r.get("cpus_per_gpu"),
                mem_per_gpu_gb=r.get("mem_per_gpu_gb"),
            )
            for r in rows
        ),
    )
