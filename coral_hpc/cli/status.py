"""``coral-hpc status FILE [--json]``: models, replicas, plan vs actual, recent events.

Reads the daemon's database read-only (it never changes what a running daemon owns) and derives
every replica's state with the same function the daemon uses. From a login node other than the
daemon's (its database is on that host's local disk) it prints what the daemon last published in
the shared state folder, and says when.
"""

from __future__ import annotations

import time

import click

from coral_hpc.cli._output import console, fail, print_json
from coral_hpc.config import load_deployment
from coral_hpc.daemon.status_file import status_data
from coral_hpc.errors import ConfigError, PermanentError


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
    data = _remote_status(deployment)
    if data is None:
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


def _remote_status(deployment) -> dict | None:
    """The published status when the daemon runs on another host (or its database is not
    here); None when the local database is the one to read."""
    import socket
    from pathlib import Path

    from coral_hpc.daemon.lease import holder
    from coral_hpc.daemon.status_file import read_status, status_file

    live = holder(deployment.state_path)
    elsewhere = live is not None and live.get("host") != socket.gethostname()
    if not elsewhere and Path(deployment.db_path).exists():
        return None
    published = read_status(status_file(deployment.state_path))
    if published is None:
        where = f"on {live.get('host')}" if live else "anywhere"
        fail(f"{deployment.deployment}: no database here ({deployment.db_path}) and no status "
             f"published in {deployment.state_path}; no daemon serves it {where}")
    published["daemon"] = live
    published["published_by"] = (live or {}).get("host")
    return published


def _print_tables(data: dict) -> None:
    from rich.table import Table

    daemon = data["daemon"]
    console.print(
        f"[bold]{data['deployment']}[/]: "
        + (f"daemon on {daemon.get('host', 'this host')} pid {daemon['pid']}, gateway "
           f"http://{daemon.get('gateway')}" if daemon
           else "[yellow]no daemon running[/]")
    )
    models = Table("model", "demand req/s", "served req/s", "ready", "planned")
    for m in data["models"]:
        models.add_row(m["name"], f"{m['demand']:.3g}", f"{m['served']:.3g}",
                       str(m["ready_replicas"]), str(m["planned_replicas"]))
    console.print(models)
    replicas = Table("replica", "model", "role", "job", "state", "partition", "tp×pp", "age",
                     "time left", "endpoint")
    for r in data["replicas"]:
        left = "" if r["time_left_s"] is None else f"{r['time_left_s'] / 60:.0f} min"
        replicas.add_row(r["id"], r["model"], r["role"] or "?", r["job_id"] or "", r["state"],
                         r["partition"],
                         f"{r['tp']}×{r['pp']}", f"{r['age_s'] / 60:.0f} min", left,
                         r["endpoint"] or "")
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
