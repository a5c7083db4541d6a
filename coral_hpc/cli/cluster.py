"""``coral-hpc cluster``: what Slurm offers — partitions × GPU type, total / free / unavailable GPUs
and billing weights — or the whole snapshot as JSON (accepted back by ``--snapshot``)."""

from __future__ import annotations

from pathlib import Path

import click

from coral_hpc.cli._output import (
    EXIT_INTERNAL,
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    Column,
    console,
    fail,
    print_json,
    print_table,
    wide_option,
)
from coral_hpc.cli.timefmt import ago, local_time
from coral_hpc.errors import ConfigError, PermanentError, TransientError
from coral_hpc.slurm import ClusterSnapshot, client_for_deployment, make_client

#: exit status when Slurm refused or answered something unreadable
EXIT_SLURM_ERROR = EXIT_INTERNAL


def load_snapshot_file(path: str) -> ClusterSnapshot:
    """A snapshot saved from ``coral-hpc cluster --json``; exits 2 naming the file and the problem."""
    try:
        return ClusterSnapshot.from_json(Path(path).read_text())
    except OSError as exc:
        fail(f"{path}: cannot read the snapshot: {exc.strerror}")
    except ValueError as exc:
        fail(f"{path}: not a coral-hpc cluster snapshot: {exc}")


def job_shape(config: str | None) -> tuple[int, int]:
    """CPUs and GB of memory a replica job asks per GPU: the config's, or the defaults."""
    from coral_hpc.config import ClusterConfig, load_deployment

    if config:
        try:
            cluster_config = load_deployment(config).cluster
        except ConfigError as exc:
            fail(exc.problems + [f"{config}: {len(exc.problems)} problem(s)"])
        return cluster_config.cpus_per_gpu, cluster_config.mem_per_gpu_gb
    fields = ClusterConfig.model_fields
    return int(fields["cpus_per_gpu"].default), int(fields["mem_per_gpu_gb"].default)


def observe(config: str | None, deployment: str | None) -> ClusterSnapshot:
    """One live snapshot; exits 3 when Slurm cannot be reached (never prints an empty cluster),
    2 when this host's Slurm configuration cannot be read (SLURM_CONF: a person must fix it)."""
    from coral_hpc.slurm.errors import SlurmMisconfigured

    try:
        if config:
            from coral_hpc.config import load_deployment

            dep = load_deployment(config)
            return client_for_deployment(dep).snapshot(deployment or dep.deployment)
        return make_client("auto").snapshot(deployment or "")
    except ConfigError as exc:
        fail(exc.problems + [f"{config}: {len(exc.problems)} problem(s)"])
    except SlurmMisconfigured as exc:
        fail(f"Slurm error: {exc}", status=EXIT_INVALID)
    except TransientError as exc:
        fail(f"Slurm is unreachable, try again later: {exc}", status=EXIT_UNAVAILABLE)
    except PermanentError as exc:
        fail(f"Slurm error: {exc}", status=EXIT_SLURM_ERROR)


def partition_rows(snapshot: ClusterSnapshot, cpus_per_gpu: int = 4,
                   mem_per_gpu_gb: int = 32) -> list[dict]:
    """One row per (partition, GPU type): nodes, GPUs total / free / unavailable (drained,
    draining or down nodes), the partition's MaxTime, and what one GPU-hour of a replica job
    costs there in Slurm billing units: TRESBillingWeights' GPU weight plus the CPU and memory
    weights times the CPUs and GB that job asks per GPU (``billing_per_gpu_hour``;
    ``billing_per_gpu`` keeps the GPU weight alone)."""
    from coral_hpc.plan.inputs import billing_of

    nodes = {n.name: n for n in snapshot.nodes}
    rows = []
    for partition in snapshot.partitions:
        types = partition.gpu_types or ("",)
        for gpu_type in types:
            members = [nodes[n] for n in partition.nodes if n in nodes and (nodes[n].gpu_type or "") == gpu_type]
            weight = partition.billing_weights.get("gres/gpu", 0.0) + partition.billing_weights.get(
                f"gres/gpu:{gpu_type}", 0.0
            )
            rows.append(
                {
                    "partition": partition.name,
                    "state": partition.state,
                    "gpu_type": gpu_type or None,
                    "nodes": len(members),
                    "gpus_total": sum(n.gpus_total for n in members),
                    # a partition that is not up offers nothing, whatever its nodes say
                    "gpus_free": sum(n.gpus_free for n in members) if partition.state == "up" else 0,
                    "gpus_unavailable": sum(n.gpus_total for n in members if not n.usable),
                    "billing_per_gpu": weight,
                    "billing_per_gpu_hour": billing_of(
                        partition.billing_weights, cpus_per_gpu, mem_per_gpu_gb
                    ).per_gpu_hour(gpu_type),
                    "max_time_s": partition.max_time_s,
                }
            )
    return rows


def _hours(seconds: int | None) -> str:
    if seconds is None:
        return "unlimited"
    return f"{seconds / 3600:g} h"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the whole snapshot as JSON.")
@click.option("--snapshot", "snapshot_file", type=click.Path(dir_okay=False),
              help="Read a snapshot saved by --json instead of asking Slurm.")
@click.option("--config", type=click.Path(dir_okay=False),
              help="models.yaml: its deployment's jobs and account limits, its slurm.backend, "
                   "its CPUs and memory per GPU (for the billing column).")
@click.option("--deployment", help="Deployment whose jobs to list (default: the config's).")
@wide_option
def cluster(as_json: bool, snapshot_file: str | None, config: str | None, deployment: str | None,
            wide: bool) -> None:
    """Show partitions × GPU type with total / free / unavailable GPUs and what a GPU-hour
    costs in Slurm billing units (GPU, CPU and memory weights of a replica job's shape)."""
    import time

    cpus, mem = job_shape(config)
    snapshot = load_snapshot_file(snapshot_file) if snapshot_file else observe(config, deployment)
    if as_json:
        print_json(snapshot.to_dict())
        return
    console.print(
        f"Slurm {snapshot.slurm_version} via {snapshot.backend}, observed "
        f"{local_time(snapshot.observed_at)} ({ago(snapshot.observed_at, time.time())}); "
        f"{len(snapshot.nodes)} nodes, "
        f"{sum(g.gpus_per_node * len(g.nodes) for g in snapshot.node_groups)} GPUs in "
        f"{len(snapshot.node_groups)} node group(s)",
        highlight=False,
    )
    columns = [Column("partition", "id"), Column("state", "id"), Column("GPU type", "id"),
               Column("nodes", "num"), Column("GPUs", "num"), Column("free", "num"),
               Column("unavailable", "num"), Column("billing per GPU-h", "num"),
               Column("max time", "num")]
    rows = [
        (row["partition"], row["state"], row["gpu_type"] or "-", row["nodes"], row["gpus_total"],
         row["gpus_free"], row["gpus_unavailable"], f"{row['billing_per_gpu_hour']:.4g}",
         _hours(row["max_time_s"]))
        for row in partition_rows(snapshot, cpus, mem)
    ]
    print_table(columns, rows, wide=wide)
    console.print(
        f"billing per GPU-h: Slurm billing units one GPU-hour of a replica job accrues — the GPU "
        f"weight + {cpus} CPUs × the CPU weight + {mem} GB × the memory weight "
        f"(TRESBillingWeights; cluster.cpus_per_gpu / mem_per_gpu_gb"
        f"{' of ' + config if config else ', defaults'})",
        highlight=False,
    )
    if snapshot.jobs:
        # Slurm's reason beside the state it explains: one column fewer at 80 characters
        jobs = [
            (job.job_id, job.tag.model if job.tag else "-",
             job.tag.replica_id if job.tag else "-",
             f"{job.state or '-'} ({job.reason})" if job.reason else job.state or "-",
             job.partition, job.gpus, ", ".join(job.nodes))
            for job in snapshot.jobs
        ]
        print_table([Column("job", "id"), Column("model", "id"), Column("replica", "id"),
                     Column("state (reason)"), Column("partition", "id"),
                     Column("GPUs", "num"), Column("nodes")], jobs, wide=wide)
