"""``coral-hpc status FILE [--json]``: models, replicas, plan vs actual, recent events.

Reads the daemon's database read-only (it never changes what a running daemon owns) and derives
every replica's state with the same function the daemon uses.
"""

from __future__ import annotations

import time

import click

from coral_hpc.cli._output import console, fail, print_json
from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError, PermanentError


def status_data(deployment, store, now: float) -> dict:
    """The JSON ``status`` prints (plain data)."""
    from coral_hpc.daemon.process import info_path, lock_is_held, lock_path, read_info
    from coral_hpc.reconcile import ReconcileSettings, ReplicaFacts, ReplicaState, replica_status

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
    return {
        "deployment": deployment.deployment,
        "daemon": info,
        "models": models,
        "replicas": replicas,
        "plan": None if plan is None else {
            "time": plan.time, "cost_per_hour": plan.cost_per_hour, "status": plan.status,
            "solve_s": plan.solve_s, "rows": rows,
        },
        "events": [
            {"time": e.time, "kind": e.kind, "model": e.model, "replica": e.replica_id,
             "message": e.message}
            for e in store.events(limit=20)
        ],
    }


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def status(file: str, as_json: bool) -> None:
    """Show what FILE's daemon serves: models, replicas, plan vs actual, recent events."""
    from coral_hpc.store import open_store

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s)"])
    try:
        store = open_store(deployment.db_path, readonly=True)
    except PermanentError as exc:
        fail(str(exc))
    try:
        data = status_data(deployment, store, time.time())
    finally:
        store.close()
    if as_json:
        print_json(data)
        return
    _print_tables(data)


def _pending_note(replica: dict) -> str:
    """``Resources, expected 14:05 (in 12 min)`` for a PENDING replica; empty otherwise."""
    parts = []
    if replica.get("slurm_reason"):
        parts.append(str(replica["slurm_reason"]))
    start = replica.get("expected_start")
    if start:
        minutes = max(0.0, (start - time.time()) / 60)
        parts.append(f"expected {time.strftime('%H:%M', time.localtime(start))} "
                     f"(in {minutes:.0f} min)")
    return ", ".join(parts)


def _print_tables(data: dict) -> None:
    from rich.table import Table

    daemon = data["daemon"]
    console.print(
        f"[bold]{data['deployment']}[/]: "
        + (f"daemon pid {daemon['pid']}, gateway http://{daemon['gateway']}" if daemon
           else "[yellow]no daemon running[/]")
    )
    models = Table("model", "demand req/s", "served req/s", "ready", "planned")
    for m in data["models"]:
        models.add_row(m["name"], f"{m['demand']:.3g}", f"{m['served']:.3g}",
                       str(m["ready_replicas"]), str(m["planned_replicas"]))
    console.print(models)
    replicas = Table("replica", "model", "role", "job", "state", "partition", "tp×pp", "age",
                     "time left", "endpoint / Slurm")
    for r in data["replicas"]:
        left = "" if r["time_left_s"] is None else f"{r['time_left_s'] / 60:.0f} min"
        replicas.add_row(r["id"], r["model"], r["role"] or "?", r["job_id"] or "", r["state"],
                         r["partition"],
                         f"{r['tp']}×{r['pp']}", f"{r['age_s'] / 60:.0f} min", left,
                         r["endpoint"] or _pending_note(r))
    console.print(replicas)
    plan = data["plan"]
    if plan:
        table = Table("template", "partitions", "planned", "live", "ready", "cost/h",
                      title=f"plan: {plan['status']}, {plan['cost_per_hour']:.3g}/h")
        for row in plan["rows"]:
            table.add_row(row["template"], ",".join(row["partitions"]), str(row["planned"]),
                          str(row["live"]), str(row["ready"]), f"{row['cost_per_hour']:.3g}")
        console.print(table)
    events = Table("time", "kind", "replica", "message", title="recent events")
    for e in data["events"][:10]:
        events.add_row(time.strftime("%H:%M:%S", time.localtime(e["time"])), e["kind"],
                       e["replica"] or "", e["message"])
    console.print(events)
