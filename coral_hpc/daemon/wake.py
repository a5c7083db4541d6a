"""The daemon's part of scale to zero: what the idle rule (:mod:`coral_hpc.reconcile.idle`)
changes in what is planned, and what the gateway is told about cold and waking models.

* What is planned for cold and warm models: :mod:`coral_hpc.reconcile.idle_plan` (re-exported
  here; ``coral-hpc simulate`` plans by the same functions).
* The routing table carries a :class:`~coral_hpc.gateway.table.WakeInfo` for each model scaled
  to zero without a READY replica: its state, the start-up time and, once its replica is
  queued or starting, when it is expected READY (Slurm's expected start plus the start-up of
  that replica's own layout, :mod:`coral_hpc.plan.layout_startup`: the layout the wake chose).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from coral_hpc.config import Deployment
from coral_hpc.gateway.table import WakeInfo
from coral_hpc.plan.layout_startup import LayoutStartup, ProfileKey, layout_startup
from coral_hpc.reconcile import ReplicaFacts, ReplicaState
from coral_hpc.reconcile.idle import IdleTracker
from coral_hpc.reconcile.idle_plan import idle_rules, planning_inputs
from coral_hpc.reconcile.status import ReplicaStatus
from coral_hpc.records import ReplicaRecord
from coral_hpc.store import Store

__all__ = ["idle_rules", "last_requests", "planning_inputs", "ready_counts", "replica_startup",
           "wake_infos"]


def replica_startup(deployment: Deployment, record: ReplicaRecord,
                    own: Mapping[str, LayoutStartup],
                    profiles: Mapping[ProfileKey, LayoutStartup], default_s: float) -> float:
    """Seconds from ``record``'s job start to READY, from its layout
    (:func:`~coral_hpc.plan.layout_startup.layout_startup`: its own replicas', its measured
    profile's, else ``default_s``)."""
    if record.layout is None:
        return default_s
    arch = next((m.arch_key for m in deployment.models if m.name == record.model), "")
    return layout_startup(record.template_id, arch, record.layout.gpu_types, record.layout.tp,
                          own, profiles, LayoutStartup(default_s, "default")).seconds


def last_requests(store: Store, models: Iterable[str], since: float) -> dict[str, float]:
    """Each model's newest stored interval with a request, ending after ``since`` (its end)."""
    wanted = set(models)
    out: dict[str, float] = {}
    for item in store.demand_since(since):
        if item.model in wanted and item.requests > 0:
            out[item.model] = max(out.get(item.model, item.end), item.end)
    return out


def wake_infos(tracker: IdleTracker, facts: Sequence[ReplicaFacts],
               statuses: Mapping[str, ReplicaStatus], startup_s: float, now: float,
               impossible: Mapping[str, str],
               startup_of: Callable[[ReplicaRecord], float] | None = None,
               ) -> dict[str, WakeInfo]:
    """What the gateway is told about each model scaled to zero with no READY replica.
    ``startup_of`` gives a replica's start-up (job start → READY) from its layout; without it,
    or for a model with no replica yet, ``startup_s``."""
    ready: set[str] = set()
    expected: dict[str, float] = {}
    startups: dict[str, float] = {}  # the start-up of the replica expected READY first
    for item in facts:
        record, status = item.record, statuses.get(item.record.id)
        if status is None or not status.state.live:
            continue
        if status.state is ReplicaState.READY:
            ready.add(record.model)
            continue
        if status.state is ReplicaState.DRAINING:
            continue
        startup = startup_of(record) if startup_of is not None else startup_s
        if record.started_at is not None:
            at = record.started_at + startup
        elif record.expected_start is not None:
            at = max(record.expected_start, now) + startup
        else:
            startups.setdefault(record.model, startup)
            continue
        if record.model not in expected or at < expected[record.model]:
            expected[record.model], startups[record.model] = at, startup
    out = {}
    for model in sorted(tracker.tracked):
        if model in ready:
            continue
        state = "cold" if tracker.is_cold(model) else "waking"
        out[model] = WakeInfo(state, round(startups.get(model, startup_s)), expected.get(model),
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
