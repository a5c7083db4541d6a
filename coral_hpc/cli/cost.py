"""``coral-hpc cost FILE [--since T] [--until T] [--json | --csv] [--plot FILE.png]``.

What this deployment's jobs cost according to Slurm's own books (sacct), per model, partition,
GPU type and day, per million tokens, and against what the plans predicted. Times: ISO 8601
(``2026-11-29``, ``2026-11-29T10:00``, local time unless a zone is given), ``@EPOCH``, ``now``
or ``now-90m`` / ``now-6h`` / ``now-2d``. Default range: since the deployment started (its first
replica or plan in the database) until now.
"""

from __future__ import annotations

import csv
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import click
from rich.text import Text

from coral_hpc.cli._output import (
    EXIT_UNAVAILABLE,
    Column,
    console,
    fail,
    print_json,
    print_table,
    wide_option,
)
from coral_hpc.config import Deployment, load_deployment
from coral_hpc.errors import ConfigError, PermanentError, TransientError
from coral_hpc.store import PlanRecord, ReplicaRecord, Store, open_store
from coral_hpc.types import JobTag

#: what --since/--until accept, for their --help and their errors
TIME_FORMATS = ("ISO 8601 date or time (2026-11-29, 2026-11-29T10:00, local time unless a zone "
                "such as +01:00 is given), @EPOCH seconds, now, or now-N with s/m/h/d "
                "(now-90m, now-6h, now-2d)")

_RELATIVE_RE = re.compile(r"^now(?:-(\d+(?:\.\d+)?)([smhd]))?$")
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now: float) -> float:
    """Epoch seconds of a ``--since``/``--until`` value; ValueError naming what is valid."""
    value = text.strip()
    match = _RELATIVE_RE.match(value)
    if match:
        amount, unit = match.groups()
        return now - (float(amount) * _UNITS_S[unit] if amount else 0.0)
    if value.startswith("@") and value[1:].replace(".", "", 1).isdigit():
        return float(value[1:])
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use {TIME_FORMATS}") from None
    return parsed.timestamp()  # naive = local time, as Slurm prints it


@dataclass
class Inputs:
    """What one cost run read: the deployment, its database (if any) and the range."""

    deployment: Deployment
    store: Store | None
    since: float
    until: float
    now: float


def read_inputs(file: str, since: str | None, until: str | None) -> Inputs:
    """Load ``models.yaml``, open the daemon's database read-only when it exists, fix the range.
    Exits 2 on bad input."""
    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s); nothing was read"])
    now = float(math.floor(time.time()))
    store = None
    db = Path(deployment.db_path).expanduser()
    if db.exists():
        try:
            store = open_store(db, readonly=True)
        except PermanentError as exc:
            fail(str(exc))
    try:
        end = parse_when(until, now) if until else now
        if since:
            start = parse_when(since, now)
        else:
            start = _deployment_start(store)
            if start is None:
                fail(
                    f"--since is needed: no database at {db} (db_path in {file}) to tell when "
                    "the deployment started"
                )
    except ValueError as exc:
        fail(f"--since/--until: {exc}")
    if end <= start:
        fail(f"--until ({_iso(end)}) must be after --since ({_iso(start)})")
    return Inputs(deployment, store, start, end, now)


def _deployment_start(store: Store | None) -> float | None:
    if store is None:
        return None
    replicas = store.replicas(live_only=False)
    starts = [r.created_at for r in replicas]
    first_plan = _plans(store, 0.0, float("inf"))
    starts += [p.time for p in first_plan or []]
    return min(starts) if starts else None


def _plans(store: Store | None, since: float, until: float) -> list[PlanRecord] | None:
    """The plans in force over the range (the one in force at ``since`` and every later one
    before ``until``), or None without a database."""
    if store is None:
        return None
    return store.plans_between(since, until)


def build(inputs: Inputs):  # type: ignore[no-untyped-def]
    """Read sacct through the Slurm layer and the database, and build the CostReport.
    Exits 3 when Slurm accounting cannot be read (disabled, slurmdbd down): never zeros."""
    from coral_hpc.accounting import build_report
    from coral_hpc.slurm import client_for_deployment

    deployment = inputs.deployment
    owns = _owns(deployment)
    try:
        client = client_for_deployment(deployment)
        records = client.accounting(deployment.deployment, inputs.since, min(inputs.until, inputs.now))
    except (TransientError, PermanentError) as exc:
        fail(
            [
                f"cannot read Slurm accounting (sacct): {exc}",
                (
                    "coral-hpc cost reads Slurm's own books: it needs accounting enabled "
                    "(AccountingStorageType=accounting_storage/slurmdbd) and slurmdbd answering; "
                    "no figures were produced."
                ),
            ],
            EXIT_UNAVAILABLE,
        )
    store = inputs.store
    demand = store.demand_since(inputs.since) if store else []
    replicas: list[ReplicaRecord] = store.replicas(live_only=False) if store else []
    plans = _plans(store, inputs.since, inputs.until)
    report = build_report(
        deployment, records, inputs.since, inputs.until, inputs.now,
        demand=demand, plans=plans, replicas=replicas, owns=owns, stops=_stops(store),
    )
    return report, replicas


def _stops(store: Store | None) -> list[float]:
    """When the deployment was brought down or its daemon stopped, from the database's
    events: the plans' prediction pauses there until the next plan."""
    from coral_hpc.accounting.predicted import STOP_EVENT_KINDS

    if store is None:
        return []
    return [event.time for kind in STOP_EVENT_KINDS
            for event in store.events(limit=1_000_000, kind=kind)]


def _owns(deployment: Deployment) -> Callable[[JobTag], bool]:
    """Which tagged jobs are this instance's (``coral_hpc.instance``): another copy of the
    deployment under the same name has its own instance and its own bill. Jobs from before
    instance tags count when their spec.json lies in this state folder (as ``down`` decides).
    Exits 2 when the instance file is unreadable."""
    from coral_hpc.instance import read_instance
    from coral_hpc.launch.spec import is_pre_instance_job_of

    try:
        instance = read_instance(deployment.state_path) or ""
    except PermanentError as exc:
        fail(f"{exc}; no figures were produced")

    def owns(tag: JobTag) -> bool:
        return tag.instance == instance or is_pre_instance_job_of(
            tag, deployment.state_path, deployment.deployment)

    return owns


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--since", metavar="TIME",
              help=f"Range start (default: when the deployment started). TIME: {TIME_FORMATS}.")
@click.option("--until", metavar="TIME", help="Range end, exclusive (default: now); as --since.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print rows (model, partition, GPU type, day) as CSV.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False), help="Write cost plots to this PNG.")
@wide_option
def cost(
    file: str, since: str | None, until: str | None, as_json: bool, as_csv: bool, plot: str | None,
    wide: bool,
) -> None:
    """What FILE's deployment cost according to sacct: GPU-hours and cost per model, partition,
    GPU type and day; cost per million tokens; booked against the plans' prediction."""
    if as_json and as_csv:
        fail("--json and --csv are exclusive: choose one")
    inputs = read_inputs(file, since, until)
    report, _ = build(inputs)
    if plot:
        from coral_hpc.accounting.report import write_cost_plot

        try:
            write_cost_plot(report, plot)
        except (OSError, PermanentError) as exc:
            fail(f"--plot {plot}: {exc}")
    data = report.to_dict()
    if as_json:
        print_json(data)
    elif as_csv:
        _write_csv(data)
    else:
        _print_table(data, wide)
        if plot:
            console.print(f"plots written to {plot}")


CSV_COLUMNS = (
    "model", "partition", "gpu_type", "day", "gpu_seconds", "gpu_hours", "billing_unit_hours",
    "cost", "unpriced_gpu_seconds",
)


def _write_csv(data: dict) -> None:
    writer = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    for row in data["rows"]:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def _print_table(data: dict, wide: bool = False) -> None:
    console.print(
        f"[bold]{data['deployment']}[/] from {data['since']} to {data['until']} "
        f"(unit: {data['price_unit']})"
    )
    total = data["total"]
    rows = [(row["model"], row["partition"], row["gpu_type"], row["day"],
             f"{row['gpu_hours']:.4f}", _money(row["cost"])) for row in data["rows"]]
    rows.append((Text("total", style="bold"), "", "", "", f"{total['gpu_hours']:.4f}",
                 _money(total["cost"])))
    print_table([Column("model", "id"), Column("partition", "id"), Column("GPU type", "id"),
                 Column("day", "id"), Column("GPU-hours", "num"), Column("cost", "num")],
                rows, wide=wide)
    print_table(
        [Column("model", "id"), Column("GPU-hours", "num"), Column("cost", "num"),
         Column("tokens", "num"), Column("cost / M tokens", "num"),
         Column("cost / M generated", "num")],
        [(m["model"], f"{m['gpu_hours']:.4f}", _money(m["cost"]),
          m["prompt_tokens"] + m["generated_tokens"], _money(m["cost_per_million_tokens"]),
          _money(m["cost_per_million_generated_tokens"])) for m in data["models"]],
        wide=wide,
    )
    comparison = data["plan_comparison"]
    if comparison:
        parts = comparison["parts"]
        console.print(
            f"plans predicted {_money(comparison['predicted_cost'])}, Slurm booked "
            f"{_money(comparison['booked_cost'])}: difference {_money(comparison['difference'])} = "
            f"pending {_money(parts['pending'])} + start-up {_money(parts['startup'])} + "
            f"overlap {_money(parts['overlap'])} + other {_money(parts['other'])}"
        )
    for warning in data["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")


def _money(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat()
