"""``coral-hpc validate FILE``."""

from __future__ import annotations

import click

from coral_hpc.cli._output import Column, console, fail, print_json, print_table, wide_option
from coral_hpc.config import Deployment, load_deployment
from coral_hpc.errors import ConfigError


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
                "architecture": m.architecture,
                "demand_rps": m.demand_rps if m.demand != "auto" else "auto",
                "ttft_s": m.slo.ttft_s,
                "tpot_s": m.slo.tpot_s,
                "priority": m.priority,
            }
            for m in deployment.models
        ],
    }


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@wide_option
def validate(file: str, as_json: bool, wide: bool) -> None:
    """Check FILE; print a summary, or every error with file, line and field (exit 2)."""
    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s); nothing was changed"])
    summary = deployment_summary(deployment)
    if as_json:
        print_json(summary)
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
            f"{model['ttft_s']:g} s",
            f"{model['tpot_s'] * 1000:g} ms",
            f"{model['priority']:g}",
        )
        for model in summary["models"]
    ]
    print_table([Column("model", "id"), Column("architecture", "id"),
                 Column("demand (req/s)", "num"), Column("TTFT SLO", "num"),
                 Column("TPOT SLO", "num"), Column("priority", "num")], rows, wide=wide)
    console.print("[green]valid[/]")
