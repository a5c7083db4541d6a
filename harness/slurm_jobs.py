"""What Slurm itself runs for a deployment, read independently of the daemon, and the clean-up
after a run whatever state it left (for the tests and the benches that drive a daemon)."""

from __future__ import annotations

from coral_hpc.config import Deployment
from coral_hpc.slurm import make_client


def tagged_jobs(env: dict, deployment: Deployment | str) -> list:
    """This deployment's jobs Slurm still runs or queues (ground truth, read independently)."""
    name = deployment if isinstance(deployment, str) else deployment.deployment
    snapshot = make_client("cli", env=env).snapshot(name)
    return [j for j in snapshot.jobs if j.end_kind is None]


def live_jobs(env: dict, deployment: Deployment | str) -> list[str]:
    """The ids of :func:`tagged_jobs`, sorted."""
    return sorted(j.job_id for j in tagged_jobs(env, deployment))


def cancel_deployment(env: dict, deployment: Deployment) -> None:
    """Stop a gateway a killed daemon left running (it lives in its own session by design) and
    cancel every job of ``deployment`` Slurm still runs or queues, whatever state the test left
    them in."""
    from coral_hpc.daemon.process import stop_recorded_gateway

    stop_recorded_gateway(deployment, timeout_s=5.0)
    ids = live_jobs(env, deployment)
    if ids:
        make_client("cli", env=env).cancel(ids)
