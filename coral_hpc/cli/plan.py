"""``coral-hpc plan models.yaml``: what Coral would run now — replicas per model, partition and
layout, cost per hour, served vs demanded, solve times — from a live Slurm snapshot or a saved one
(``--snapshot``, as written by ``coral-hpc cluster --json``). Submits nothing."""

from __future__ import annotations

import json
from pathlib import Path

import click

from coral_hpc.cli._output import (
    EXIT_INTERNAL,
    Column,
    console,
    err_console,
    fail,
    print_json,
    print_table,
    stage1_progress,
    wide_option,
)

#: exit status when the independent checker rejects the plan (a solver bug: report it)
EXIT_REJECTED = EXIT_INTERNAL


@click.command()
@click.argument("models_yaml", type=click.Path(dir_okay=False))
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False),
              help="Plan on a snapshot saved by `coral-hpc cluster --json` instead of asking "
                   "Slurm.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--export-templates", "export_file", type=click.Path(dir_okay=False),
              help="Write the Stage-1 template library (usage, throughput, price) as JSON here.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Stage-1 cache folder (default ~/.cache/coral-hpc/templates).")
@click.option("--save-snapshot", "save_file", type=click.Path(dir_okay=False),
              help="Write the snapshot planned on, with Slurm's start estimates, as JSON here.")
@click.option("--export-stage1-spec", "spec_file", type=click.Path(dir_okay=False),
              help="Write the Stage-1 work as a spec for `python -m coral_solver.stage1` (a "
                   "Slurm array job on CPU nodes, INSTALL.md) and stop: nothing is solved.")
@wide_option
def plan(models_yaml: str, snapshot_file: str | None, as_json: bool, export_file: str | None,
         cache_dir: str | None, save_file: str | None, spec_file: str | None,
         wide: bool) -> None:
    """Plan replicas for MODELS_YAML at least cost; print the plan (nothing is submitted)."""
    from coral_hpc.catalog_checks import model_facts
    from coral_hpc.cli._models import print_model_facts
    from coral_hpc.cli.cluster import load_snapshot_file, observe
    from coral_hpc.demand import plan_for_words
    from coral_hpc.plan.planner import PlanRequest
    from coral_hpc.plan.report import infeasible_problems, plan_json

    deployment = _load_deployment(models_yaml)
    snapshot = load_snapshot_file(snapshot_file) if snapshot_file else observe(models_yaml, None)
    unknown = _unknown_architectures(deployment)
    if unknown:
        known = ", ".join(sorted(_known_architectures()))
        fail([f"{models_yaml}: architecture(s) {unknown} not in profiles/models.yaml; "
              f"known: {known}"])
    # the same planner and request `serve` plans with at start on this snapshot
    request = PlanRequest.from_snapshot(deployment, snapshot)
    if spec_file:
        _write_stage1_spec(request, cache_dir, spec_file)
        return
    # live: ask Slurm when each job shape would start; on a saved snapshot, its saved estimates
    outcome = _solve(models_yaml, request, cache_dir, probe=not snapshot_file)
    _write_files(outcome, snapshot, save_file, export_file)
    facts = model_facts(deployment)
    if as_json:
        print_json({**plan_json(outcome, request.demand),
                    "plan_for": plan_for_words(deployment.policy), "model_facts": facts})
    else:
        print_model_facts(facts, wide)
        _print_table(outcome, wide, request.demand, plan_for_words(deployment.policy))
    if outcome.status == "infeasible":
        fail(infeasible_problems(models_yaml, deployment,
                                 shortfalls=outcome.solved.shortfalls if outcome.solved else ()))
    if outcome.problems:
        fail([f"checker: {p}" for p in outcome.problems], status=EXIT_REJECTED)


def _load_deployment(models_yaml: str, nothing_was: str = "planned"):
    """The deployment in ``models_yaml`` with what its models derive; exit 2 on a problem in
    the file or a measured profile it names that is missing (``nothing was <nothing_was>``)."""
    from coral_hpc.config import load_deployment, measured_profiles_problems
    from coral_hpc.errors import ConfigError
    from coral_hpc.model_archs import derived_deployment

    try:
        deployment = derived_deployment(load_deployment(models_yaml))
    except ConfigError as exc:
        fail(exc.problems + [f"{models_yaml}: {len(exc.problems)} problem(s)"])
    missing = measured_profiles_problems(deployment)
    if missing:
        fail(missing + [f"{models_yaml}: {len(missing)} problem(s); nothing was {nothing_was}"])
    return deployment


def _write_stage1_spec(request, cache_dir: str | None, spec_file: str) -> None:
    """Write the Stage-1 work of ``request`` as a spec for ``python -m coral_solver.stage1``."""
    from coral_hpc.plan.planner import Planner

    spec = Planner(cache_dir=Path(cache_dir) if cache_dir else None).stage1_spec(request)
    Path(spec_file).write_text(json.dumps(spec.to_json(), indent=1))
    console.print(f"Stage-1 spec for {len(spec.models)} model(s) written to {spec_file}",
                  highlight=False)


def _solve(models_yaml: str, request, cache_dir: str | None, probe: bool):
    """Plan ``request`` with Stage 1's progress shown; exit 2 when policy.solver names a solver
    this host lacks."""
    from coral_hpc.plan.planner import Planner, SolverUnavailable

    with stage1_progress() as progress:
        planner = Planner(cache_dir=Path(cache_dir) if cache_dir else None, progress=progress,
                          probe=probe)
        try:
            return planner.solve(request)
        except SolverUnavailable as exc:  # policy.solver names a solver this host lacks
            fail([f"{models_yaml}: {exc}", f"{models_yaml}: 1 problem(s); nothing was planned"])


def _write_files(outcome, snapshot, save_file: str | None, export_file: str | None) -> None:
    """``--save-snapshot`` (with Slurm's start estimates) and ``--export-templates``."""
    from coral_hpc.plan.report import templates_json

    if save_file and outcome.solved is not None:
        from dataclasses import replace

        Path(save_file).write_text(replace(snapshot, estimates=outcome.solved.estimates).to_json())
    if export_file:
        Path(export_file).write_text(json.dumps(templates_json(outcome), indent=1))


def _known_architectures() -> set[str]:
    from coral_solver.catalog import load_models

    return set(load_models())


def _unknown_architectures(deployment) -> list[str]:
    """Architecture keys of ``deployment``'s models the catalogue does not answer to (a model
    read from its config.json was registered when the file was loaded)."""
    from coral_solver.catalog import model_arch

    unknown = set()
    for model in deployment.models:
        try:
            model_arch(model.arch_key)
        except KeyError:
            unknown.add(model.arch_key)
    return sorted(unknown)


def _print_table(outcome, wide: bool = False, demand=None, plan_for: str = "mean") -> None:
    """The plan for people: its rows (columns every row shares become a sentence under the
    table), then demand against capacity and the solver's figures."""
    result = outcome.solved
    plan = result.plan
    unit = "billing/h" if result.unit == "billing" else "per h"
    priced = "Slurm billing units" if result.unit == "billing" else "the partitions' prices"
    rows = _plan_rows(result)
    columns = [Column("model", "id"), Column("role", "id"), Column("partition"),
               Column("layout [layers]"), Column("TP×PP", "id"), Column("count", "num"),
               Column("req/s each", "num"), Column("cost/h each", "num"), Column("figures"),
               Column("start")]
    # a column whose every row says the same is a sentence under the table, not a column:
    # what an 80-character terminal has room for
    same = {i: rows[0][i] for i in (1, 8, 9) if rows and len({r[i] for r in rows}) == 1}
    keep = [i for i in range(len(columns)) if i not in same]
    # the plan's cost counts the replicas that start within the horizon; queued ones cost
    # nothing until Slurm starts them, and the headline says so rather than leave them out
    queued_cost = sum(r.count * r.cost_per_hour for r in plan.queued)
    queued_count = sum(r.count for r in plan.queued)
    headline = f"Plan: {plan.status}, {plan.cost_per_hour:.2f} {unit} ({priced})"
    if plan.queued:
        headline += (f" without the {queued_count} queued replica(s); "
                     f"{plan.cost_per_hour + queued_cost:.2f} {unit} once they start")
    print_table([columns[i] for i in keep], [[r[i] for i in keep] for r in rows],
                title=headline, wide=wide)
    if 1 in same:
        console.print(f"role of every replica: {same[1]}", highlight=False)
    if 8 in same:
        console.print(f"throughput figures of every template: {same[8]}", highlight=False)
    if 9 in same:
        console.print(f"start of every replica: {same[9]}", highlight=False)
    _print_demand(result, demand or {}, plan_for, wide)


def _plan_rows(result) -> list[list]:
    """One table row per plan row, the replicas that start within the horizon first."""
    from coral_hpc.plan.availability import start_label
    from coral_hpc.plan.figures import figures_used

    plan = result.plan
    arch = {m.name: m.arch for m in result.models}
    rows = []
    for row, queued in [(r, False) for r in plan.rows] + [(r, True) for r in plan.queued]:
        t = row.template
        layout = " + ".join(f"{s.gpu_type}[{s.layers}]" for s in t.stages)
        if not t.calibrated:
            layout += " (uncalibrated)"
        rows.append([row.model, row.role, ", ".join(dict.fromkeys(row.partitions)), layout,
                     f"{t.tp}×{t.pp}", row.count, f"{row.throughput:.3g}",
                     f"{row.cost_per_hour:.3g}", figures_used(t, arch[row.model]),
                     start_label(row.wait_s, queued, row.start_known)])
    return rows


def _print_demand(result, demand, plan_for: str, wide: bool) -> None:
    """Demand, served and capacity per model; what was sized for; the solve's times, gap,
    binding constraints and warnings."""
    from coral_hpc.demand import planned_for_lines

    plan = result.plan
    served = [(m.name, _rate(demand, m.name, "requests_per_s"), _rate(demand, m.name, "sized"),
               f"{m.demand_rps:.3g}", f"{plan.served[m.name]:.3g}",
               f"{plan.capacity[m.name]:.3g}") for m in result.models]
    print_table([Column("model", "id"), Column("mean", "num"), Column("sized for", "num"),
                 Column("demand", "num"), Column("served", "num"), Column("capacity", "num")],
                served, title="Demand (req/s of each model's mix; demand = sized for × "
                              "(1 + headroom))", wide=wide)
    for line in planned_for_lines(plan_for, {n: d.basis for n, d in demand.items()}):
        console.print(line, highlight=False)
    gap = "unknown" if plan.gap == float("inf") else f"{plan.gap:.1e}"
    console.print(f"Stage 1 {result.stage1_s:.2f} s, Stage 2 {result.stage2_s:.2f} s "
                  f"({result.solver}), gap {gap}", highlight=False)
    for line in plan.binding:
        console.print(f"binding: {line}", highlight=False)
    for line in result.warnings:
        err_console.print(f"warning: {line}", highlight=False)


def _rate(demand, name: str, attribute: str) -> str:
    item = demand.get(name)
    return "-" if item is None else f"{getattr(item, attribute):.3g}"

