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
    "simulate": ("coral_hpc.cli.simulate", "simulate", "Replay a trace in virtual time: cost, SLO attainment, GPU-hours, replicas over time (no Slurm with --snapshot)."),
    "plan": ("coral_hpc.cli.plan", "plan", "What Coral would run now: replicas, layouts, cost, served vs demand (submits nothing)."),
    "profile": ("coral_hpc.cli.profile", "profile", "Measure the real engine in Slurm jobs per partition; write measured profiles."),
    "keys": ("coral_hpc.cli.gateway", "keys", "Add, list or remove gateway API keys (hashed file)."),
    "stage": ("coral_hpc.cli.stage", "stage", "Download every model into the shared Hugging Face cache with one Slurm job."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attribute, _ = COMMANDS[name]
        command = getattr(importlib.import_module(module_name), attribute)
        _add_exit_statuses(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _add_exit_statuses(command: click.Command) -> None:
    """Every command's ``--help`` ends with the exit statuses (one list for all commands)."""
    from coral_hpc.cli._output import exit_status_epilog

    if not command.epilog:
        command.epilog = exit_status_epilog()
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_exit_statuses(sub)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Exit status: 0 done, 1 a bug to report, 2 invalid input or another daemon "
                    "already serving the deployment (nothing changed), 3 Slurm/accounting/port "
                    "unavailable (try again), 5 a profiled engine job failed (its log named). "
                    "Tables fold to the terminal's width; --wide keeps "
                    "one line per row.")
@click.version_option(__version__, prog_name="coral-hpc")
def cli() -> None:
    """Serve many LLMs on a shared Slurm GPU cluster at least cost."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="coral-hpc")
