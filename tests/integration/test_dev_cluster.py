"""The local cluster itself behaves like a real heterogeneous GPU cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

PARTITION_GPUS = {"v100": ("v100", 4), "a100": ("a100", 4), "a100-80g": ("a100-80g", 8)}


def _job_state(slurm, job_id: str) -> str:
    out = slurm.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()
    if out:
        return out
    acct = slurm.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", "-S", "now-1day")
    return acct.stdout.strip().split("\n")[0]


@pytest.mark.parametrize("partition", sorted(PARTITION_GPUS))
def test_gpu_job_sees_its_typed_gpus(slurm, tmp_path: Path, partition: str):
    gpu_type, _ = PARTITION_GPUS[partition]
    out = tmp_path / "out.txt"
    job = slurm.sbatch(
        "-p", partition, f"--gres=gpu:{gpu_type}:2", "-t", "2", "-o", str(out),
        "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES NODE=$SLURMD_NODENAME",
    )
    wait_until(lambda: _job_state(slurm, job) == "COMPLETED", 30, f"job {job} COMPLETED")
    text = wait_until(lambda: out.exists() and out.read_text(), 10, "job output")
    match = re.search(r"CVD=(\S+) NODE=(\S+)", text)
    assert match, text
    assert len(match.group(1).split(",")) == 2
    assert match.group(2).startswith(partition + "-") or match.group(2).startswith(gpu_type)


def test_wrong_gpu_type_is_refused(slurm):
    result = slurm.run("sbatch", "-p", "v100", "--gres=gpu:a100:1", "--wrap", "true", check=False)
    assert result.returncode != 0
    assert "Requested node configuration is not available" in result.stderr


def test_drain_and_resume_are_visible(slurm, node_restorer):
    node_restorer.drain_node("v100-02", "coral-test-drain")
    state = slurm.run("sinfo", "-h", "-n", "v100-02", "-o", "%t").stdout.split()[0]
    assert state.startswith("drain")
    reason = slurm.run("sinfo", "-h", "-R", "-n", "v100-02", "-o", "%E").stdout
    assert "coral-test-drain" in reason
    slurm.run("scontrol", "update", "NodeName=v100-02", "State=RESUME")
    wait_until(
        lambda: slurm.run("sinfo", "-h", "-n", "v100-02", "-o", "%t").stdout.split()[0] == "idle",
        10, "v100-02 idle after resume",
    )


def test_sacct_records_typed_gpu_tres(slurm):
    job = slurm.sbatch("-p", "a100-80g", "--gres=gpu:a100-80g:3", "-t", "1", "--wrap", "true")
    wait_until(lambda: _job_state(slurm, job) == "COMPLETED", 30, f"job {job} COMPLETED")

    def alloc_tres() -> str:
        out = slurm.run(
            "sacct", "-n", "-X", "-P", "-j", job, "-o", "AllocTRES", "-S", "now-1day", check=False
        )
        return out.stdout.strip()

    tres = wait_until(alloc_tres, 20, f"sacct AllocTRES for {job}")
    assert "gres/gpu:a100-80g=3" in tres
    assert "billing=" in tres


def test_overlapping_partition_counts_nodes_once(slurm):
    out = slurm.run("scontrol", "show", "partition", "gpu", "-o").stdout
    assert "gres/gpu=24" in out  # 2×4 v100 + 2×4 a100 + 1×8 a100-80g, each node once
