"""``coral-hpc validate FILE``."""

from __future__ import annotations

from typing import NoReturn

import click

from coral_hpc.catalog_checks import model_facts
from coral_hpc.cli._models import print_model_facts
from coral_hpc.cli._output import Column, console, fail, print_json, print_table, wide_option
from coral_hpc.config import (
    Deployment,
    host_path_problems,
    load_deployment,
    measured_profiles_problems,
)
from coral_hpc.errors import ConfigError
from coral_hpc.slurm.snapshot import ClusterSnapshot


def checked_deployment(file: str, outcome: str = "nothing was changed") -> Deployment:
    """Load FILE and run every check that needs no Slurm: the schema, the paths ``serve`` writes
    on this host, and the performance model's catalogue (architectures, GPU types, SLOs some
    layout can meet). On any problem print each (file, line, field, what is valid) and exit 2;
    ``outcome`` ends the message (what the refused command did not do)."""
    deployment, problems = _local_problems(file)
    if deployment is None or problems:
        fail(problems + [f"{file}: {len(problems)} problem(s); {outcome}"])
    return deployment


def _local_problems(file: str) -> tuple[Deployment | None, list[str]]:
    """FILE's deployment (None when it does not load) and the problems
    :func:`checked_deployment` refuses."""
    from coral_hpc.catalog_checks import catalog_problems
    from coral_hpc.model_archs import derive_models

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        return None, exc.problems
    underived = derive_models(deployment)  # each model's config.json, before the catalogue
    if underived:
        return deployment, host_path_problems(deployment) + underived
    return deployment, (host_path_problems(deployment) + catalog_problems(deployment)
                        + measured_profiles_problems(deployment))


def _refuse_json(file: str, problems: list[str]) -> NoReturn:
    """``validate --json`` with problems: a JSON document of them on stdout (scripts read it),
    the same lines on stderr as without --json, exit 2."""
    print_json({"file": file, "valid": False, "errors": problems, "warnings": []})
    fail(problems + [f"{file}: {len(problems)} problem(s); nothing was changed"])


def deployment_summary(deployment: Deployment) -> dict:
    """A short, JSON-ready summary of a valid deployment."""
    return {
        "deployment": deployment.deployment,
        "engine": deployment.engine.kind,
        "price_unit": deployment.cluster.price_unit,
        "partitions": [p.name for p in deployment.cluster.partitions],
        "gateway": deployment.gateway.listen,
        "models": [
            {
                "name": m.name,
                "architecture": m.arch_key,
                "demand_rps": m.demand_rps if m.demand != "auto" else "auto",
                "task": "embed" if m.embedding else "generate",
                "ttft_s": m.slo.ttft_s,
                "tpot_s": m.slo.tpot_s,
                "latency_ms": m.slo.latency_ms,
                "priority": m.priority,
            }
            for m in deployment.models
        ],
        "model_facts": model_facts(deployment),
    }


def site_snapshot(deployment: Deployment, snapshot_file: str | None) -> ClusterSnapshot | str:
    """The snapshot to check against (``--snapshot FILE``, else Slurm asked now), or the line
    saying why Slurm was not asked."""
    from coral_hpc.errors import CoralError

    try:
        if snapshot_file:
            from coral_hpc.cli.cluster import load_snapshot_file

            return load_snapshot_file(snapshot_file)
        from coral_hpc.slurm import client_for_deployment

        return client_for_deployment(deployment).snapshot(deployment.deployment)
    except (CoralError, OSError) as exc:
        return f"Slurm not asked ({exc}): partitions, GPU types and min_replicas not checked"


def site_warnings(deployment: Deployment, snapshot: ClusterSnapshot | str) -> list[str]:
    """What this Slurm cannot give the configuration (partitions it lacks or has down, MaxTime
    below the time limit, GPU types no node has, GRES names no catalogue type matches,
    reservations it cannot plan on), preemptible partitions and a preempted job QOS, and
    pipelines no engine environment allows. Slurm unreachable (``snapshot`` is the line
    saying so): that line."""
    from coral_hpc.plan import availability

    warnings = availability.environment_warnings(deployment)
    if isinstance(snapshot, str):
        return [*warnings, snapshot]
    from coral_hpc.plan.reservations import usable_reservations

    snapshot, typed = availability.type_untyped_nodes(deployment, snapshot)
    return [*warnings, *typed, *availability.config_warnings(deployment, snapshot),
            *usable_reservations(deployment, snapshot)[1],
            *availability.preemption_warnings(deployment, snapshot)]


def site_problems(file: str, deployment: Deployment, snapshot: ClusterSnapshot | str,
                  cache_dir: str | None = None) -> list[str]:
    """What ``plan`` and ``serve`` would refuse on this Slurm: ``min_replicas`` the whole
    cluster could never hold (:mod:`coral_hpc.plan.capacity`; Stage 1's library from the same
    cache ``plan`` uses), each naming the file, line and field."""
    if isinstance(snapshot, str):
        return []
    from pathlib import Path

    from coral_hpc.plan.planner import Planner, PlanRequest
    from coral_hpc.plan.report import infeasible_problems

    planner = Planner(cache_dir=Path(cache_dir) if cache_dir else None)
    shortfalls = planner.never_held(PlanRequest.from_snapshot(deployment, snapshot))
    return infeasible_problems(file, deployment, shortfalls=shortfalls)[:-1] if shortfalls else []


@click.command()
@click.argument("file")  # its type is checked by coral_hpc.config.source: FIFOs etc. never opened
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary, or the errors, as JSON (errors still exit 2).")
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False),
              help="Check against a snapshot saved by `coral-hpc cluster --json` instead of Slurm.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Stage-1 cache folder, as for `plan` (read for min_replicas checks).")
@wide_option
def validate(file: str, as_json: bool, snapshot_file: str | None, cache_dir: str | None,
             wide: bool) -> None:
    """Check FILE; print a summary, or every error with file, line and field (exit 2)."""
    deployment, problems = _local_problems(file)
    snapshot: ClusterSnapshot | str = ""
    if deployment is not None and not problems:
        snapshot = site_snapshot(deployment, snapshot_file)
        problems = site_problems(file, deployment, snapshot, cache_dir)
    if problems or deployment is None:
        if as_json:
            _refuse_json(file, problems)
        fail(problems + [f"{file}: {len(problems)} problem(s); nothing was changed"])
    summary = deployment_summary(deployment)
    from coral_hpc.config.gateway import access_warning

    access = access_warning(deployment.gateway)
    summary["warnings"] = [*([access] if access else []), *site_warnings(deployment, snapshot)]
    if as_json:
        print_json({"file": file, "valid": True, "errors": [], **summary})
        return
    console.print(
        f"[bold]{file}[/]: deployment [bold]{deployment.deployment}[/], engine "
        f"{deployment.engine.kind}, cost unit {deployment.cluster.price_unit}, partitions "
        f"{', '.join(summary['partitions'])}, gateway {deployment.gateway.listen}"
    )
    rows = [
        (
            model["name"],
            model["architecture"],
            model["demand_rps"] if model["demand_rps"] == "auto" else f"{model['demand_rps']:.3g}",
            # an embedding model has one latency per request and no tokens after it
            f"{model['ttft_s']:g} s" if model["ttft_s"] is not None
            else f"{model['latency_ms']:g} ms (embed)",
            f"{model['tpot_s'] * 1000:g} ms" if model["tpot_s"] is not None else "—",
            f"{model['priority']:g}",
        )
        for model in summary["models"]
    ]
    print_table([Column("model", "id"), Column("architecture", "id"),
                 Column("demand (req/s)", "num"), Column("TTFT SLO", "num"),
                 Column("TPOT SLO", "num"), Column("priority", "num")], rows, wide=wide)
    print_model_facts(summary["model_facts"], wide)
    for line in summary["warnings"]:
        console.print(f"[yellow]warning[/]: {line}", highlight=False)
    console.print("[green]valid[/]")
