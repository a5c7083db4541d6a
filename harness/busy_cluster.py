"""The local cluster made busy by another lab: jobs of a second Linux user, ``coral-other``, in
its own account ``other-lab`` (``scripts/dev-cluster other-user`` creates both), that hold GPUs
for a set time. Used by the busy-cluster integration tests and ``bench/queue.py``.

Every job is a real Slurm job of that user (``runuser -u coral-other -- sbatch``), time-limited,
so Slurm's backfill scheduler knows when each ends and can estimate when ours start.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from coral_hpc.slurm.parse_nodes import parse_nodes_text

OTHER_USER = "coral-other"
ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return dict(os.environ)


def ensure_other_user() -> None:
    """Create the other lab's user, account and association if missing (idempotent, no
    restart of the shared cluster)."""
    subprocess.run([str(ROOT / "scripts" / "dev-cluster"), "other-user"], check=True,
                   env=_env(), capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class GpuNode:
    name: str
    gpu_type: str
    gpus: int
    partition: str  # the node's own partition (not the overlapping "gpu" one)
    free: int = 0  # GPUs no job holds right now


def gpu_nodes() -> list[GpuNode]:
    """The cluster's GPU nodes with their own (first non-default) partition."""
    out = subprocess.run(["scontrol", "show", "node", "-o"], check=True, capture_output=True,
                         text=True, env=_env(), timeout=30).stdout
    nodes = []
    for raw in parse_nodes_text(out):
        if raw.gpus_total and raw.gpu_type:
            own = [p for p in raw.partitions if p != "gpu"] or list(raw.partitions)
            nodes.append(GpuNode(raw.name, raw.gpu_type, raw.gpus_total, own[0],
                                 max(0, raw.gpus_total - raw.gpus_alloc)))
    return nodes


def hold(node: GpuNode, seconds: float, gpus: int | None = None, name: str = "other-lab") -> str:
    """Submit, as the other user, a job holding ``gpus`` (default all) GPUs of ``node`` for
    ``seconds``; returns its job id. Its time limit is the whole minute above ``seconds``, so
    the scheduler's estimate of when it ends is close to when it does."""
    gpus = node.gpus if gpus is None else gpus
    minutes = max(1, math.ceil(seconds / 60.0))
    argv = ["runuser", "-u", OTHER_USER, "--", "sbatch", "--parsable", "--chdir=/tmp",
            "-o", "/dev/null", "-e", "/dev/null", "-J", name, "-A", "other-lab",
            "-p", node.partition, "-w", node.name, f"--gres=gpu:{node.gpu_type}:{gpus}",
            "-N", "1", "-n", "1", "--cpus-per-task=1", "--mem=1G", f"--time={minutes}",
            f"--wrap=sleep {int(seconds)}"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=_env(), timeout=30)
    return out.stdout.strip().split(";")[0]


def fill_every_gpu(seconds: float | Mapping[str, float],
                   nodes: Iterable[GpuNode] | None = None) -> dict[str, str]:
    """Hold every GPU no job holds yet on every node (``seconds`` per node name, or one for
    all); node → job. GPUs another test holds stay theirs: the cluster is shared."""
    jobs = {}
    for node in nodes if nodes is not None else gpu_nodes():
        hold_s = seconds[node.name] if isinstance(seconds, Mapping) else seconds
        if node.free:
            jobs[node.name] = hold(node, hold_s, gpus=node.free)
    return jobs


def other_jobs() -> list[tuple[str, str, str]]:
    """(job id, state, node list) of the other user's live jobs."""
    out = subprocess.run(["squeue", "-h", "-u", OTHER_USER, "-o", "%i|%T|%N"], check=True,
                         capture_output=True, text=True, env=_env(), timeout=30).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def other_jobs_running(job_ids: Iterable[str]) -> list[tuple[str, str, str]] | None:
    """The other user's jobs ``job_ids`` once every one of them is RUNNING (holding its GPUs),
    else None: listed is not enough, a PENDING job holds nothing yet."""
    wanted = set(job_ids)
    jobs = [j for j in other_jobs() if j[0] in wanted]
    return jobs if len(jobs) == len(wanted) and all(s == "RUNNING" for _, s, _ in jobs) else None


def cancel_other() -> None:
    """Cancel every job of the other user."""
    subprocess.run(["scancel", "-u", OTHER_USER], check=False, capture_output=True, env=_env(),
                   timeout=30)
