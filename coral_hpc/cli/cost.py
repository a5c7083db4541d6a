"""``coral-hpc cost FILE [--since T] [--until T] [--json | --csv] [--plot FILE.png]``.

What this deployment's jobs cost according to Slurm's own books (sacct), per model, partition,
GPU type and day, per million tokens, and against what the plans predicted. Times: as sacct
reads them (``now-2days``, ``now-3hours``, ``today``, ``midnight``, ``noon``, ``14:30``,
``12/01``), plus ``yesterday``, ``now-90m``, ISO 8601 (``2026-11-29T10:00``, local time unless a
zone is given) and ``@EPOCH``. Default range: since the deployment started (its first replica or
plan in the database) until now.
"""

from __future__ import annotations

import csv
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from coral_hpc.accounting.summary import CostReport

#: what --since/--until accept, for their --help and their errors
TIME_FORMATS = ("sacct's TIME forms: now[-N[seconds|minutes|hours|days|weeks]] (now-90m, "
                "now-3hours, now-2days), today, midnight, noon, elevenses, fika, teatime, "
                "yesterday, tomorrow, HH:MM[:SS][AM|PM], MM/DD[/YY][-HH:MM[:SS]], "
                "MMDD[YY][-HH:MM[:SS]], YYYY-MM-DD[THH:MM[:SS]] (local time unless a zone such "
                "as +01:00 is given), or @EPOCH seconds")

_RELATIVE_RE = re.compile(
    r"^now(?:\s*([+-])\s*(\d+(?:\.\d+)?)\s*([a-z]*))?$", re.IGNORECASE)
#: sacct's units (seconds when none), and the short forms people type
_UNITS_S = {**{u: 1 for u in ("", "s", "sec", "secs", "second", "seconds")},
            **{u: 60 for u in ("m", "min", "mins", "minute", "minutes")},
            **{u: 3600 for u in ("h", "hr", "hrs", "hour", "hours")},
            **{u: 86400 for u in ("d", "day", "days")},
            **{u: 604800 for u in ("w", "week", "weeks")}}
#: sacct's named times of day (slurm's parse_time), hour of the day
_NAMED_HOURS = {"today": 0, "midnight": 0, "noon": 12, "elevenses": 11, "fika": 15,
                "teatime": 16}
_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?$", re.IGNORECASE)
_TIME_TAIL = r"(?:-(\d{1,2}):(\d{2})(?::(\d{2}))?)?$"
#: MM/DD[/YY] and MM.DD[.YY], then MMDD[YY], each with an optional -HH:MM[:SS]
_DATE_RES = (re.compile(r"^(\d{1,2})/(\d{1,2})(?:/(\d{2}))?" + _TIME_TAIL),
             re.compile(r"^(\d{1,2})\.(\d{1,2})(?:\.(\d{2}))?" + _TIME_TAIL),
             re.compile(r"^(\d{2})(\d{2})(\d{2})?" + _TIME_TAIL))


def parse_when(text: str, now: float) -> float:
    """Epoch seconds of a ``--since``/``--until`` value, read as sacct reads its TIME (local
    time; a time of day or a date without a year that would lie ahead means the last one
    passed, as sacct assumes the past); ValueError naming what is valid."""
    value = text.strip()
    match = _RELATIVE_RE.match(value)
    if match:
        sign, amount, unit = match.groups()
        if amount is None:
            return now
        if unit.lower() not in _UNITS_S:
            raise ValueError(f"{text!r}: unit {unit!r} is not one of seconds, minutes, hours, "
                             f"days, weeks; use {TIME_FORMATS}")
        delta = float(amount) * _UNITS_S[unit.lower()]
        return now - delta if sign == "-" else now + delta
    if value.startswith("@") and value[1:].replace(".", "", 1).isdigit():
        return float(value[1:])
    current = datetime.fromtimestamp(now)
    midnight = current.replace(hour=0, minute=0, second=0, microsecond=0)
    word = value.lower()
    if word in ("yesterday", "tomorrow"):
        return (midnight + timedelta(days=-1 if word == "yesterday" else 1)).timestamp()
    if word in _NAMED_HOURS:
        return _past_time_of_day(midnight, _NAMED_HOURS[word], 0, 0, now)
    clock = _CLOCK_RE.match(value)
    if clock:
        hour, minute, second, half = clock.groups()
        h = int(hour)
        if half:
            if not 1 <= h <= 12:
                raise ValueError(f"{text!r}: hour {h} with {half}; use {TIME_FORMATS}")
            h = h % 12 + (12 if half.lower() == "pm" else 0)
        return _past_time_of_day(midnight, h, int(minute), int(second or 0), now, text)
    for pattern in _DATE_RES:
        date = pattern.match(value)
        if date:
            return _month_day(date.groups(), current, now, text)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use {TIME_FORMATS}") from None
    return parsed.timestamp()  # naive = local time, as Slurm prints it


def _past_time_of_day(midnight: datetime, hour: int, minute: int, second: int, now: float,
                      text: str = "") -> float:
    try:
        moment = midnight.replace(hour=hour, minute=minute, second=second)
    except ValueError:
        raise ValueError(f"{text!r} is not a time of day: use {TIME_FORMATS}") from None
    if moment.timestamp() > now:  # sacct assumes the past: the last one passed
        moment -= timedelta(days=1)
    return moment.timestamp()


def _month_day(groups: tuple, current: datetime, now: float, text: str) -> float:
    month, day, year, hour, minute, second = groups
    try:
        moment = datetime(2000 + int(year) if year else current.year, int(month), int(day),
                          int(hour or 0), int(minute or 0), int(second or 0))
        if not year and moment.timestamp() > now:  # sacct assumes the past
            moment = moment.replace(year=moment.year - 1)
    except ValueError:
        raise ValueError(f"{text!r} is not a date: use {TIME_FORMATS}") from None
    return moment.timestamp()


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
            first = _deployment_start(store)
            if first is None:
                fail(
                    f"--since is needed: no database at {db} (db_path in {file}) to tell when "
                    "the deployment started"
                )
            start = first
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


def build(inputs: Inputs) -> tuple[CostReport, list[ReplicaRecord]]:
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
        labs=_key_labs(deployment),
    )
    return report, replicas


def _key_labs(deployment: Deployment) -> dict[str, str]:
    """API key name → lab, from the deployment's keys file (empty without one). A keys file
    that cannot be read leaves every key without a lab: the cost figures stand regardless."""
    from coral_hpc.gateway.auth import KeysFileError, read_keys_file

    path = deployment.gateway.api_keys_file
    if not path:
        return {}
    try:
        entries = read_keys_file(Path(path).expanduser())
    except (OSError, KeysFileError) as exc:
        print(f"warning: labs not shown: {exc}", file=sys.stderr)
        return {}
    return {entry.name: entry.lab for entry in entries if entry.lab}


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
    report, replicas = build(inputs)
    if plot:
        from coral_hpc.accounting.report import write_cost_plot

        try:
            write_cost_plot(report, plot)
        except (OSError, PermanentError) as exc:
            fail(f"--plot {plot}: {exc}")
    data = report.to_dict()
    from coral_hpc.accounting.idle_savings import scale_to_zero_savings

    # models scaled to zero: GPU-hours saved against keeping their smallest replica up
    data["scale_to_zero"] = scale_to_zero_savings(inputs.deployment, replicas, report.since,
                                                  report.until, report.now)
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
    if data["labs"]:
        print_table(
            [Column("lab", "id"), Column("API keys", "id"), Column("tokens", "num"),
             Column("cost", "num")],
            [(lab["lab"] or "(no lab)", ", ".join(lab["api_keys"]),
              lab["prompt_tokens"] + lab["generated_tokens"], _money(lab["cost"]))
             for lab in data["labs"]]
            + [(Text("no key", style="dim"), "", "", _money(data["unattributed_cost"]))],
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
    if data.get("scale_to_zero"):
        print_table(
            [Column("scaled to zero", "id"), Column("cold hours", "num"),
             Column("smallest replica GPUs", "num"), Column("GPU-hours saved", "num")],
            [(m["model"], f"{m['cold_hours']:.2f}", m["smallest_replica_gpus"] or "—",
              "—" if m["gpu_hours_saved"] is None else f"{m['gpu_hours_saved']:.2f}")
             for m in data["scale_to_zero"]],
            wide=wide,
        )
    for warning in data["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")


def _money(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat()
