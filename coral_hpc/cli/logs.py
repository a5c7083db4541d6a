"""``coral-hpc logs FILE REPLICA``: the log files of one replica (entrypoint, engine, Slurm)."""

from __future__ import annotations

from pathlib import Path

import click

from coral_hpc.cli._output import fail
from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError, PermanentError


def replica_logs(logs_dir: Path, replica_id: str, job_id: str | None) -> list[Path]:
    """Log files of a replica: ``<id>.<job>.rank*.log`` (entrypoint, engine) and Slurm's own
    output of its job (submitit's ``<job>_0_log.out``, the hetjob's ``<job>_hetjob.out``)."""
    found = set(logs_dir.glob(f"{replica_id}.*.log"))
    if job_id is None:
        # no database here (the daemon runs on another login node): REPLICA may be a job id
        job_id = replica_id
        found |= set(logs_dir.glob(f"*.{job_id}.rank*.log"))
    found |= set(logs_dir.glob(f"{job_id}_*.out")) | set(logs_dir.glob(f"{job_id}_*.err"))
    return sorted(found)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("replica")
@click.option("--tail", "-n", type=int, default=50, show_default=True,
              help="Lines per file (0 = whole files).")
def logs(file: str, replica: str, tail: int) -> None:
    """Print the logs of REPLICA (its id, or its Slurm job id) of FILE's deployment."""
    from coral_hpc.store import open_store

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s)"])
    job_id = None
    try:
        store = open_store(deployment.db_path, readonly=True)
    except PermanentError:
        store = None
    if store is not None:
        record = store.replica(replica) or store.replica_by_job(replica)
        store.close()
        if record is not None:
            replica, job_id = record.id, record.job_id
    logs_dir = deployment.state_path / "logs"
    files = replica_logs(logs_dir, replica, job_id)
    if not files:
        fail(f"no logs for replica {replica!r} under {logs_dir}")
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        shown = lines if tail <= 0 else lines[-tail:]
        click.echo(f"==> {path} <==")
        for line in shown:
            click.echo(line)
