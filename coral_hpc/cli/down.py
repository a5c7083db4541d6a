"""``coral-hpc down FILE``: stop the daemon and its gateway, then drain and cancel every replica
of the deployment (tagged jobs the database does not know included)."""

from __future__ import annotations

import os
import signal
import time

import click

from coral_hpc.cli._output import EXIT_UNAVAILABLE, console, fail, print_json
from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError, PermanentError, TransientError


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--grace", type=float, default=60.0, show_default=True,
              help="Seconds each replica gets to drain after SIGTERM before it is cancelled.")
@click.option("--json", "as_json", is_flag=True, help="Print what was stopped as JSON.")
def down(file: str, grace: float, as_json: bool) -> None:
    """Stop serving FILE: stop the daemon, drain and cancel its replicas."""
    from coral_hpc.daemon.process import info_path, lock_is_held, lock_path, read_info
    from coral_hpc.launch.stop import stop_replicas
    from coral_hpc.slurm import client_for_deployment
    from coral_hpc.store import open_store

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s); nothing was stopped"])
    # 0. from the wrong login node, cancelling would only make that host's daemon resubmit
    from coral_hpc.cli._output import EXIT_CONFLICT
    from coral_hpc.daemon.claim import served_elsewhere

    other = served_elsewhere(deployment.state_path)
    if other is not None:
        fail(f"{file}: the daemon serving {deployment.deployment} runs on {other['host']} "
             f"(pid {other['pid']}, heartbeat {other['age_s']:.0f} s ago); run `coral-hpc down` "
             "there; nothing was stopped", status=EXIT_CONFLICT)
    # 1. the daemon first, or it would replace what we cancel
    if lock_is_held(lock_path(deployment)):
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
    # 2. every job carrying this deployment's tag, known to the database or not
    client = client_for_deployment(deployment)
    try:
        snapshot = client.snapshot(deployment.deployment)
    except TransientError as exc:
        fail(f"Slurm cannot be reached: {exc}; nothing was cancelled", status=EXIT_UNAVAILABLE)
    except PermanentError as exc:
        fail(f"Slurm: {exc}; nothing was cancelled")
    job_ids = [j.job_id for j in snapshot.jobs if j.end_kind is None]
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
    if as_json:
        print_json({"deployment": deployment.deployment, "jobs": outcome})
        return
    if not job_ids:
        console.print(f"{deployment.deployment}: no replica jobs to stop")
    for job_id, how in outcome.items():
        console.print(f"job {job_id}: {how}")
