"""``coral-hpc status FILE [--json]``: models, replicas, plan vs actual, recent events.

Reads the daemon's database read-only (it never changes what a running daemon owns) and derives
every replica's state with the same function the daemon uses.
"""

from __future__ import annotations

import time

import click

from coral_hpc.cli._output import Column, console, fail, print_json, print_table, wide_option
from coral_hpc.cli.timefmt import duration, local_time
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
@wide_option
def status(file: str, as_json: bool, wide: bool) -> None:
    """Show what FILE's daemon serves: models, replicas, plan vs actual, recent events."""
    from coral_hpc.store import open_store

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s)"])
    try:
        store = open_store(deployment.db_path, readonly=True)
    except PermanentError as exc:
        from coral_hpc.daemon.claim import served_elsewhere

        other = served_elsewhere(deployment.state_path)
        if other is not None:  # its database is on that host's local disk
            fail(f"{file}: the daemon serving {deployment.deployment} runs on {other['host']} "
                 f"(heartbeat {other['age_s']:.0f} s ago) and keeps its database there; run "
                 f"`coral-hpc status` on {other['host']}")
        fail(str(exc))
    try:
        data = status_data(deployment, store, time.time())
    finally:
        store.close()
    if as_json:
        print_json(data)
        return
    _print_tables(data, wide)


def _pending_note(replica: dict, now: float) -> str:
    """``Resources, expected 14:05 (in 12 min)`` for a PENDING replica; empty otherwise."""
    parts = []
    if replica.get("slurm_reason"):
        parts.append(str(replica["slurm_reason"]))
    start = replica.get("expected_start")
    if start:
        minutes = max(0.0, (start - now) / 60)
        parts.append(f"expected {time.strftime('%H:%M', time.localtime(start))} "
                     f"(in {minutes:.0f} min)")
    return ", ".join(parts)


def _print_tables(data: dict, wide: bool = False, now: float | None = None) -> None:
    now = time.time() if now is None else now
    daemon = data["daemon"]
    console.print(
        f"[bold]{data['deployment']}[/]: "
        + (f"daemon pid {daemon['pid']}, gateway http://{daemon['gateway']}" if daemon
           else "[yellow]no daemon running[/]")
    )
    print_table(
        [Column("model", "id"), Column("demand req/s", "num"), Column("served req/s", "num"),
         Column("ready", "num"), Column("planned", "num")],
        [(m["name"], f"{m['demand']:.3g}", f"{m['served']:.3g}", m["ready_replicas"],
          m["planned_replicas"]) for m in data["models"]],
        wide=wide,
    )
    print_table(
        [Column("replica", "id"), Column("model", "id"), Column("role", "id"),
         Column("job", "id"), Column("state", "id"), Column("partition"),
         Column("TP×PP", "id"), Column("age", "num"), Column("time left", "num"),
         Column("endpoint", "id")],
        [(r["id"], r["model"], r["role"] or "?", r["job_id"] or "", r["state"],
          r["partition"].replace(",", ", "), f"{r['tp']}×{r['pp']}", duration(r["age_s"]),
          duration(r["time_left_s"]), r["endpoint"] or _pending_note(r, now))
         for r in data["replicas"]],
        wide=wide,
    )
    plan = data["plan"]
    if plan:
        print_table(
            [Column("template", "id"), Column("partitions"), Column("planned", "num"),
             Column("live", "num"), Column("ready", "num"), Column("cost/h", "num")],
            [(row["template"], ", ".join(row["partitions"]), row["planned"], row["live"],
              row["ready"], f"{row['cost_per_hour']:.3g}") for row in plan["rows"]],
            title=f"plan of {local_time(plan['time'], now)}: {plan['status']}, "
                  f"{plan['cost_per_hour']:.3g}/h",
            wide=wide,
        )
    print_table(
        [Column("time", "id"), Column("kind", "id"), Column("replica", "id"),
         Column("message")],
        [(local_time(e["time"], now), e["kind"], e["replica"] or "", e["message"])
         for e in data["events"][:10]],
        title="recent events", wide=wide,
    )
