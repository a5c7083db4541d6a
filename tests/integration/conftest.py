"""Fixtures shared by the `serve` integration tests."""

from __future__ import annotations

import pytest

from harness import busy_cluster
from tests.support.serve_harness import cancel_deployment


@pytest.fixture
def env(slurm_cluster, monkeypatch):
    """The local cluster's environment, also set on this process: submitit runs sbatch with the
    daemon's (this process's) environment."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    return slurm_cluster


@pytest.fixture
def other_lab(env):
    """The local cluster made busy by another lab (harness/busy_cluster.py): its user and
    account made ready for the test, and every job of it cancelled after, whatever happened."""
    busy_cluster.ensure_other_user()
    yield
    busy_cluster.cancel_other()


@pytest.fixture
def cleanup(env):
    """Cancel every job of the deployments a test served, and stop a gateway a killed daemon
    left running (it lives in its own session by design), whatever happened."""
    deployments = []
    yield deployments.append
    for deployment in deployments:
        cancel_deployment(env, deployment)
