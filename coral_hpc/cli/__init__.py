"""The ``coral-hpc`` command line: parse, call the library, format (rich tables or ``--json``).

Each subcommand lives in its own module and is imported only when it runs, so ``coral-hpc
validate`` never pays for Pyomo or aiohttp. Add a command by adding a line to ``COMMANDS``.
"""

from __future__ import annotations

import importlib
import sys

import click

from coral_hpc import __version__

#: command name -> (module, attribute, one-line help). Help is kept here so ``--help`` stays fast.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("coral_hpc.cli.validate", "validate", "Check a models.yaml; print a summary or every error."),
    "cost": ("coral_hpc.cli.cost", "cost", "What the deployment cost per model, partition, GPU type, day and token (sacct)."),
    "report": ("coral_hpc.cli.report", "report", "Write an HTML cost report with plots and the allocation over time."),
    "cluster": ("coral_hpc.cli.cluster", "cluster", "Partitions x GPU type: total, free, unavailable GPUs; --json snapshot."),
    "gateway": ("coral_hpc.cli.gateway", "gateway", "Run the OpenAI-compatible gateway alone."),
    "status": ("coral_hpc.cli.status", "status", "What the daemon serves: models, replicas, plan vs actual, events."),
    "logs": ("coral_hpc.cli.logs", "logs", "Print the log files of one replica."),
    "serve": ("coral_hpc.cli.serve", "serve", "Run the daemon: plan, submit and replace replicas, route requests (SIGTERM leaves them running)."),
    "down": ("coral_hpc.cli.down", "down", "Stop the daemon, drain and cancel every replica of the deployment."),
    "plan": ("coral_hpc.cli.plan", "plan", "What Coral would run now: replicas, layouts, cost, served vs demand (submits nothing)."),
    "profile": ("coral_hpc.cli.profile", "profile", "Measure the real engine in Slurm jobs per partition; write measured profiles."),
    "keys": ("coral_hpc.cli.gateway", "keys", "Add, list or remove gateway API keys (hashed file)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attribute, _ = COMMANDS[name]
        return getattr(importlib.import_module(module_name), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="coral-hpc")
def cli() -> None:
    """Serve many LLMs on a shared Slurm GPU cluster at least cost."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="coral-hpc")
