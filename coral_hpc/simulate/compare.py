"""Scale to zero against always-on: the same run twice (``coral-hpc simulate``).

* **With scale to zero**: the deployment as written (each model's ``idle_after``,
  :mod:`coral_hpc.simulate.zero`).
* **Always-on**: the same deployment, the same requests, the same snapshot and planner, with
  every model scaled to zero given ``idle_after: never`` and ``min_replicas: 1`` — its smallest
  replica kept up around the clock, as ``coral-hpc cost`` counts the GPU-hours saved.

The report per model: wakes, the wake waits (p50 / p95 / max), requests held and refused,
GPU-hours and cost of both runs; and the totals of every model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.plan.planner import Planner
from coral_hpc.simulate.run import SimulationResult, simulate
from coral_hpc.simulate.traces import ModelWorkload
from coral_hpc.simulate.zero import ZeroFigures
from coral_hpc.slurm.snapshot import ClusterSnapshot


def scales_to_zero(deployment: Deployment) -> bool:
    """True when some model of ``deployment`` has ``idle_after``."""
    return any(scale_to_zero(m, deployment.policy).enabled for m in deployment.models)


def always_on(deployment: Deployment) -> Deployment:
    """``deployment`` with every model scaled to zero kept up: ``idle_after: never`` (0) and at
    least one replica."""
    models = tuple(
        m.model_copy(update={"idle_after": 0.0, "min_replicas": max(1, m.min_replicas)})
        if scale_to_zero(m, deployment.policy).enabled else m
        for m in deployment.models)
    policy = deployment.policy.model_copy(update={"idle_after": None})
    return deployment.model_copy(update={"models": models, "policy": policy})


def against_always_on(zero: SimulationResult, always: SimulationResult) -> dict[str, Any]:
    """The ``scale_to_zero`` section of the report: per model and in total (see the module
    doc)."""
    models = {}
    for name, figures in zero.scale_to_zero.items():
        mine, theirs = zero.models[name], always.models[name]
        models[name] = {**figures,
                        "requests": mine.requests, "refused": mine.refused,
                        "gpu_hours": round(mine.gpu_hours, 4), "cost": round(mine.cost, 4),
                        "always_on_gpu_hours": round(theirs.gpu_hours, 4),
                        "always_on_cost": round(theirs.cost, 4)}
    waits = ZeroFigures(waits=[w for n in models for w in zero.wake_waits.get(n, [])])
    return {
        "always_on": "the same run with idle_after: never and min_replicas: 1 for these models",
        "models": models,
        "total": {
            "gpu_hours": round(sum(m.gpu_hours for m in zero.models.values()), 4),
            "always_on_gpu_hours": round(sum(m.gpu_hours for m in always.models.values()), 4),
            "cost": round(zero.cost, 4),
            "always_on_cost": round(always.cost, 4),
            "wakes": sum(m["wakes"] for m in models.values()),
            "held": sum(m["held"] for m in models.values()),
            "refused_reject": sum(m["refused_reject"] for m in models.values()),
            "refused_timeout": sum(m["refused_timeout"] for m in models.values()),
            "wake_wait_s": waits.summary()["wake_wait_s"],
            "slo_attainment": _attainment(zero),
            "always_on_slo_attainment": _attainment(always),
        },
    }


def _attainment(result: SimulationResult) -> float | None:
    requests = sum(m.requests for m in result.models.values())
    good = sum(m.within_slo for m in result.models.values())
    return round(good / requests, 4) if requests else None


def simulate_both(deployment: Deployment, snapshot: ClusterSnapshot,
                  loads: Mapping[str, ModelWorkload], span_s: float, planner: Planner,
                  log: Callable[[str], None] = lambda line: None,
                  ) -> tuple[SimulationResult, SimulationResult | None]:
    """The run as written and, when some model scales to zero, the always-on run (else None)."""
    result = simulate(deployment, snapshot, loads, span_s, planner, log=log)
    if not scales_to_zero(deployment):
        return result, None
    log("always-on: the same run with every model scaled to zero kept up")
    return result, simulate(always_on(deployment), snapshot, loads, span_s, planner, log=log)
