"""Turn the solver's Stage-2 plan into the slots the decide step matches replicas against.

The solver (``solver.types.Plan``) knows templates; the decide step needs, per row, the template
id, the partition of each stage, the count, the per-replica throughput and cost, and a small plain
layout the launcher renders a job from. Read by attribute so this module does not pin the solver's
classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coral_hpc.reconcile.decide import DesiredPlan, Slot


def layout_of(template: Any, partitions: tuple[str, ...]) -> dict[str, Any]:
    """Plain data describing a template's layout (stored with each replica, given to launch)."""
    return {
        "tp": int(template.tp),
        "pp": len(template.stages),
        "stages": [
            {"gpu_type": stage.gpu_type, "layers": int(stage.layers), "partition": partition}
            for stage, partition in zip(template.stages, partitions)
        ],
    }


def slots_from_plan(plan: Any, time: float,
                    time_limit_of: Callable[[tuple[str, ...]], int] | None = None) -> DesiredPlan:
    """A :class:`DesiredPlan` from a ``solver.types.Plan`` made at ``time``; rows with count 0
    are dropped. Queued rows (``plan.queued``: replicas Slurm starts beyond the horizon) are
    slots too: they are submitted now and wait in Slurm's queue. ``time_limit_of(partitions)``
    gives a row's job time limit when the partitions' MaxTime clips the configured one."""
    slots = []
    for row in tuple(plan.rows) + tuple(getattr(plan, "queued", ())):
        if row.count <= 0:
            continue
        partitions = tuple(row.partitions)
        layout = layout_of(row.template, partitions)
        if time_limit_of is not None:
            layout["time_limit_s"] = int(time_limit_of(partitions))
        slots.append(
            Slot(
                model=row.template.model,
                template_id=row.template.id,
                partitions=partitions,
                count=int(row.count),
                throughput=float(row.template.throughput),
                cost_per_hour=float(row.cost_per_hour),
                layout=layout,
            )
        )
    return DesiredPlan(time=time, slots=tuple(slots))


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
            "layout": dict(s.layout),
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
                partitions=tuple(r["partitions"]),
                count=int(r["count"]),
                throughput=float(r["throughput"]),
                cost_per_hour=float(r["cost_per_hour"]),
                layout=r.get("layout", {}),
            )
            for r in rows
        ),
    )
