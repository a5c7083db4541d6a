"""``status``'s word for each model scaled to zero — cold, waking or warm — derived from stored
facts (replicas and the daemon's scale events), so it reads the same with or without a daemon.

* **warm**: a READY replica serves it;
* **waking**: a replica of it is queued or starting (with Slurm's expected start when Slurm
  gave one, and the expected READY time: that start plus the measured start-up), or the daemon
  began a wake it has not submitted yet;
* **cold**: none of that. ``impossible`` says why a wake cannot succeed, when the last wake
  could not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.reconcile import ReplicaState
from coral_hpc.reconcile.status import ReplicaStatus
from coral_hpc.records import ReplicaRecord

#: the daemon's events about scaling (coral_hpc.daemon.core records them per model)
SCALE_EVENT_KINDS = ("scale_cold", "scale_waking", "scale_warm", "scale_impossible")


def latest_scale_events(store: Any) -> dict[str, tuple[str, float, str]]:
    """Each model's newest scale event: (kind, time, message)."""
    out: dict[str, tuple[str, float, str]] = {}
    for kind in SCALE_EVENT_KINDS:
        for event in store.events(limit=200, kind=kind):
            if event.model and (event.model not in out or event.time > out[event.model][1]):
                out[event.model] = (kind, event.time, event.message)
    return out


def model_temperatures(deployment: Deployment, records: Sequence[ReplicaRecord],
                       statuses: Mapping[str, ReplicaStatus],
                       events: Mapping[str, tuple[str, float, str]],
                       startup_s: float,
                       startup_of: Callable[[ReplicaRecord], float] | None = None,
                       ) -> dict[str, dict[str, Any]]:
    """Model → ``{"state", "idle_after_s", "expected_start", "ready_by", "impossible"}`` for
    each model scaled to zero (see the module doc). ``startup_of``: a replica's start-up from
    its layout (the daemon's figure for the gateway's Retry-After); else ``startup_s``."""
    def ready(record: ReplicaRecord, at: float) -> float:
        return at + (startup_of(record) if startup_of is not None else startup_s)

    out = {}
    for model in deployment.models:
        settings = scale_to_zero(model, deployment.policy)
        if not settings.enabled:
            continue
        mine = [r for r in records if r.model == model.name]
        states = [statuses[r.id].state for r in mine]
        waking = [r for r, s in zip(mine, states)
                  if s.live and s not in (ReplicaState.READY, ReplicaState.DRAINING)]
        kind = events.get(model.name, ("", 0.0, ""))[0]
        entry: dict[str, Any] = {"idle_after_s": settings.idle_after_s, "expected_start": None,
                                 "ready_by": None, "impossible": None}
        if ReplicaState.READY in states:
            entry["state"] = "warm"
        elif waking or kind == "scale_waking":
            entry["state"] = "waking"
            starts = [(r.expected_start, r) for r in waking if r.started_at is None
                      and r.expected_start is not None]
            started = [(r.started_at, r) for r in waking if r.started_at is not None]
            if started:
                entry["ready_by"] = min(ready(r, at) for at, r in started)
            elif starts:
                entry["expected_start"] = min(at for at, _ in starts)
                entry["ready_by"] = min(ready(r, at) for at, r in starts)
        else:
            entry["state"] = "cold"
            if kind == "scale_impossible":
                entry["impossible"] = events[model.name][2]
        out[model.name] = entry
    return out
