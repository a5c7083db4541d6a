"""The daemon's part of scale to zero: what the idle rule (:mod:`coral_hpc.reconcile.idle`)
changes in what is planned, and what the gateway is told about cold and waking models.

* A **cold** model is planned with zero demand and no floor: it gets no replica, and the decide
  step may drain its last READY one (it is left out of the configured models it protects).
* A **warm** (or waking) model scaled to zero is planned with at least one replica, whatever its
  measured demand, so a wake gets a replica at once and an idle-but-warm model keeps one.
* The routing table carries a :class:`~coral_hpc.gateway.table.WakeInfo` for each model scaled
  to zero without a READY replica: its state, the measured start-up time and, once its replica
  is queued or starting, when it is expected READY (Slurm's expected start plus the start-up).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.demand import ModelDemand
from coral_hpc.gateway.table import WakeInfo
from coral_hpc.reconcile import ReplicaFacts, ReplicaState
from coral_hpc.reconcile.idle import IdleRule, IdleTracker
from coral_hpc.reconcile.status import ReplicaStatus
from coral_hpc.store import Store


def idle_rules(deployment: Deployment) -> dict[str, IdleRule]:
    """The models of ``deployment`` scaled to zero and their idle rule."""
    out = {}
    for model in deployment.models:
        settings = scale_to_zero(model, deployment.policy)
        if settings.enabled:
            out[model.name] = IdleRule(settings.idle_after_s, settings.wake_timeout_s)
    return out


def last_requests(store: Store, models: Iterable[str], since: float) -> dict[str, float]:
    """Each model's newest stored interval with a request, ending after ``since`` (its end)."""
    wanted = set(models)
    out: dict[str, float] = {}
    for item in store.demand_since(since):
        if item.model in wanted and item.requests > 0:
            out[item.model] = max(out.get(item.model, item.end), item.end)
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


def wake_infos(tracker: IdleTracker, facts: Sequence[ReplicaFacts],
               statuses: Mapping[str, ReplicaStatus], startup_s: float, now: float,
               impossible: Mapping[str, str]) -> dict[str, WakeInfo]:
    """What the gateway is told about each model scaled to zero with no READY replica."""
    ready: set[str] = set()
    expected: dict[str, float] = {}
    for item in facts:
        record, status = item.record, statuses.get(item.record.id)
        if status is None or not status.state.live:
            continue
        if status.state is ReplicaState.READY:
            ready.add(record.model)
            continue
        if status.state is ReplicaState.DRAINING:
            continue
        if record.started_at is not None:
            at = record.started_at + startup_s
        elif record.expected_start is not None:
            at = max(record.expected_start, now) + startup_s
        else:
            continue
        expected[record.model] = min(expected.get(record.model, at), at)
    out = {}
    for model in sorted(tracker.tracked):
        if model in ready:
            continue
        state = "cold" if tracker.is_cold(model) else "waking"
        out[model] = WakeInfo(state, round(startup_s), expected.get(model),
                              impossible.get(model))
    return out


def ready_counts(facts: Sequence[ReplicaFacts],
                 statuses: Mapping[str, ReplicaStatus]) -> dict[str, int]:
    """READY replicas per model."""
    out: dict[str, int] = {}
    for item in facts:
        status = statuses.get(item.record.id)
        if status is not None and status.state is ReplicaState.READY:
            out[item.record.model] = out.get(item.record.model, 0) + 1
    return out
