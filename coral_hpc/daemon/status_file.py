"""What ``coral-hpc status`` prints, computed from the daemon's database, and the copy the
daemon publishes in the shared state folder so ``status`` works from any login node (the
database lives on the daemon host's local disk).

Every replica row says where its state comes from and when it was seen (``source``,
``observed_at``): ``daemon`` — the running daemon's own observation; ``slurm`` — no daemon runs,
so ``status`` asked Slurm and the endpoint itself just now (:mod:`coral_hpc.daemon.observed`);
``last-known`` — no daemon runs and Slurm could not be asked: what the database last held.
"""

from __future__ import annotations

import json
from pathlib import Path

from coral_hpc.atomic import write_atomic
from coral_hpc.config import scale_to_zero
from coral_hpc.daemon.observed import LiveFacts, as_observed, record_from_row
from coral_hpc.daemon.temperature import latest_scale_events, model_temperatures
from coral_hpc.daemon.wake import replica_startup
from coral_hpc.demand import plan_for_words
from coral_hpc.plan.figures import measured_profile_dirs
from coral_hpc.plan.layout_startup import own_layout_startups, profile_startups
from coral_hpc.reconcile import (
    ReconcileSettings,
    ReplicaFacts,
    ReplicaState,
    ReplicaStatus,
    replica_status,
)
from coral_hpc.reconcile.startup import learned_startup_s
from coral_hpc.records import PlanRecord, ReplicaRecord
from coral_hpc.types import ShapeExclusion

STATUS_FILE_NAME = "status.json"


def status_file(state_path: Path) -> Path:
    return Path(state_path) / STATUS_FILE_NAME


def running_daemon(deployment, now: float | None = None) -> dict | None:
    """The daemon serving ``deployment`` now, on this host (it holds the lock) or another (its
    lease is fresh): its pid/address record with ``host`` and ``heartbeat_at`` (the lease's last
    renewal; None when only the lock says it runs). None when no daemon runs."""
    import socket

    from coral_hpc.daemon.lease import holder
    from coral_hpc.daemon.process import info_path, lock_is_held, lock_path, read_info

    lease = holder(deployment.state_path, now)
    local = read_info(info_path(deployment)) if lock_is_held(lock_path(deployment)) else None
    if local is None and lease is None:
        return None
    info = {k: v for k, v in (local or lease or {}).items() if k != "token"}
    info.setdefault("host", (lease or {}).get("host") or socket.gethostname())
    info["heartbeat_at"] = (lease or {}).get("renewed_at")
    return info


def last_daemon(deployment) -> dict | None:
    """Host, pid and last heartbeat of the daemon that held the lease last (stopped or dead)."""
    from coral_hpc.daemon.lease import lease_file, read_lease

    record = read_lease(lease_file(deployment.state_path))
    if record is None:
        return None
    return {"host": record.get("host"), "pid": record.get("pid"),
            "heartbeat_at": record.get("renewed_at"), "released": bool(record.get("released"))}


def status_data(deployment, store, now: float, live: LiveFacts | None = None) -> dict:
    """The JSON ``status`` prints (plain data). With a running daemon the database is its live
    record; without one pass ``live`` (:func:`coral_hpc.daemon.observed.observe`), so Slurm's
    and the endpoints' answers replace the stored facts, or the rows say they are last known."""
    settings = ReconcileSettings.from_policy(deployment.policy)
    info = running_daemon(deployment, now)
    stored = store.replicas(live_only=True)
    if info is not None:
        source, live = "daemon", None
    elif live is not None and live.error is None:
        source = "slurm"
    else:
        source = "last-known"
    records = ([as_observed(r, live, settings.unhealthy_after) for r in stored]
               if source == "slurm" and live is not None else stored)
    statuses = {r.id: replica_status(ReplicaFacts(r), now, settings) for r in records}
    plan = store.latest_plan()
    return {
        "deployment": deployment.deployment,
        "generated_at": now,
        "daemon": info,
        "last_daemon": None if info is not None else last_daemon(deployment),
        "source": source,
        "observed_at": live.observed_at if source == "slurm" and live is not None else None,
        "slurm_error": None if live is None else live.error,
        "plan_for": plan_for_words(deployment.policy),
        "models": _model_rows(deployment, records, statuses, plan,
                              _temperatures(deployment, store, records, statuses)),
        "replicas": [_replica_row(r, statuses[r.id], now, source, live) for r in records],
        "plan": None if plan is None else {
            "time": plan.time, "cost_per_hour": plan.cost_per_hour, "status": plan.status,
            # cost_per_hour's unit: "billing" (Slurm billing units) or "gpu_hour" (the
            # partitions' prices per GPU-hour)
            "cost_unit": deployment.cluster.price_unit,
            "solve_s": plan.solve_s, "rows": _plan_rows(plan, records, statuses),
        },
        # templates and shapes kept out of plans now, why, and when they are tried again
        "excluded": [
            {"template": e.target.template_id,
             "partitions": (list(e.target.partitions) if isinstance(e.target, ShapeExclusion)
                            else None),
             "kind": e.kind.value, "since": e.since, "until": e.until, "reason": e.reason}
            for e in store.exclusions(now)
        ],
        "events": [
            {"time": e.time, "kind": e.kind, "model": e.model, "replica": e.replica_id,
             "message": e.message}
            for e in store.events(limit=20)
        ],
    }


def _temperatures(deployment, store, records: list[ReplicaRecord],
                  statuses: dict[str, ReplicaStatus]) -> dict[str, dict]:
    """Scale to zero: cold / waking (with Slurm's estimate) / warm, per model scaled to zero."""
    startup = learned_startup_s(store.startups(limit=50), deployment.policy.startup_time_s)
    if not any(scale_to_zero(m, deployment.policy).enabled for m in deployment.models):
        return {}
    # each waking replica's READY time from its own layout's start-up, as the daemon tells
    # the gateway (its Retry-After)
    own = own_layout_startups(store.replicas(live_only=False))
    profiles = profile_startups(measured_profile_dirs(deployment))
    return model_temperatures(deployment, records, statuses, latest_scale_events(store), startup,
                              lambda r: replica_startup(deployment, r, own, profiles, startup))


def _replica_row(
    r: ReplicaRecord, s: ReplicaStatus, now: float, source: str, live: LiveFacts | None
) -> dict:
    """One replica's row of ``status``: record ``r`` with its derived status ``s``, and where
    its state comes from (``source``, ``observed_at``)."""
    return {
        "id": r.id,
        "model": r.model,
        "job_id": r.job_id,
        "state": s.state.value,
        "partition": ",".join(r.partitions),
        "endpoint": r.endpoint if s.state is ReplicaState.READY else None,
        "tp": r.layout.tp if r.layout else None,
        "pp": r.layout.pp if r.layout else None,
        "role": r.layout.role if r.layout else None,
        "template": r.template_id,
        "nodes": r.nodes,
        "age_s": round(now - r.created_at, 1),
        "time_left_s": None if s.time_left_s is None else round(s.time_left_s, 1),
        "throughput": r.throughput,
        # why Slurm holds it, and when Slurm expects to start it (squeue --start)
        "slurm_reason": r.slurm_reason if s.state is ReplicaState.PENDING else None,
        "expected_start": r.expected_start if s.state is ReplicaState.PENDING else None,
        "slurm_state": r.slurm_state,
        # whether the endpoint answered /health just now (source slurm); None: not probed
        "health": None if live is None else live.health.get(r.id),
        "source": source if r.job_id is not None else "last-known",
        "observed_at": (live.observed_at if source == "slurm" and live is not None
                        and r.job_id is not None else r.last_seen_at),
    }


def _model_rows(
    deployment, records: list[ReplicaRecord], statuses: dict[str, ReplicaStatus],
    plan: PlanRecord | None, scale: dict[str, dict],
) -> list[dict]:
    """Per model: demand planned for, READY capacity, replicas ready and planned, and (models
    scaled to zero) cold / waking / warm."""
    planned_demand = plan.demand if plan else {}
    models = []
    for m in deployment.models:
        ready = [r for r in records if r.model == m.name
                 and statuses[r.id].state is ReplicaState.READY]
        # a disaggregated request needs a prefill and a decode replica: the lesser side counts
        by_role = {"both": 0.0, "prefill": 0.0, "decode": 0.0}
        for r in ready:
            by_role[r.layout.role if r.layout else "both"] += r.throughput
        capacity = by_role["both"] + min(by_role["prefill"], by_role["decode"])
        demand = planned_demand.get(m.name, m.demand_rps or 0.0)
        basis = (plan.demand_basis if plan else {}).get(m.name) or {}
        models.append({
            "name": m.name,
            "demand": demand,
            # the mean rate, the rate sized for (policy.plan_for) and why, at the last plan
            "mean_rps": basis.get("mean_rps"),
            "sized_rps": basis.get("sized_rps"),
            "planned_for": basis.get("basis"),
            "served": min(demand, capacity),
            "capacity": capacity,
            "ready_replicas": len(ready),
            "planned_replicas": sum(row["count"] for row in (plan.rows if plan else [])
                                    if row.get("model") == m.name),
            "scale": scale.get(m.name),
        })
    return models


def _plan_rows(
    plan: PlanRecord, records: list[ReplicaRecord], statuses: dict[str, ReplicaStatus]
) -> list[dict]:
    """The last plan's rows, each with how many of its replicas are live and READY now."""
    rows = []
    for row in plan.rows:
        actual = [r for r in records if r.template_id == row["template_id"]
                  and list(r.partitions) == list(row["partitions"])]
        rows.append({
            "model": row["model"], "template": row["template_id"],
            "partitions": row["partitions"], "planned": row["count"],
            "ready": sum(1 for r in actual if statuses[r.id].state is ReplicaState.READY),
            "live": len(actual), "cost_per_hour": row["cost_per_hour"],
            "queued": bool(row.get("queued", False)),
            "expected_wait_s": row.get("expected_wait_s"),
        })
    return rows


def restate_published(deployment, data: dict, live: LiveFacts | None, now: float) -> dict:
    """``data`` as the daemon published it, for a ``status`` run while no daemon runs: each row
    marked last known, or — when ``live`` holds Slurm's answer — its state derived again from
    the facts the row implies (:func:`~coral_hpc.daemon.observed.record_from_row`) with what
    Slurm and the endpoint say now, and the models' READY counts recounted."""
    settings = ReconcileSettings.from_policy(deployment.policy)
    published_at = float(data.get("generated_at") or now)
    asked = live is not None and live.error is None
    data["source"] = "slurm" if asked else "last-known"
    data["observed_at"] = live.observed_at if asked and live is not None else None
    data["slurm_error"] = None if live is None else live.error
    data["last_daemon"] = last_daemon(deployment)
    for row in data.get("replicas", []):
        if not asked or live is None or not row.get("job_id"):
            row["source"] = "last-known"
            row.setdefault("observed_at", published_at)
            continue
        record = as_observed(record_from_row(row, published_at), live, settings.unhealthy_after)
        state = replica_status(ReplicaFacts(record), now, settings).state
        row.update(state=state.value, slurm_state=record.slurm_state,
                   health=live.health.get(record.id), source="slurm",
                   observed_at=live.observed_at,
                   endpoint=row.get("endpoint") if state is ReplicaState.READY else None)
    ready: dict[str, int] = {}
    for row in data.get("replicas", []):
        if row.get("state") == ReplicaState.READY.value:
            ready[row.get("model")] = ready.get(row.get("model"), 0) + 1
    if asked:
        for model in data.get("models", []):
            model["ready_replicas"] = ready.get(model.get("name"), 0)
    return data


def write_status(path: Path, data: dict) -> None:
    """Write the published status atomically (:mod:`coral_hpc.atomic`)."""
    write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def read_status(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
