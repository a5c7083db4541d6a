"""``coral-hpc down FILE``: stop the daemon and its gateway, then drain and cancel every replica
of the deployment instance (tagged jobs the database does not know included; never another
instance's jobs of the same deployment name). Works from any login node: the daemon is found by
its lease in the shared state folder and asked to stop by SIGTERM on its own host, or by a stop
request file from any other."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from coral_hpc.cli._output import EXIT_UNAVAILABLE, console, fail, print_json
from coral_hpc.config import Deployment, load_deployment
from coral_hpc.errors import ConfigError, PermanentError, TransientError

if TYPE_CHECKING:
    from coral_hpc.slurm import SlurmClient


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--grace", type=float, default=60.0, show_default=True,
              help="Seconds each replica gets to drain after SIGTERM before it is cancelled.")
@click.option("--json", "as_json", is_flag=True, help="Print what was stopped as JSON.")
def down(file: str, grace: float, as_json: bool) -> None:
    """Stop serving FILE: stop the daemon, drain and cancel its replicas."""
    from coral_hpc.daemon.process import stop_recorded_gateway
    from coral_hpc.launch.stop import stop_replicas
    from coral_hpc.slurm import client_for_deployment

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s); nothing was stopped"])
    # 1. the daemon first, wherever it runs (its lease names it), or it would replace what we
    # cancel
    _stop_leaseholder(deployment)
    _stop_local_daemon(deployment)
    # a gateway left running by a daemon killed with -9 goes too
    stopped_gateway = stop_recorded_gateway(deployment)
    if stopped_gateway is not None and not as_json:
        console.print(f"{deployment.deployment}: stopped the gateway (pid {stopped_gateway})")
    # 2. every job carrying this deployment's tag, known to the database or not
    client = client_for_deployment(deployment)
    job_ids = _own_live_jobs(deployment, client)
    if not Path(deployment.db_path).exists():
        # the daemon's database is on another host: Slurm is the record here
        outcome = stop_replicas(client, job_ids, grace) if job_ids else {}
    else:
        outcome = _stop_and_book(deployment, client, job_ids, grace)
    _report(deployment, job_ids, outcome, as_json)


def _stop_local_daemon(deployment: Deployment) -> None:
    """SIGTERM the daemon holding this host's lock and wait up to 60 s for it to let go."""
    from coral_hpc.daemon.process import info_path, lock_is_held, lock_path, read_info

    if not lock_is_held(lock_path(deployment)):
        return
    info = read_info(info_path(deployment)) or {}
    pid = info.get("pid")
    if not pid:
        fail(f"a daemon holds {lock_path(deployment)} but its pid is unknown; stop it first")
    os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + 60
    while lock_is_held(lock_path(deployment)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if lock_is_held(lock_path(deployment)):
        fail(f"the daemon (pid {pid}) did not stop within 60 s; nothing was cancelled")


def _own_live_jobs(deployment: Deployment, client: SlurmClient) -> list[str]:
    """Live jobs of this instance of the deployment, and its jobs from before instance tags
    (their spec.json says so), as Slurm lists them now; exits when Slurm cannot say."""
    from coral_hpc.instance import read_instance
    from coral_hpc.launch.spec import is_pre_instance_job_of

    try:
        snapshot = client.snapshot(deployment.deployment)
    except TransientError as exc:
        fail(f"Slurm cannot be reached: {exc}; nothing was cancelled", status=EXIT_UNAVAILABLE)
    except PermanentError as exc:
        fail(f"Slurm: {exc}; nothing was cancelled")
    try:
        instance = read_instance(deployment.state_path) or ""
    except PermanentError as exc:
        fail(f"{exc}; nothing was cancelled")
    return [j.job_id for j in snapshot.jobs
            if j.end_kind is None and j.tag is not None and (
                j.tag.instance == instance or is_pre_instance_job_of(
                    j.tag, deployment.state_path, deployment.deployment))]


def _stop_and_book(deployment: Deployment, client: SlurmClient, job_ids: list[str],
                   grace: float) -> dict[str, str]:
    """Mark every live replica draining, stop the jobs, and book how each ended."""
    from coral_hpc.launch.stop import stop_replicas
    from coral_hpc.store import open_store

    store = open_store(deployment.db_path)
    try:
        now = time.time()
        for record in store.replicas(live_only=True):
            store.update_replica(record.id, drain_requested_at=record.drain_requested_at or now,
                                 cancelled_at=now)
        outcome = stop_replicas(client, job_ids, grace) if job_ids else {}
        ended = time.time()
        for record in store.replicas(live_only=True):
            store.update_replica(record.id, ended_at=ended,
                                 end_state="CANCELLED" if record.job_id in outcome else "GONE")
        store.add_event(ended, "down", f"coral-hpc down: {len(job_ids)} job(s) stopped")
    finally:
        store.close()
    return outcome


def _report(deployment, job_ids: list[str], outcome: dict, as_json: bool) -> None:
    if as_json:
        print_json({"deployment": deployment.deployment, "jobs": outcome})
        return
    if not job_ids:
        console.print(f"{deployment.deployment}: no replica jobs to stop")
    for job_id, how in outcome.items():
        console.print(f"job {job_id}: {how}")


def _stop_leaseholder(deployment, timeout_s: float = 60.0) -> None:
    """Stop the daemon holding the lease, wherever it runs; wait until it let go."""
    import socket

    from coral_hpc.daemon.lease import holder
    from coral_hpc.daemon.stop_request import request_stop

    live = holder(deployment.state_path)
    if live is None:
        return
    if live.get("host") == socket.gethostname():
        try:
            os.kill(int(live["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            return
    else:
        request_stop(deployment.state_path, "coral-hpc down")
    deadline = time.monotonic() + timeout_s
    while holder(deployment.state_path) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    if holder(deployment.state_path) is not None:
        fail(f"the daemon on {live.get('host')} (pid {live.get('pid')}) did not stop within "
             f"{timeout_s:.0f} s; nothing was cancelled")
