"""Reservations the account may use, as capacity Stage 2 can plan on.

ARCHITECTURE.md, "Available GPUs": reservations the account may use are one source of GPUs. In
Slurm a reservation's nodes run only the jobs that name it (``--reservation``) while it is
active, and a job that names it runs only on its nodes (Slurm's reservations guide: "jobs using
that reservation can use only those resources ... and no other jobs can use those resources").
So a reservation is a place of its own, not more GPUs of a partition. Stage 2 already routes
every stage through a partition, so each (configured partition, reservation) pair that shares
nodes becomes a *placement* ``partition@reservation`` (:func:`coral_hpc.types.placement_name`):

- its node group holds the reservation's GPU nodes, free for us = what no job holds there now
  (active), or every GPU of them (a reservation that starts within the horizon: Slurm creates a
  reservation only on nodes free at its start, unless IGNORE_JOBS), plus what our own replicas
  in it hold; ``wait_s`` = seconds until it starts, which Stage 2 prices like a queue wait;
- those nodes leave the partitions' ordinary node groups (while the reservation is active no
  other job runs there; before it starts, Slurm starts no job there that would still run when
  it does, and a replica's time limit is hours);
- the placement is priced like its partition, counts against the partition's quotas and limits,
  and forms engine-environment groups of its own, so one replica's stages are all in the
  reservation or none (one ``--reservation`` per job);
- a replica placed there gets the reservation's end as its time limit when that comes sooner
  (:func:`reservation_time_limit`): walltime rotation moves it before the window closes.

A reservation counts when it is active or starts within ``policy.max_queue_wait_s``, is not a
maintenance reservation (Flags=MAINT), has GPU nodes in a configured partition, and leaves at
least the start-up time plus one re-plan interval of serving before it ends; one that does not
is a warning naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from coral_hpc.config import Deployment
from coral_hpc.slurm.snapshot import ClusterSnapshot, ReservationInfo
from coral_hpc.types import placement_name, split_placement
from coral_solver.catalog import gpu_memory_gb
from coral_solver.types import Cluster, JobLimits, ModelSpec, NodeGroup, Quota

#: reservation names that may reach an ``#SBATCH --reservation=`` line unquoted (submitit
#: writes its parameters as they are): Slurm's own name alphabet, nothing a shell reads
_SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: node states a reservation's node may run our jobs in: up, and flagged RESERVED while active
_RESERVABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "reserved"})


@dataclass(frozen=True)
class UsableReservation:
    """A reservation Stage 2 may plan on this epoch."""

    info: ReservationInfo
    #: seconds until it starts (0 = active)
    wait_s: float
    #: seconds of it left once it has started; None = no end
    window_s: float | None


def usable_reservations(deployment: Deployment, snapshot: ClusterSnapshot
                        ) -> tuple[list[UsableReservation], list[str]]:
    """The snapshot's reservations this epoch can plan on, and a warning for each one it
    cannot, naming it and why (see the module docstring for the rule)."""
    now = snapshot.observed_at
    policy = deployment.policy
    horizon = policy.max_queue_wait_s
    shortest = policy.startup_time_s + policy.replan_interval_s
    out, warnings = [], []
    for res in snapshot.reservations:
        where = f"reservation {res.name}"
        start = res.start if res.start is not None else now
        if res.end is not None and res.end <= now:
            continue  # over: Slurm drops it by itself
        wait = max(0.0, start - now) if res.state != "active" else 0.0
        if "MAINT" in res.flags:
            continue  # maintenance: its nodes run nothing
        if not _SAFE_NAME_RE.match(res.name):
            warnings.append(f"{where}: its name is not a plain Slurm name; not planned")
            continue
        if wait > horizon:
            continue  # a later epoch plans on it once it starts within the horizon
        window = None if res.end is None else res.end - max(start, now)
        if window is not None and window < shortest:
            warnings.append(f"{where}: ends in {int((res.end or now) - now) // 60} min, less "
                            f"than start-up ({policy.startup_time_s:.0f} s) plus one re-plan "
                            f"interval ({policy.replan_interval_s:.0f} s): not planned")
            continue
        out.append(UsableReservation(res, wait, window))
    return out, warnings


def reservation_time_limit(snapshot: ClusterSnapshot | None, placements: Iterable[str],
                           limit: int) -> int:
    """``limit`` clipped to the time left in the reservation any placement names (from its
    start, or now when it is active): a replica there must end before the window closes."""
    if snapshot is None:
        return limit
    by_name = {r.name: r for r in snapshot.reservations}
    for placement in placements:
        _, name = split_placement(placement)
        res = by_name.get(name) if name else None
        if res is None or res.end is None:
            continue
        begins = max(res.start or snapshot.observed_at, snapshot.observed_at)
        limit = min(limit, max(60, int(res.end - begins)))
    return limit


def _placements_of(deployment: Deployment, snapshot: ClusterSnapshot, node_name: str,
                   gpu_type: str, reservation: str) -> tuple[str, ...]:
    configured = {p.name: p for p in deployment.cluster.partitions}
    known = {p.name for p in snapshot.partitions}
    node = snapshot.node(node_name)
    return tuple(sorted(
        placement_name(p, reservation) for p in node.partitions
        if p in configured and p in known
        and (not configured[p].gpu_types or gpu_type in configured[p].gpu_types)))


def with_reservations(deployment: Deployment, snapshot: ClusterSnapshot, cluster: Cluster,
                      held: dict[str, int]) -> tuple[Cluster, list[str]]:
    """``cluster`` with each usable reservation's nodes as placements of their own (see the
    module docstring), and the warnings about reservations it could not use. ``held``: GPUs
    per node our replicas that go on serving hold (they count as ours in the reservation)."""
    usable, warnings = usable_reservations(deployment, snapshot)
    if not usable:
        return cluster, warnings
    groups = _reserved_groups(deployment, snapshot, usable, held)
    if not groups:
        return cluster, warnings
    moved = {name for pairs in groups.values() for name, _ in pairs}
    kept = []
    for group in cluster.node_groups:
        pairs = [(n, f) for n, f in zip(group.nodes, group.free) if n not in moved]
        if pairs:
            kept.append(replace(group, nodes=tuple(n for n, _ in pairs),
                                free=tuple(f for _, f in pairs)))
        elif not group.nodes:
            kept.append(group)
    emptied = {g.name for g in cluster.node_groups} - {g.name for g in kept}
    members: dict[str, list[str]] = {}
    for (res_name, gpu, size, memory, wait, placements), pairs in sorted(groups.items()):
        name = f"{gpu}-{size}x{memory:g}g@{res_name}" + (f"-in{int(wait // 60)}m" if wait else "")
        kept.append(NodeGroup(name, gpu, size, memory, tuple(n for n, _ in pairs),
                              tuple(f for _, f in pairs), wait_s=float(wait)))
        for placement in placements:
            members.setdefault(placement, []).append(name)
    base = {p.name: p for p in cluster.partitions}
    partitions = [replace(p, node_groups=tuple(g for g in p.node_groups if g not in emptied))
                  for p in cluster.partitions]
    for placement, group_names in sorted(members.items()):
        partition, _ = split_placement(placement)
        if partition in base:
            partitions.append(replace(base[partition], name=placement,
                                      node_groups=tuple(group_names)))
    added = sorted(members)
    return replace(
        cluster,
        node_groups=tuple(kept),
        partitions=tuple(partitions),
        quotas=tuple(_quota_with(q, added) for q in cluster.quotas),
        job_limits=_limits_with(cluster.job_limits, added),
        environment_groups=_groups_with(cluster.environment_groups, added),
    ), warnings


def _reserved_groups(deployment: Deployment, snapshot: ClusterSnapshot,
                     usable: list[UsableReservation],
                     held: dict[str, int]) -> dict[tuple, list[tuple[str, int]]]:
    """The usable reservations' GPU nodes grouped by (reservation, GPU type, GPUs per node,
    memory, wait, placements) → [(node, free GPUs)]; a node in two reservations goes with the
    first."""
    nodes = {n.name: n for n in snapshot.nodes}
    moved: set[str] = set()
    groups: dict[tuple, list[tuple[str, int]]] = {}
    for item in usable:
        res = item.info
        for name in res.nodes:
            node = nodes.get(name)
            if (node is None or not node.gpu_type or node.gpus_total <= 0 or name in moved
                    or node.state not in _RESERVABLE_STATES):
                continue
            placements = _placements_of(deployment, snapshot, name, node.gpu_type, res.name)
            if not placements:
                continue
            if res.state == "active":
                free = node.gpus_total - node.gpus_alloc + held.get(name, 0)
            else:
                free = node.gpus_total
            memory = node.gpu_memory_gb or gpu_memory_gb(node.gpu_type) or 0.0
            key = (res.name, node.gpu_type, node.gpus_total, float(memory), item.wait_s,
                   placements)
            groups.setdefault(key, []).append((name, max(0, min(free, node.gpus_total))))
            moved.add(name)
    return groups


def _quota_with(quota: Quota, placements: list[str]) -> Quota:
    """A quota over some partitions covers their placements in reservations too."""
    if not quota.partitions:
        return quota
    extra = tuple(p for p in placements if split_placement(p)[0] in quota.partitions)
    return replace(quota, partitions=quota.partitions + extra) if extra else quota


def _limits_with(limits: JobLimits, placements: list[str]) -> JobLimits:
    """Per-partition job limits bind the partition's placements in reservations too."""
    def spread(by_partition: Mapping[str, int]) -> dict[str, int]:
        out = dict(by_partition)
        for p in placements:
            base = split_placement(p)[0]
            if base in by_partition:
                out[p] = by_partition[base]
        return out

    return replace(limits, max_nodes_by_partition=spread(limits.max_nodes_by_partition),
                   max_gpus_per_job_by_partition=spread(limits.max_gpus_per_job_by_partition))


def _groups_with(groups: tuple[tuple[str, ...], ...],
                 placements: list[str]) -> tuple[tuple[str, ...], ...]:
    """Each environment group again per reservation, of its partitions' placements there: a
    pipeline keeps every stage in one reservation (one ``--reservation`` per job) or none."""
    if not groups:
        return groups
    by_res: dict[str, list[str]] = {}
    for p in placements:
        by_res.setdefault(split_placement(p)[1] or "", []).append(p)
    out = list(groups)
    for _, items in sorted(by_res.items()):
        for group in groups:
            inside = tuple(sorted(p for p in items if split_placement(p)[0] in group))
            if inside:
                out.append(inside)
    return tuple(out)


def models_with(models: list[ModelSpec], cluster: Cluster) -> list[ModelSpec]:
    """Models limited to some partitions may use those partitions' placements too."""
    placements = [p.name for p in cluster.partitions if split_placement(p.name)[1]]
    if not placements:
        return models
    out = []
    for model in models:
        extra = tuple(p for p in placements if split_placement(p)[0] in model.partitions)
        out.append(replace(model, partitions=model.partitions + extra) if extra else model)
    return out
