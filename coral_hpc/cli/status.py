"""``coral-hpc status FILE [--json]``: models, replicas, plan vs actual, recent events.

Reads the daemon's database read-only (it never changes what a running daemon owns) and derives
every replica's state with the same function the daemon uses. It first says whether the daemon
runs (host, pid, last heartbeat). When none does, nobody keeps the database up to date, so it
asks Slurm for the stored replicas' jobs (one batched squeue/sacct call) and probes their
endpoints' ``/health`` itself: a replica whose job Slurm no longer has is never shown READY.
Each row's ``source`` (``daemon``, ``slurm`` or ``last-known``) and ``observed_at`` in ``--json``
say which facts are live. From a login node other than the daemon's (its database is on that
host's local disk) it prints what the daemon last published in the shared state folder, and
says when.
"""

from __future__ import annotations

import time

import click

from coral_hpc.cli._output import Column, console, fail, print_json, print_table, wide_option
from coral_hpc.cli.timefmt import duration, local_time
from coral_hpc.config import load_deployment
from coral_hpc.daemon.status_file import running_daemon, status_data
from coral_hpc.demand import planned_for_lines
from coral_hpc.errors import ConfigError, PermanentError


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
    data = _remote_status(deployment)
    if data is None:
        try:
            store = open_store(deployment.db_path, readonly=True)
        except PermanentError as exc:
            fail(str(exc))
        try:
            now = time.time()
            live = None
            if running_daemon(deployment, now) is None:
                live = _ask_slurm(deployment, store.replicas(live_only=True))
            data = status_data(deployment, store, time.time(), live)
        finally:
            store.close()
    if data.get("plan") is not None:  # a status published before plans named their unit
        data["plan"].setdefault("cost_unit", deployment.cluster.price_unit)
    if as_json:
        print_json(data)
        return
    _print_tables(data, wide)


def _ask_slurm(deployment, records):
    """No daemon keeps the database current: ask Slurm and the endpoints now."""
    from coral_hpc.daemon.observed import observe
    from coral_hpc.slurm import client_for_deployment

    return observe(records, lambda: client_for_deployment(deployment),
                   endpoints_dir=deployment.state_path / "endpoints")


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
    published["daemon"] = None if live is None else {
        **{k: v for k, v in live.items() if k != "token"}, "heartbeat_at": live.get("renewed_at")}
    published["published_by"] = (live or {}).get("host")
    if live is None:
        # its daemon no longer runs: what it published is only last known; ask Slurm now
        from coral_hpc.daemon.observed import record_from_row
        from coral_hpc.daemon.status_file import restate_published

        now = float(published.get("generated_at") or time.time())
        records = [record_from_row(r, now) for r in published.get("replicas", [])]
        published = restate_published(deployment, published, _ask_slurm(deployment, records),
                                      time.time())
    return published


def _daemon_line(daemon: dict | None, data: dict, now: float) -> str:
    """``daemon on login1 pid 4242 (heartbeat 12 s ago), gateway …`` or why none runs."""
    if daemon:
        beat = daemon.get("heartbeat_at")
        return (f"daemon on {daemon.get('host', 'this host')} pid {daemon['pid']}"
                + (f" (heartbeat {duration(max(0.0, now - beat))} ago)" if beat else "")
                + f", gateway http://{daemon.get('gateway')}")
    last = data.get("last_daemon")
    if last and last.get("heartbeat_at"):
        how = "stopped" if last.get("released") else "last heartbeat"
        return (f"[yellow]no daemon running[/] ({how} on {last.get('host')} pid "
                f"{last.get('pid')} at {local_time(last['heartbeat_at'], now)})")
    return "[yellow]no daemon running[/]"


def _state(replica: dict) -> str:
    """The state, marked when it is only what the database last held."""
    if replica.get("source") == "last-known" and replica["state"] not in ("ENDED", "FAILED"):
        return f"{replica['state']} (last known)"
    return replica["state"]


def _end_note(replica: dict) -> str:
    """What Slurm said of a job that ended (asked by this ``status``, no daemon running)."""
    if replica.get("source") != "slurm" or replica["state"] not in ("ENDED", "FAILED"):
        return ""
    slurm = replica.get("slurm_state")
    return "Slurm: no such job" if slurm == "GONE" else f"Slurm: {slurm}" if slurm else ""


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


def _retry_note(until: float, now: float) -> str:
    """``14:05 (in 12 min)``: when an excluded template or shape may be planned again."""
    left = max(0.0, until - now)
    return f"{local_time(until, now)} (in {duration(left)})"


def _print_tables(data: dict, wide: bool = False, now: float | None = None) -> None:
    """``status`` for people: the header, then one table each for models, replicas, the plan,
    exclusions and recent events."""
    now = time.time() if now is None else now
    _print_header(data, now)
    _print_models(data, wide, now)
    print_table(
        [Column("replica", "id"), Column("model", "id"), Column("role", "id"),
         Column("job", "id"), Column("state", "id"), Column("partition"),
         Column("TP×PP", "id"), Column("age", "num"), Column("time left", "num"),
         Column("endpoint", "id")],
        [(r["id"], r["model"], r["role"] or "?", r["job_id"] or "", _state(r),
          r["partition"].replace(",", ", "), f"{r['tp']}×{r['pp']}", duration(r["age_s"]),
          duration(r["time_left_s"]), r["endpoint"] or _pending_note(r, now) or _end_note(r))
         for r in data["replicas"]],
        wide=wide,
    )
    _print_plan(data, wide, now)
    print_table(
        [Column("time", "id"), Column("kind", "id"), Column("replica", "id"),
         Column("message")],
        [(local_time(e["time"], now), e["kind"], e["replica"] or "", e["message"])
         for e in data["events"][:10]],
        title="recent events", wide=wide,
    )


def _print_header(data: dict, now: float) -> None:
    """The deployment's daemon line, and where the replica states come from."""
    daemon = data["daemon"]
    console.print(f"[bold]{data['deployment']}[/]: " + _daemon_line(daemon, data, now))
    source = data.get("source")
    if source == "slurm":
        console.print(f"replica states from Slurm and their endpoints at "
                      f"{local_time(data['observed_at'], now)} (no daemon updates the database)")
    elif source == "last-known" and data["replicas"]:
        console.print("[yellow]replica states are last known (the database as the daemon left "
                      "it), not live[/]"
                      + (f": {data['slurm_error']}" if data.get("slurm_error") else ""))
    if "published_by" in data:  # read from the state folder, not from a database here
        console.print(f"as published in the state folder at "
                      f"{local_time(data.get('generated_at') or now, now)}")


def _print_models(data: dict, wide: bool, now: float) -> None:
    """Per model: demand, what it is served at, replicas ready and planned, scale to zero where
    a model scales to zero; what was sized for."""
    scaled = any(m.get("scale") for m in data["models"])
    print_table(
        [Column("model", "id"), Column("mean req/s", "num"), Column("sized for", "num"),
         Column("demand req/s", "num"), Column("served req/s", "num"), Column("ready", "num"),
         Column("planned", "num"), *([Column("scale to zero", "id")] if scaled else [])],
        [(m["name"], _rate(m.get("mean_rps")), _rate(m.get("sized_rps")), f"{m['demand']:.3g}",
          f"{m['served']:.3g}", m["ready_replicas"], m["planned_replicas"],
          *([scale_words(m.get("scale"), now)] if scaled else []))
         for m in data["models"]],
        wide=wide,
    )
    if any(m.get("planned_for") for m in data["models"]):
        # demand = the rate sized for × (1 + policy.demand_headroom), at the last plan
        for line in planned_for_lines(data.get("plan_for") or "mean",
                                      {m["name"]: m.get("planned_for") or ""
                                       for m in data["models"]}):
            console.print(line, highlight=False)


def _print_plan(data: dict, wide: bool, now: float) -> None:
    """The last plan's rows, and the templates and shapes kept out of plans."""
    plan = data["plan"]
    if plan:
        # the deployment's price unit per hour, as `plan` says it
        billing = plan.get("cost_unit") == "billing"
        rate = ("billing units/h (Slurm's billing)" if billing
                else "price units/h (the partitions' prices per GPU-hour)")
        print_table(
            [Column("template", "id"), Column("partitions"), Column("planned", "num"),
             Column("live", "num"), Column("ready", "num"), Column("cost/h", "num")],
            [(row["template"], ", ".join(row["partitions"]), row["planned"], row["live"],
              row["ready"], f"{row['cost_per_hour']:.3g}") for row in plan["rows"]],
            title=f"plan of {local_time(plan['time'], now)}: {plan['status']}, "
                  f"{plan['cost_per_hour']:.3g} {rate}",
            wide=wide,
        )
    excluded = data.get("excluded") or []  # absent from a status published before it
    if excluded:
        print_table(
            [Column("template", "id"), Column("partitions"), Column("tried again", "id"),
             Column("why")],
            [(e["template"], ", ".join(e["partitions"] or ["any"]), _retry_note(e["until"], now),
              e["reason"]) for e in excluded],
            title="kept out of plans", wide=wide,
        )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def scale_words(scale: dict | None, now: float) -> str:
    """A model's scale-to-zero state for the models table: warm, cold (why a wake cannot
    succeed, if so), or waking with Slurm's expected start and the expected READY time."""
    if not scale:
        return "always on"
    state = scale.get("state") or "?"
    if state == "waking":
        parts = []
        if scale.get("expected_start"):
            parts.append(f"Slurm starts it {local_time(scale['expected_start'], now)}")
        if scale.get("ready_by"):
            parts.append(f"READY ~{local_time(scale['ready_by'], now)}")
        return state + (f" ({'; '.join(parts)})" if parts else "")
    if state == "cold" and scale.get("impossible"):
        return "cold: cannot wake"
    return state
