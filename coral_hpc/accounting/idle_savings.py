"""GPU-hours scale to zero saved: for each model with ``idle_after``, the hours of the range in
which it held no replica at all (no job queued, starting, serving or draining), times the GPUs
of its smallest replica — what keeping that replica up around the clock would have held.

The smallest replica is the one with the fewest GPUs among the model's replicas on record
(the layouts the planner chose for it); a model that never had a replica has no size on
record, so its cold hours are reported without GPU-hours. Pure: records in, figures out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.records import ReplicaRecord


def _covered_s(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``spans``."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def scale_to_zero_savings(deployment: Deployment, replicas: Sequence[ReplicaRecord],
                          since: float, until: float, now: float) -> list[dict[str, Any]]:
    """Per model scaled to zero: ``cold_hours`` (no replica held) within ``[since, until]``,
    ``smallest_replica_gpus`` and ``gpu_hours_saved`` against keeping that replica up."""
    out = []
    for model in deployment.models:
        if not scale_to_zero(model, deployment.policy).enabled:
            continue
        mine = [r for r in replicas if r.model == model.name]
        sizes = [r.layout.total_gpus for r in mine if r.layout is not None]
        spans = []
        for r in mine:
            start = max(r.created_at, since)
            stop = min(r.ended_at if r.ended_at is not None else now, until)
            if stop > start:
                spans.append((start, stop))
        cold_h = max(0.0, (until - since) - _covered_s(spans)) / 3600.0
        smallest = min(sizes) if sizes else None
        out.append({"model": model.name, "cold_hours": round(cold_h, 4),
                    "smallest_replica_gpus": smallest,
                    "gpu_hours_saved": None if smallest is None else round(cold_h * smallest, 4)})
    return out
