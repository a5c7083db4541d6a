"""What a replica job asks Slurm for per GPU: CPUs and memory. One function, :func:`replica_shape`,
gives the numbers the launch code writes into sbatch (``--cpus-per-task``, ``--mem``) and the
numbers the planner packs nodes and prices billing with, so a planned stage can start where the
plan puts it.

``cluster.cpus_per_gpu`` / ``cluster.mem_per_gpu_gb`` in models.yaml win. When models.yaml sets
one of them not, the partition's own defaults decide, as Slurm would apply them to a job that asks
nothing: JobDefaults ``DefCpuPerGPU``; ``DefMemPerGPU``, else ``DefMemPerCPU`` × CPUs per GPU.
Where the site sets none either, the configured defaults (4 CPUs, 32 GB) hold. The job still asks
the resolved numbers explicitly: what Slurm gives is then what was planned, whatever else the site
defaults (DefMemPerNode=UNLIMITED would hand a job that asks nothing the whole node's memory).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from coral_hpc.config import ClusterConfig
from coral_hpc.slurm.snapshot import PartitionInfo


@dataclass(frozen=True)
class ReplicaShape:
    """CPUs and memory (whole GB) a replica job asks per GPU."""

    cpus_per_gpu: int
    mem_per_gpu_gb: int


def replica_shape(cluster: ClusterConfig, partitions: Iterable[PartitionInfo] = ()) -> ReplicaShape:
    """The per-GPU shape of a replica job whose stages run in ``partitions`` (see the module
    docstring). Over several partitions the largest default of each resource holds, so one
    shape serves a deployment's every stage, and no stage is planned with less than it asks."""
    given = cluster.model_fields_set
    parts = tuple(partitions)
    cpus = cluster.cpus_per_gpu
    if "cpus_per_gpu" not in given:
        site = [p.def_cpu_per_gpu for p in parts if p.def_cpu_per_gpu]
        cpus = max(site) if site else cpus
    mem = cluster.mem_per_gpu_gb
    if "mem_per_gpu_gb" not in given:
        site_mb = []
        for p in parts:
            if p.def_mem_per_gpu_mb:
                site_mb.append(p.def_mem_per_gpu_mb)
            elif p.def_mem_per_cpu_mb:
                site_mb.append(p.def_mem_per_cpu_mb * cpus)
        mem = math.ceil(max(site_mb) / 1024) if site_mb else mem
    return ReplicaShape(cpus, mem)
