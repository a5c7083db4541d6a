"""``coral-hpc cluster``: what Slurm offers — partitions × GPU type, total / free / unavailable GPUs
and billing weights — or the whole snapshot as JSON (accepted back by ``--snapshot``)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from coral_hpc.cli._output import EXIT_UNAVAILABLE, console, fail, print_json
from coral_hpc.errors import ConfigError, PermanentError, TransientError
from coral_hpc.slurm import ClusterSnapshot, client_for_deployment, make_client

#: exit status when Slurm refused or answered something unreadable
EXIT_SLURM_ERROR = 1


def load_snapshot_file(path: str) -> ClusterSnapshot:
    """A snapshot saved from ``coral-hpc cluster --json``; exits 2 naming the file and the problem."""
    try:
        return ClusterSnapshot.from_json(Path(path).read_text())
    except OSError as exc:
        fail(f"{path}: cannot read the snapshot: {exc.strerror}")
    except ValueError as exc:
        fail(f"{path}: not a coral-hpc cluster snapshot: {exc}")


def observe(config: str | None, deployment: str | None) -> ClusterSnapshot:
    """One live snapshot; exits 3 when Slurm cannot be reached (never prints an empty cluster)."""
    try:
        if config:
            from coral_hpc.config import load_deployment

            dep = load_deployment(config)
            return client_for_deployment(dep).snapshot(deployment or dep.deployment)
        return make_client("auto").snapshot(deployment or "")
    except ConfigError as exc:
        fail(exc.problems + [f"{config}: {len(exc.problems)} problem(s)"])
    except TransientError as exc:
        fail(f"Slurm is unreachable, try again later: {exc}", status=EXIT_UNAVAILABLE)
    except PermanentError as exc:
        fail(f"Slurm error: {exc}", status=EXIT_SLURM_ERROR)


def partition_rows(snapshot: ClusterSnapshot) -> list[dict]:
    """One row per (partition, GPU type): nodes, GPUs total / free / unavailable (drained,
    draining or down nodes), billing weight per GPU and the partition's MaxTime."""
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
              help="models.yaml: its deployment's jobs and account limits, its slurm.backend.")
@click.option("--deployment", help="Deployment whose jobs to list (default: the config's).")
def cluster(as_json: bool, snapshot_file: str | None, config: str | None, deployment: str | None) -> None:
    """Show partitions × GPU type with total / free / unavailable GPUs and billing weights."""
    snapshot = load_snapshot_file(snapshot_file) if snapshot_file else observe(config, deployment)
    if as_json:
        print_json(snapshot.to_dict())
        return
    table = Table("partition", "state", "GPU type", "nodes", "GPUs", "free", "unavailable",
                  "billing/GPU", "max time")
    for row in partition_rows(snapshot):
        table.add_row(
            row["partition"], row["state"], row["gpu_type"] or "-", str(row["nodes"]),
            str(row["gpus_total"]), str(row["gpus_free"]), str(row["gpus_unavailable"]),
            f"{row['billing_per_gpu']:g}", _hours(row["max_time_s"]),
        )
    console.print(
        f"Slurm {snapshot.slurm_version} via {snapshot.backend}, observed "
        f"{snapshot.observed_at:.0f} (epoch s); {len(snapshot.nodes)} nodes, "
        f"{sum(g.gpus_per_node * len(g.nodes) for g in snapshot.node_groups)} GPUs in "
        f"{len(snapshot.node_groups)} node group(s)"
    )
    console.print(table)
    if snapshot.jobs:
        jobs = Table("job", "model", "replica", "state", "reason", "partition", "GPUs", "nodes")
        for job in snapshot.jobs:
            jobs.add_row(job.job_id, job.tag.model if job.tag else "-", job.tag.replica_id if job.tag else "-",
                         job.state, job.reason or "", job.partition, str(job.gpus), ",".join(job.nodes))
        console.print(jobs)
