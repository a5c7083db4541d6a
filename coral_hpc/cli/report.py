"""``coral-hpc report FILE [--since T] [--until T] [-o report.html]``: one self-contained HTML
page (plots embedded as base64 PNG) of what the deployment cost according to sacct, and its
allocation over time from the daemon's history. Range and errors as ``coral-hpc cost``."""

from __future__ import annotations

import click

from coral_hpc.cli._output import console, fail
from coral_hpc.cli.cost import TIME_FORMATS, build, read_inputs
from coral_hpc.errors import PermanentError


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--since", metavar="TIME",
              help=f"Range start (default: when the deployment started). TIME: {TIME_FORMATS}.")
@click.option("--until", metavar="TIME", help="Range end, exclusive (default: now); as --since.")
@click.option("-o", "--output", default="coral-report.html", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the HTML page.")
def report(file: str, since: str | None, until: str | None, output: str) -> None:
    """Write an HTML cost report of FILE's deployment: cost over time by model, GPU-hours by
    partition, replicas over time, cost per token, plans against Slurm's books."""
    from coral_hpc.accounting.report import write_html

    inputs = read_inputs(file, since, until)
    cost_report, replicas = build(inputs)
    try:
        path = write_html(cost_report, replicas, output)
    except (OSError, PermanentError) as exc:
        fail(f"--output {output}: {exc}")
    console.print(f"report written to {path}")
