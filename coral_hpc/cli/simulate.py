"""``coral-hpc simulate models.yaml --trace T [--snapshot S] [--hours H] [--json] [--plot P]``:
what these models would cost on this cluster for this demand, and whether they would meet their
SLOs — a trace replayed in virtual time through the daemon's planner and re-plan rule, served
by simulated replicas (:mod:`coral_hpc.simulate.run`). Submits nothing; never asks Slurm with
``--snapshot``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from coral_hpc.cli._output import (
    Column,
    console,
    err_console,
    fail,
    print_json,
    print_table,
    wide_option,
)


class _FirstPass:
    """Stage 1's progress for the first plan only: later re-plans read its cache."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.done = False

    def __call__(self, name: str, done: int, total: int) -> None:
        if not self.done:
            self.inner(name, done, total)
            self.done = not name


def _log(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def parse_traces(values: tuple[str, ...], models: list[str]) -> tuple[str | None, dict[str, str]]:
    """(the trace for every model, {model: its own trace}) from ``--trace`` values; exits 2
    naming a model the file does not declare or a second default trace."""
    default: str | None = None
    own: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if sep and "/" not in name and name:
            if name not in models:
                fail(f"--trace {value}: no model {name!r} in the file; models: "
                     f"{', '.join(models)}")
            if name in own:
                fail(f"--trace {value}: model {name!r} was given a trace twice")
            own[name] = path
        elif default is not None:
            fail(f"--trace {value}: a trace for every model was already given ({default}); "
                 "give one model its own with --trace MODEL=PATH")
        else:
            default = value
    missing = [m for m in models if m not in own and default is None]
    if missing:
        fail(f"--trace: no trace for model(s) {', '.join(missing)}; give --trace PATH for "
             "every model or --trace MODEL=PATH for each")
    return default, own


@click.command()
@click.argument("models_yaml", type=click.Path(dir_okay=False))
@click.option("--trace", "traces", multiple=True, required=True, metavar="[MODEL=]PATH",
              help="A trace to replay (an Azure LLM .csv or a Mooncake .jsonl): PATH for every "
                   "model, its arrivals scaled to each model's declared demand (demand: auto: "
                   "the trace's own rate) and its lengths kept; MODEL=PATH for one model. "
                   "Repeatable.")
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False),
              help="Simulate on a snapshot saved by `coral-hpc cluster --json` (default: the "
                   "live cluster, which needs Slurm).")
@click.option("--hours", type=click.FloatRange(min=0.0, min_open=True),
              help="Hours of the trace to replay (default: the longest trace's span; a longer "
                   "span repeats the trace).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the arrivals drawn from the traces.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False),
              help="Write replicas over time and GPU-hours by partition to this PNG.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Stage-1 cache folder (default ~/.cache/coral-hpc/templates).")
@wide_option
def simulate(models_yaml: str, traces: tuple[str, ...], snapshot_file: str | None,
             hours: float | None, seed: int, as_json: bool, plot: str | None,
             cache_dir: str | None, wide: bool) -> None:
    """Replay a trace for MODELS_YAML in virtual time: the daemon's planner and re-plan rule,
    simulated replicas; report cost, SLO attainment per model, GPU-hours per partition and
    replicas over time (progress on stderr; nothing is submitted)."""
    from coral_hpc.cli.plan import _known_architectures, _load_deployment, _unknown_architectures
    from coral_hpc.errors import PermanentError
    from coral_hpc.simulate.run import model_workloads

    deployment = _load_deployment(models_yaml, nothing_was="simulated")
    unknown = _unknown_architectures(deployment)
    if unknown:
        fail(f"{models_yaml}: architecture(s) {unknown} not in profiles/models.yaml; known: "
             f"{', '.join(sorted(_known_architectures()))}")
    embedding = [(i, m) for i, m in enumerate(deployment.models) if m.embedding]
    if embedding:
        # the traces are of generation (prompt and output lengths); the virtual-time replicas
        # would decode for an embedding model: refused rather than reported wrongly
        fail([deployment.problem(("models", i, "slo"), f"model {m.name!r} is an embedding "
                                 "model: `coral-hpc simulate` replays generation traces only; "
                                 "leave it out of the models.yaml you simulate")
              for i, m in embedding]
             + [f"{models_yaml}: {len(embedding)} problem(s); nothing was simulated"])
    names = [m.name for m in deployment.models]
    per_model = _trace_rows(traces, names)
    span_s = hours * 3600.0 if hours else max(r.span_s for r in per_model.values())
    snapshot = _snapshot(models_yaml, snapshot_file)
    loads = model_workloads(deployment, per_model, span_s, seed)
    _log(f"simulating {span_s / 3600:.2f} h of {sum(len(w.at) for w in loads.values()):,} "
         f"requests for {len(names)} model(s)")
    result, always = _run(models_yaml, deployment, snapshot, loads, span_s, cache_dir)
    if plot:
        from coral_hpc.simulate.plot import write_simulation_plot

        try:
            write_simulation_plot(result, plot)
        except (OSError, PermanentError) as exc:
            fail(f"--plot {plot}: {exc}")
    data = result.to_json()
    if always is not None:  # some model scales to zero: against the same run always-on
        from coral_hpc.simulate.compare import against_always_on

        data["scale_to_zero"] = against_always_on(result, always)
    if as_json:
        print_json(data)
    else:
        _print_tables(data, wide)
        if plot:
            console.print(f"plots written to {plot}", highlight=False)


def _trace_rows(traces: tuple[str, ...], names: list[str]) -> dict:
    """{model: the trace rows it replays} from ``--trace`` values, each file read once; exits 2
    naming a trace that cannot be read."""
    from coral_hpc.simulate.traces import TraceError, TraceRows, load_rows

    default, own = parse_traces(traces, names)
    rows_of: dict[str, TraceRows] = {}
    for model, path in ([("", default)] if default else []) + list(own.items()):
        if path not in rows_of:
            try:
                rows_of[path] = load_rows(path)
            except TraceError as exc:
                fail(f"--trace {model + '=' if model else ''}{path}: {exc}")
    return {m: rows_of[own[m] if m in own else str(default)] for m in names}


def _snapshot(models_yaml: str, snapshot_file: str | None):
    """The saved snapshot, or (saying so, since it needs Slurm) the live cluster's."""
    from coral_hpc.cli.cluster import load_snapshot_file, observe

    if snapshot_file:
        return load_snapshot_file(snapshot_file)
    _log("no --snapshot: reading the live cluster from Slurm (save one with "
         "`coral-hpc cluster --json > snapshot.json` and pass --snapshot to simulate "
         "without Slurm)")
    return observe(models_yaml, None)


def _run(models_yaml: str, deployment, snapshot, loads, span_s: float, cache_dir: str | None):
    """Replay ``loads`` through the daemon's planner, Stage 1's progress shown for the first
    plan, and again always-on when some model scales to zero
    (:func:`coral_hpc.simulate.compare.simulate_both`); exit 2 when policy.solver names a
    solver this host lacks."""
    from coral_hpc.cli._output import stage1_progress
    from coral_hpc.plan.planner import Planner, SolverUnavailable
    from coral_hpc.simulate.compare import simulate_both

    with stage1_progress() as progress:
        planner = Planner(cache_dir=Path(cache_dir) if cache_dir else None,
                          progress=_FirstPass(progress), probe=False)
        try:
            return simulate_both(deployment, snapshot, loads, span_s, planner, log=_log)
        except SolverUnavailable as exc:
            fail([f"{models_yaml}: {exc}", f"{models_yaml}: 1 problem(s); nothing was simulated"])


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _print_tables(data: dict, wide: bool) -> None:
    unit = "billing units" if data["unit"] == "billing" else "cost units (partition prices)"
    cost = data["cost"]
    attained = data["slo_attainment"]
    title = (f"{data['hours']:.2f} h simulated: {cost['total']:.2f} {unit} "
             f"({cost['provisioning']:.2f} provisioning + {cost['startup']:.2f} start-up; "
             f"{cost['per_hour_mean']:.2f}/h); within SLO "
             + ("-" if attained is None else f"{attained:.1%}"))
    rows = [[name, m["requests"], _fmt(m["demand_rps"]), _fmt(m["planned_rps"]),
             "-" if m["slo_attainment"] is None else f"{m['slo_attainment']:.1%}", m["refused"],
             f"{m['cost']:.2f}", f"{m['gpu_hours']:.2f}", f"{m['mean_replicas']:.2f}"]
            for name, m in data["models"].items()]
    print_table([Column("model", "id"), Column("requests", "num"), Column("req/s", "num"),
                 Column("planned req/s", "num"), Column("within SLO", "num"),
                 Column("refused", "num"), Column("cost", "num"), Column("GPU-h", "num"),
                 Column("mean replicas", "num")], rows, title=title, wide=wide)
    plan_for = data.get("plan_for", "mean")
    console.print(f"planned req/s (last plan): sized for the {plan_for} (policy.plan_for) × "
                  "(1 + headroom)", highlight=False)
    if plan_for != "mean":
        for name, m in data["models"].items():
            console.print(f"  {name}: sized for {m.get('planned_for') or '-'}", highlight=False)
    _print_mix_notes(data["models"])
    print_table([Column("partition", "id"), Column("GPU-h", "num")],
                [[p, f"{v:.2f}"] for p, v in data["gpu_hours_by_partition"].items()],
                title="GPU-hours by partition", wide=wide)
    changes, last = [], None
    for point in data["replicas_over_time"]:
        if point["accepted"] and (point["replicas"], point["cost_per_hour"]) != last:
            last = (point["replicas"], point["cost_per_hour"])
            changes.append([f"{point['at_h']:.2f}", point["trigger"],
                            f"{point['cost_per_hour']:.2f}",
                            ", ".join(f"{m} {n}" for m, n in point["replicas"].items())])
    print_table([Column("hour", "num"), Column("trigger", "id"), Column("cost/h", "num"),
                 Column("replicas")], changes,
                title=f"Replicas over time ({data['replans']['count']} re-plans, "
                      f"{data['replans']['refused']} refused; rows where the plan changed)",
                wide=wide)
    if "scale_to_zero" in data:
        _print_scale_to_zero(data["scale_to_zero"], wide)
    if attained is not None and attained < 0.95:
        err_console.print("note: fewer than 95 % of requests met their SLO", highlight=False)


def _print_mix_notes(models: dict) -> None:
    """A note for each model whose last plan's mix is not the replayed requests' (further apart
    than policy.demand_change_threshold): its capacity was rated for other requests than it
    served, which the attainment above then shows."""
    for index, (name, model) in enumerate(models.items()):
        mix = model.get("mix") or {}
        if not mix.get("differs"):
            continue
        planned, replayed = mix["planned"], mix["replayed"]
        console.print(
            f"note: {name} was planned for its {mix['planned_from']} mix, "
            f"{planned['input_tokens']:,} in / {planned['output_tokens']:,} out tokens a "
            f"request; the requests replayed average {replayed['input_tokens']:,} in / "
            f"{replayed['output_tokens']:,} out", highlight=False)
        if mix["planned_from"] == "declared":
            console.print(f"  set models[{index}].mix to that to plan for what it serves",
                          highlight=False)


def _print_scale_to_zero(zero: dict, wide: bool) -> None:
    """Per model scaled to zero: wakes, wake waits, held / refused, GPU-hours and cost against
    always-on."""
    def wait(w: dict) -> str:
        return "-" if w["p50"] is None else f"{w['p50']:.0f} / {w['p95']:.0f} / {w['max']:.0f}"

    rows = [[name, m["wakes"], wait(m["wake_wait_s"]), m["held"],
             m["refused_reject"] + m["refused_timeout"], f"{m['gpu_hours']:.2f}",
             f"{m['always_on_gpu_hours']:.2f}", f"{m['cost']:.2f}", f"{m['always_on_cost']:.2f}"]
            for name, m in zero["models"].items()]
    total = zero["total"]
    print_table([Column("model", "id"), Column("wakes", "num"),
                 Column("wake wait s p50/p95/max", "num"), Column("held", "num"),
                 Column("refused", "num"), Column("GPU-h", "num"),
                 Column("always-on GPU-h", "num"), Column("cost", "num"),
                 Column("always-on cost", "num")], rows,
                title=f"Scale to zero: {total['gpu_hours']:.2f} GPU-h and {total['cost']:.2f} "
                      f"cost against always-on {total['always_on_gpu_hours']:.2f} GPU-h and "
                      f"{total['always_on_cost']:.2f} (the same run with idle_after: never and "
                      "min_replicas: 1)", wide=wide)
