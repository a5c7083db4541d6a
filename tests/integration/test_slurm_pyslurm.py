"""The pyslurm backend gives the same snapshot as the CLI backend on the same cluster.

Runs only where pyslurm imports and matches the cluster's Slurm major version (PyPI has no
pyslurm for Slurm 22.05; build it from pyslurm's v22.5.x tag to run this)."""

from __future__ import annotations

import dataclasses

import pytest

from coral_hpc.slurm import CliSlurmClient, CommandRunner

pytestmark = pytest.mark.slurm


def test_pyslurm_and_cli_snapshots_agree(slurm):
    from coral_hpc.slurm.pyslurm_backend import PyslurmClient, pyslurm_unusable_reason

    cli = CliSlurmClient(CommandRunner(env=slurm.env))
    reason = pyslurm_unusable_reason(cli.version())
    if reason:
        pytest.skip(f"pyslurm backend not usable here: {reason}")
    py = PyslurmClient(cli)
    for _ in range(5):  # the shared cluster may move between the two reads
        a = cli.snapshot("itest")
        b = py.snapshot("itest")
        strip = {"observed_at": 0.0, "backend": ""}
        if dataclasses.replace(a, **strip) == dataclasses.replace(b, **strip):
            return
    assert dataclasses.replace(a, **strip) == dataclasses.replace(b, **strip)
