"""``coral-hpc serve FILE``: run the daemon in the foreground until SIGTERM/SIGINT.

SIGTERM stops the daemon and its gateway and leaves replicas running (a restart adopts them);
``coral-hpc down FILE`` drains and cancels them. SIGHUP reloads FILE. The daemon's pid, gateway
and metrics addresses are written beside the database (``coral-hpc status`` and ``down`` read
them).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from coral_hpc.cli._logging import configure_logging
from coral_hpc.cli._output import EXIT_UNAVAILABLE, Stage1Progress, fail
from coral_hpc.cli.validate import checked_deployment
from coral_hpc.config import Deployment
from coral_hpc.errors import ConfigError, PermanentError


def _listen(option: str, value: str) -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        fail(f"{option} {value!r}: expected host:port such as 127.0.0.1:8000 (port 0 = any free)")
    return value


def _check_access(file: str, deployment: Deployment, listen: str | None,
                  metrics: str | None) -> None:
    """Before anything starts: the gateway and the daemon's metrics ask for a key on every
    address, or the file opts out on loopback (``gateway.open_on_loopback``); exit 2 naming the
    field and the fix otherwise."""
    from coral_hpc.daemon.metrics_server import check_metrics_listen
    from coral_hpc.daemon.service import gateway_access_problem

    problem = gateway_access_problem(deployment, listen)
    if problem is None and metrics:
        try:
            check_metrics_listen(metrics.rpartition(":")[0].strip("[]"), deployment)
        except PermanentError as exc:
            problem = str(exc)
    if problem is not None:
        fail([f"{file}: {problem}", f"{file}: nothing was started"])


@click.command()
@click.argument("file")
@click.option("--listen", help="Gateway host:port, overriding gateway.listen (port 0 = any free "
                               "port; the bound one is in `coral-hpc status`).")
@click.option("--metrics", "metrics_listen", default="127.0.0.1:0", show_default=True,
              help="host:port of the daemon's own Prometheus metrics; 'off' to disable.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Stage-1 template cache [default: ~/.cache/coral-hpc/templates].")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-file", type=click.Path(dir_okay=False),
              help="Log here, rotated at retention.log_max_mb [default: stderr, e.g. the "
                   "systemd journal].")
def serve(file: str, listen: str | None, metrics_listen: str, cache_dir: str | None,
          log_level: str, log_file: str | None = None) -> None:
    """Serve every model of FILE at least cost until SIGTERM (replicas keep running)."""
    from coral_hpc.config import private_state_problems
    from coral_hpc.daemon import serve as run_daemon
    from coral_hpc.daemon.lease import LeaseHeld
    from coral_hpc.daemon.process import AlreadyRunning
    from coral_hpc.plan.planner import Planner

    # fail fast, before a lock, a gateway or a Slurm call: the same checks as `validate`, and
    # no state others could forge (a login node is multi-user)
    deployment = checked_deployment(file, "nothing was started")
    problems = private_state_problems(deployment)
    if problems:
        fail(problems + [f"{file}: {len(problems)} problem(s); nothing was started"])
    if listen is not None:
        _listen("--listen", listen)
    metrics = None if metrics_listen.lower() == "off" else _listen("--metrics", metrics_listen)
    _check_access(file, deployment, listen, metrics)
    # everything the daemon, its log, its gateway and submitit write is the service account's
    os.umask(0o077)
    configure_logging(log_level, log_file, deployment.retention)
    if deployment.gateway.api_keys_file is None:
        from coral_hpc.config.gateway import OPEN_WARNING

        logging.getLogger("coral_hpc.daemon").warning(OPEN_WARNING)
    # Stage 1 at start-up can take minutes: a bar on a terminal, a log line per model otherwise;
    # on a busy cluster the plan asks Slurm when each job shape would start (budgeted)
    planner = Planner(cache_dir=Path(cache_dir) if cache_dir else None,
                      progress=Stage1Progress(), probe=True)
    try:
        run_daemon(file, planner, gateway_listen=listen, metrics_listen=metrics)
    except (AlreadyRunning, LeaseHeld) as exc:  # a second daemon: exit 2, naming the first
        fail(f"{file}: {exc}")
    except ConfigError as exc:  # found once serving began: the first plan is infeasible
        fail(exc.problems)
    except PermanentError as exc:  # the gateway cannot start, Slurm refuses the backend
        fail(f"{file}: {exc}")
    except OSError as exc:  # the metrics port is taken
        fail(f"{file}: {exc}", status=EXIT_UNAVAILABLE)
