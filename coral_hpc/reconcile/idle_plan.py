"""What the idle rule (:mod:`coral_hpc.reconcile.idle`) changes in what is planned — shared by
the daemon (``coral_hpc.daemon.core``) and ``coral-hpc simulate`` (``coral_hpc.simulate.zero``),
so both scale to zero by the same rule.

* A **cold** model is planned with zero demand and no floor: it gets no replica, and the decide
  step may drain its last READY one (it is left out of the configured models it protects).
* A **warm** (or waking) model scaled to zero is planned with at least one replica, whatever its
  measured demand, so a wake gets a replica at once and an idle-but-warm model keeps one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.demand import ModelDemand
from coral_hpc.reconcile.idle import IdleRule, IdleTracker


def idle_rules(deployment: Deployment) -> dict[str, IdleRule]:
    """The models of ``deployment`` scaled to zero and their idle rule."""
    out = {}
    for model in deployment.models:
        settings = scale_to_zero(model, deployment.policy)
        if settings.enabled:
            out[model.name] = IdleRule(settings.idle_after_s, settings.wake_timeout_s)
    return out


def planning_inputs(deployment: Deployment, demand: Mapping[str, ModelDemand],
                    tracker: IdleTracker) -> tuple[Deployment, dict[str, ModelDemand]]:
    """The deployment and demand the planner is asked with: cold models at zero demand, warm
    models scaled to zero at least one replica (see the module doc)."""
    cold = tracker.cold()
    floors = tracker.tracked - cold
    models = tuple(
        m.model_copy(update={"min_replicas": max(1, m.min_replicas)})
        if m.name in floors and (m.max_replicas is None or m.max_replicas > 0) else m
        for m in deployment.models)
    planned = dict(demand)
    for name in cold:
        if name in planned:
            planned[name] = replace(planned[name], requests_per_s=0.0, planned_rps=0.0,
                                    sized_rps=0.0, basis="cold: scaled to zero")
    if not floors:
        return deployment, planned
    return deployment.model_copy(update={"models": models}), planned
