"""The pyslurm backend: node data through the Slurm C API instead of a subprocess.

pyslurm must match the cluster's Slurm major version (PyPI has no build for Slurm 22.05; one
built from pyslurm's v22.5.x tag works). Only the node read goes through pyslurm — it is the
largest answer on a big cluster; partitions, jobs, limits, accounting and every action go
through the CLI client, so both backends share one parser for everything else and produce the
same snapshot.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from coral_hpc.slurm.build import build_snapshot
from coral_hpc.slurm.cli_backend import CliSlurmClient
from coral_hpc.slurm.errors import SlurmUnavailable
from coral_hpc.slurm.parse_jobs import version_tuple
from coral_hpc.slurm.parse_nodes import RawNode
from coral_hpc.slurm.snapshot import ClusterSnapshot

_GPU_KEY_RE = re.compile(r"^gpu(?::(.+))?$")


def pyslurm_unusable_reason(cluster_version: str | Callable[[], str]) -> str | None:
    """None when pyslurm imports and its major version (``22.5.3`` → 22.05) matches the
    cluster's; else why not. ``cluster_version`` may be a callable, asked only once pyslurm
    imports."""
    try:
        import pyslurm
    except ImportError as exc:
        return f"pyslurm does not import ({exc})"
    version = getattr(pyslurm, "__version__", "") or ""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        return f"pyslurm reports no version ({version!r})"
    ours = (int(match.group(1)), int(match.group(2)))
    if callable(cluster_version):
        cluster_version = cluster_version()
    theirs = version_tuple(cluster_version)
    if ours != theirs:
        return f"pyslurm {version} is built for Slurm {ours[0]}.{ours[1]:02d}, the cluster runs {cluster_version}"
    if not hasattr(pyslurm, "Nodes"):
        return f"pyslurm {version} lacks the pyslurm.Nodes API"
    return None


def _gres_gpus(gres: Any) -> tuple[str | None, int]:
    """pyslurm's GRES dict (``{"gpu:a100": 4}`` or ``{"gpu:a100": {"count": 4, ...}}``) → type, count."""
    total, first_type = 0, None
    for key, value in (gres or {}).items():
        match = _GPU_KEY_RE.match(str(key))
        if not match:
            continue
        count = value.get("count", 0) if isinstance(value, dict) else value
        total += int(count or 0)
        first_type = first_type or match.group(1)
    return first_type, total


def raw_nodes_from_pyslurm(nodes: Any) -> list[RawNode]:
    """pyslurm.Nodes → RawNode records (the same records the scontrol parsers produce)."""
    raws = []
    for node in nodes:
        gpu_type, gpus_total = _gres_gpus(node.configured_gres)
        raws.append(
            RawNode(
                name=node.name,
                state_words=tuple(w for w in str(node.state or "UNKNOWN").upper().split("+") if w),
                reason=node.reason or None,
                partitions=tuple(node.partitions or ()),
                gpu_type=gpu_type,
                gpus_total=gpus_total,
                gpus_alloc=_gres_gpus(node.allocated_gres)[1],
                cpus=int(node.total_cpus or 0),
                cpus_alloc=int(node.allocated_cpus or 0),
                mem_gb=int(node.real_memory or 0) / 1024,
                mem_alloc_gb=int(node.allocated_memory or 0) / 1024,
            )
        )
    return raws


class PyslurmClient:
    """A :class:`~coral_hpc.slurm.client.SlurmClient` reading nodes through pyslurm."""

    backend = "pyslurm"

    def __init__(self, cli: CliSlurmClient):
        self.cli = cli
        # everything but the node read is the CLI client's
        for name in ("version", "jobs", "limits", "job_states", "accounting", "test_only",
                     "submit_script", "cancel", "cancel_with_grace"):
            setattr(self, name, getattr(cli, name))

    def snapshot(self, deployment: str) -> ClusterSnapshot:
        import pyslurm

        from coral_hpc.slurm.parse_nodes import parse_partitions_json, parse_partitions_text

        version = self.cli.version()
        observed_at = self.cli.clock()
        started = time.perf_counter()
        try:
            nodes = pyslurm.Nodes.load()
        except Exception as exc:  # pyslurm raises RPCError for an unreachable controller
            raise SlurmUnavailable(f"pyslurm.Nodes.load: {exc}") from exc
        self.cli.runner.calls["pyslurm Nodes.load"] += 1
        self.cli.runner.slurm_seconds += time.perf_counter() - started
        runner = self.cli.runner
        if version_tuple(version) >= (23, 2):
            raw_parts = parse_partitions_json(runner.run(["scontrol", "show", "partition", "--json"]).stdout)
        else:
            raw_parts = parse_partitions_text(runner.run(["scontrol", "show", "partition", "-o"]).stdout)
        return build_snapshot(
            slurm_version=version,
            observed_at=observed_at,
            deployment=deployment,
            backend=self.backend,
            raw_nodes=raw_nodes_from_pyslurm(nodes),
            raw_partitions=raw_parts,
            jobs=self.cli.jobs(),
            limits=self.cli.limits(),
            gpu_memory=self.cli.gpu_memory,
        )
