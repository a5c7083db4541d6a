"""What ``coral-hpc status`` prints, computed from the daemon's database, and the copy the
daemon publishes in the shared state folder so ``status`` works from any login node (the
database lives on the daemon host's local disk)."""

from __future__ import annotations

import json
from pathlib import Path

from coral_hpc.atomic import write_atomic
from coral_hpc.reconcile import ReconcileSettings, ReplicaFacts, ReplicaState, replica_status

STATUS_FILE_NAME = "status.json"


def status_file(state_path: Path) -> Path:
    return Path(state_path) / STATUS_FILE_NAME


def status_data(deployment, store, now: float) -> dict:
    """The JSON ``status`` prints (plain data)."""
    from coral_hpc.daemon.process import info_path, lock_is_held, lock_path, read_info

    settings = ReconcileSettings.from_policy(deployment.policy)
    records = store.replicas(live_only=True)
    statuses = {r.id: replica_status(ReplicaFacts(r), now, settings) for r in records}
    plan = store.latest_plan()
    planned_demand = plan.demand if plan else {}
    replicas = []
    for r in records:
        s = statuses[r.id]
        replicas.append({
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
        })
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
        models.append({
            "name": m.name,
            "demand": demand,
            "served": min(demand, capacity),
            "capacity": capacity,
            "ready_replicas": len(ready),
            "planned_replicas": sum(row["count"] for row in (plan.rows if plan else [])
                                    if row.get("model") == m.name),
        })
    rows = []
    for row in plan.rows if plan else []:
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
    info = read_info(info_path(deployment)) if lock_is_held(lock_path(deployment)) else None
    if info is None:
        from coral_hpc.daemon.lease import holder

        info = holder(deployment.state_path)  # a daemon on another host: its lease record
    return {
        "deployment": deployment.deployment,
        "generated_at": now,
        "daemon": info,
        "models": models,
        "replicas": replicas,
        "plan": None if plan is None else {
            "time": plan.time, "cost_per_hour": plan.cost_per_hour, "status": plan.status,
            # cost_per_hour's unit: "billing" (Slurm billing units) or "gpu_hour" (the
            # partitions' prices per GPU-hour)
            "cost_unit": deployment.cluster.price_unit,
            "solve_s": plan.solve_s, "rows": rows,
        },
        "events": [
            {"time": e.time, "kind": e.kind, "model": e.model, "replica": e.replica_id,
             "message": e.message}
            for e in store.events(limit=20)
        ],
    }


def write_status(path: Path, data: dict) -> None:
    """Write the published status atomically (:mod:`coral_hpc.atomic`)."""
    write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def read_status(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
