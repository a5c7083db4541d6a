"""The pyslurm backend gives the same snapshot as the CLI backend on the same cluster: idle, with
tagged jobs holding GPUs, after node drains, with a partition drained, down or inactive; an
unreachable controller is a typed transient error; ``make_client`` picks pyslurm only when it fits.

Runs only where pyslurm imports and matches the cluster's Slurm major version (PyPI has no
pyslurm for Slurm 22.05: build it from pyslurm's v22.5.3 tag into a separate venv to run this);
elsewhere every test skips with the reason."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coral_hpc.slurm import (
    BackendUnavailable,
    CliSlurmClient,
    ClusterSnapshot,
    CommandRunner,
    make_client,
)
from coral_hpc.types import JobTag
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def clients(slurm):
    """(CLI client, pyslurm client) over one CLI client; skips with the reason when pyslurm
    cannot be used here."""
    from coral_hpc.slurm.pyslurm_backend import PyslurmClient, pyslurm_unusable_reason

    cli = CliSlurmClient(CommandRunner(env=slurm.env, timeout_s=60))
    reason = pyslurm_unusable_reason(cli.version, slurm.env)
    if reason:
        pytest.skip(f"pyslurm backend not usable here: {reason}")
    return cli, PyslurmClient(cli)


def comparable(snap: ClusterSnapshot) -> ClusterSnapshot:
    """The snapshot without what differs by construction: the read time, the backend name, and
    jobs' TimeLeft (both backends read jobs through the same squeue; it ticks every second)."""
    jobs = tuple(dataclasses.replace(j, time_left_s=None) for j in snap.jobs)
    return dataclasses.replace(snap, observed_at=0.0, backend="", jobs=jobs)


def same_moment(cli, py, deployment: str) -> tuple[ClusterSnapshot, ClusterSnapshot]:
    """A CLI snapshot and a pyslurm snapshot of one cluster state: CLI, pyslurm, CLI again,
    retried until the two CLI readings agree (other sessions' jobs move the shared cluster)."""
    for _ in range(20):
        before, ours, after = cli.snapshot(deployment), py.snapshot(deployment), cli.snapshot(deployment)
        if comparable(before) == comparable(after):
            return before, ours
        time.sleep(0.3)
    raise AssertionError("the cluster kept changing; could not take a stable reading")


def assert_same(a: ClusterSnapshot, b: ClusterSnapshot) -> None:
    """Equal snapshots; on failure, name the first differing node / partition / group / job."""
    a, b = comparable(a), comparable(b)
    for field in ("nodes", "partitions", "node_groups", "jobs"):
        for x, y in zip(getattr(a, field), getattr(b, field)):
            assert x == y, f"{field} differ:\n cli     {x}\n pyslurm {y}"
        assert len(getattr(a, field)) == len(getattr(b, field)), field
    assert a == b


def _running(slurm, job: str) -> bool:
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING"


def _submit_tagged(slurm, tag: JobTag, *args: str) -> str:
    return slurm.sbatch(*args, "-t", "5", "--no-requeue", "-J", tag.job_name(),
                        f"--comment={tag.comment()}", "--wrap=sleep 300")


def test_backends_agree_on_the_cluster_as_it_is(clients):
    cli, py = clients
    a, b = same_moment(cli, py, "itest")
    assert b.backend == "pyslurm" and a.backend == "cli"
    assert_same(a, b)
    assert len(b.nodes) >= 5 and {"v100", "a100", "a100-80g", "gpu"} <= {p.name for p in b.partitions}


def test_backends_agree_with_tagged_jobs_holding_gpus(clients, slurm):
    cli, py = clients
    dep = f"pyitest{os.getpid()}"
    # all in the default partition: other sessions drain the typed partitions in their tests
    wanted = {  # job → (GPU type, GPUs)
        _submit_tagged(slurm, JobTag(dep, "m", "r1", "v100x1"), "-p", "gpu", "--gres=gpu:v100:1"): ("v100", 1),
        _submit_tagged(slurm, JobTag(dep, "m", "r2", "a100x2"), "-p", "gpu", "--gres=gpu:a100:2"): ("a100", 2),
        _submit_tagged(slurm, JobTag(dep, "m", "r3", "g80x3"), "-p", "gpu", "--gres=gpu:a100-80g:3"): ("a100-80g", 3),
    }
    untagged = slurm.sbatch("-p", "gpu", "--gres=gpu:v100:1", "-t", "5", "-J", "not-coral", "--wrap=sleep 300")
    for job in [*wanted, untagged]:
        wait_until(lambda job=job: _running(slurm, job), 60, f"job {job} RUNNING")
    a, b = same_moment(cli, py, dep)
    assert_same(a, b)
    # the agreement is about a cluster with our jobs on it, read through pyslurm
    assert {j.job_id for j in b.jobs} == set(wanted)
    for job in b.jobs:
        gpu_type, gpus = wanted[job.job_id]
        assert (job.state, job.gpu_type, job.gpus) == ("RUNNING", gpu_type, gpus)
        node = b.node(job.nodes[0])
        assert node.gpu_type == gpu_type and node.gpus_alloc >= gpus
        assert node.gpus_free == node.gpus_total - node.gpus_alloc


def test_backends_agree_after_node_drains(clients, slurm, node_restorer):
    cli, py = clients
    job = slurm.sbatch("-p", "gpu", "-w", "v100-01", "--gres=gpu:v100:1", "-t", "5", "--wrap=sleep 300")
    wait_until(lambda: _running(slurm, job), 30, f"job {job} RUNNING")
    node_restorer.drain_node("v100-01", "coral-pyitest draining")
    node_restorer.drain_node("v100-02", "coral-pyitest drained")
    a, b = same_moment(cli, py, "itest")
    assert_same(a, b)
    busy = b.node("v100-01")
    assert busy.state == "draining" and busy.gpus_free == 0 and busy.gpus_alloc >= 1
    assert busy.reason.startswith("coral-pyitest draining [")  # scontrol adds [user@time]
    other = b.node("v100-02")
    assert other.state in ("drained", "draining") and other.gpus_free == 0


@pytest.mark.parametrize("state, expected", [("DRAIN", "drain"), ("DOWN", "down"), ("INACTIVE", "inactive")])
def test_backends_agree_on_partition_states(clients, node_restorer, state, expected):
    cli, py = clients
    node_restorer.set_partition("a100-80g", state)
    a, b = same_moment(cli, py, "itest")
    assert_same(a, b)
    assert b.partition("a100-80g").state == expected


def test_make_client_picks_pyslurm_only_when_it_reads_the_same_cluster(clients, slurm, tmp_path):
    assert make_client("auto", env=slurm.env).backend == "pyslurm"
    # commands pointed at another slurm.conf than the one pyslurm loaded: not the same cluster
    other = tmp_path / "slurm.conf"
    other.write_text(Path(slurm.env["SLURM_CONF"]).read_text())
    env = {**slurm.env, "SLURM_CONF": str(other)}
    assert make_client("auto", env=env).backend == "cli"
    with pytest.raises(BackendUnavailable, match=re.escape(str(other))):
        make_client("pyslurm", env=env)


_UNREACHABLE = """
import sys
from coral_hpc.slurm import CliSlurmClient, CommandRunner, SlurmUnavailable
from coral_hpc.slurm.pyslurm_backend import PyslurmClient
cli = CliSlurmClient(CommandRunner(attempts=1))
cli._version = "22.05.8"  # sinfo --version asks no controller; skip it to keep the test short
try:
    PyslurmClient(cli).snapshot("any")
except SlurmUnavailable as exc:
    print("transient:", exc)
    sys.exit(0)
sys.exit("no SlurmUnavailable")
"""


def test_unreachable_controller_is_a_transient_error(clients, slurm, tmp_path):
    # libslurm reads slurm.conf once, at import: a fresh process with a conf whose controller
    # port is closed
    conf = Path(slurm.env["SLURM_CONF"])
    (tmp_path / "slurm.conf").write_text(
        re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1", conf.read_text())
    )
    (tmp_path / "gres.conf").write_text((conf.parent / "gres.conf").read_text())
    proc = subprocess.run(
        [sys.executable, "-c", _UNREACHABLE], check=False, capture_output=True, text=True, timeout=120,
        env={**slurm.env, "SLURM_CONF": str(tmp_path / "slurm.conf")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "transient: pyslurm node.get" in proc.stdout
