"""Fixtures shared by the `serve` integration tests."""

from __future__ import annotations

import pytest

from coral_hpc.slurm import make_client


@pytest.fixture
def env(slurm_cluster, monkeypatch):
    """The local cluster's environment, also set on this process: submitit runs sbatch with the
    daemon's (this process's) environment."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    return slurm_cluster


@pytest.fixture
def cleanup(env):
    """Cancel every job of the deployments a test served, and stop a gateway a killed daemon
    left running (it lives in its own session by design), whatever happened."""
    from coral_hpc.daemon.process import stop_recorded_gateway

    deployments = []
    yield deployments.append
    client = make_client("cli", env=env)
    for deployment in deployments:
        stop_recorded_gateway(deployment, timeout_s=5.0)
        ids = [j.job_id for j in client.snapshot(deployment.deployment).jobs]
        if ids:
            client.cancel(ids)
