"""Raw Slurm records → :class:`ClusterSnapshot`. Pure: the rules of what is free and what is ours.

- A node's GPUs are free only when it is up and neither draining nor drained (``gpus_free`` 0
  otherwise), so a plan never counts GPUs Slurm will not hand out.
- Node groups gather identical nodes once, however many partitions list them.
- A partition's GPU types are those of its nodes.
- Own jobs are those whose comment parses to a JobTag of this deployment.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from coral_hpc.slurm.gpu_names import catalogue_lookup, catalogue_type, untyped_gpu_type
from coral_hpc.slurm.parse_nodes import RawNode, RawPartition
from coral_hpc.slurm.snapshot import (
    FINISHED_JOB_STATES,
    ClusterSnapshot,
    JobInfo,
    Limits,
    NodeGroupInfo,
    NodeInfo,
    PartitionInfo,
)

#: Slurm state flags that take a node out of service, in order of precedence.
_FLAG_STATES = (
    ("NOT_RESPONDING", "down"),  # scontrol shows "*" on the base state: DOWN*, IDLE*
    ("FAIL", "fail"),
    ("MAINT", "maint"),
    ("POWERED_DOWN", "powered_down"),
    ("POWER_DOWN", "powered_down"),
    ("POWERING_DOWN", "powered_down"),
    ("REBOOT_REQUESTED", "draining"),
    ("REBOOT_ISSUED", "down"),
    ("RESERVED", "reserved"),
)
_BUSY_BASES = {"ALLOCATED", "MIXED", "COMPLETING"}


def node_state(words: Iterable[str]) -> str:
    """Slurm's state words (``["MIXED", "DRAIN"]``, ``["DOWN*"]``) → one coral state:
    ``drained`` (DRAIN on an idle node), ``draining`` (DRAIN with jobs), ``down``, ``fail``,
    ``maint``, ``reserved``, ``powered_down``, ``future``, ``unknown`` or the base state in lower
    case (``idle``, ``mixed``, ``allocated``, ``completing``)."""
    words = [w.upper() for w in words]
    if not words:
        return "unknown"
    base = words[0]
    flags = set(words[1:])
    if base.endswith(("*", "~", "#", "!")):
        suffix = base[-1]
        base = base.rstrip("*~#!%$@^-")
        flags.add({"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP",
                   "!": "POWERING_DOWN"}[suffix])
    if base in ("DOWN", "FUTURE", "UNKNOWN", "FAIL"):
        return "down" if base == "DOWN" else base.lower()
    if "DRAIN" in flags or base == "DRAINED" or base == "DRAINING":
        busy = base in _BUSY_BASES or base == "DRAINING" or "COMPLETING" in flags
        return "draining" if busy else "drained"
    for flag, state in _FLAG_STATES:
        if flag in flags:
            return state
    if "COMPLETING" in flags and base == "IDLE":
        return "completing"
    return base.lower()


def resolve_gpu_types(
    raw_nodes: Iterable[RawNode],
    site_map: Mapping[str, str] | None = None,
    lookup: tuple[Callable[[str], str | None], Callable[[str], float | None]] | None = None,
) -> tuple[list[RawNode], list[str], dict[str, str]]:
    """Raw nodes with their GRES types as catalogue types (:mod:`coral_hpc.slurm.gpu_names`),
    the warnings for what no catalogue type fits, and node → the site's own type name where it
    differs. A node keeps its site name when nothing maps it (the warning says so); an untyped
    ``gpu:N`` node takes the one GPU type its features name, else stays untyped (the plan may
    still type it from a partition's configured ``gpu_types``)."""
    known, memory_of = lookup or catalogue_lookup()
    out, warnings, site_names = [], [], {}
    unknown: dict[str, list[str]] = defaultdict(list)
    memo: dict[str, str | None] = {}
    for raw in raw_nodes:
        if not raw.gpus_total:
            out.append(raw)
            continue
        if raw.gpu_type is None:
            typed = untyped_gpu_type(raw.features, known, memory_of, site_map)
            if typed is None and site_map:
                typed = catalogue_type("gpu", known, memory_of, site_map)
            out.append(replace(raw, gpu_type=typed) if typed else raw)
            continue
        if raw.gpu_type not in memo:
            memo[raw.gpu_type] = catalogue_type(raw.gpu_type, known, memory_of, site_map)
        canonical = memo[raw.gpu_type]
        if canonical is None:
            unknown[raw.gpu_type].append(raw.name)
            out.append(raw)
            continue
        if canonical != raw.gpu_type:
            site_names[raw.name] = raw.gpu_type
        out.append(replace(raw, gpu_type=canonical))
    for name, nodes in sorted(unknown.items()):
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        warnings.append(
            f"GPU type {name!r} on node(s) {shown} matches no catalogue GPU type: its GPUs are "
            f"not planned; map it in cluster.gpu_type_map (e.g. {name}: a100-80g) or add it to "
            f"a site catalogue (models.yaml catalog:, docs/catalog.md)")
    return out, warnings, site_names


def build_nodes(
    raw_nodes: Iterable[RawNode], gpu_memory: Callable[[str], float | None]
) -> tuple[NodeInfo, ...]:
    """NodeInfo per raw node, with free GPUs zeroed on nodes that cannot take new jobs."""
    nodes = []
    memo: dict[str | None, float | None] = {}
    for raw in raw_nodes:
        state = node_state(raw.state_words)
        if raw.gpu_type not in memo:
            memo[raw.gpu_type] = gpu_memory(raw.gpu_type) if raw.gpu_type else None
        usable = state in ("idle", "mixed", "allocated", "completing")
        nodes.append(
            NodeInfo(
                name=raw.name,
                state=state,
                slurm_state="+".join(raw.state_words),
                reason=raw.reason,
                partitions=raw.partitions,
                gpu_type=raw.gpu_type,
                gpus_total=raw.gpus_total,
                gpus_alloc=raw.gpus_alloc,
                gpus_free=max(raw.gpus_total - raw.gpus_alloc, 0) if usable else 0,
                gpu_memory_gb=memo[raw.gpu_type],
                cpus=raw.cpus,
                cpus_alloc=raw.cpus_alloc,
                mem_gb=raw.mem_gb,
                mem_alloc_gb=raw.mem_alloc_gb,
            )
        )
    return tuple(nodes)


def build_partitions(
    raw_partitions: Iterable[RawPartition], nodes: tuple[NodeInfo, ...]
) -> tuple[PartitionInfo, ...]:
    by_name = {n.name: n for n in nodes}
    partitions = []
    for raw in raw_partitions:
        types = sorted({gpu for n in raw.nodes if n in by_name
                        and (gpu := by_name[n].gpu_type) is not None and gpu})
        partitions.append(
            PartitionInfo(
                name=raw.name,
                state=raw.state,
                nodes=raw.nodes,
                gpu_types=tuple(types),
                max_time_s=raw.max_time_s,
                billing_weights=dict(raw.billing_weights),
                default=raw.default,
                max_nodes=raw.max_nodes,
                qos=raw.qos,
                preempt_mode=raw.preempt_mode,
                priority_tier=raw.priority_tier,
                def_cpu_per_gpu=raw.def_cpu_per_gpu,
                def_mem_per_gpu_mb=raw.def_mem_per_gpu_mb,
                def_mem_per_cpu_mb=raw.def_mem_per_cpu_mb,
            )
        )
    return tuple(partitions)


def build_node_groups(
    nodes: tuple[NodeInfo, ...], partitions: tuple[PartitionInfo, ...]
) -> tuple[NodeGroupInfo, ...]:
    """Group GPU nodes by (GPU type, GPUs per node, GPU memory); each node once."""
    member_of: dict[str, set[str]] = defaultdict(set)
    for partition in partitions:
        for name in partition.nodes:
            member_of[name].add(partition.name)
    groups: dict[tuple, list[NodeInfo]] = defaultdict(list)
    for node in nodes:
        if node.gpus_total:
            groups[(node.gpu_type, node.gpus_total, node.gpu_memory_gb)].append(node)
    result = []
    for (gpu_type, per_node, memory), members in sorted(
        groups.items(), key=lambda item: (str(item[0][0]), item[0][1])
    ):
        parts = set().union(*(member_of[n.name] | set(n.partitions) for n in members))
        result.append(
            NodeGroupInfo(
                gpu_type=gpu_type,
                gpus_per_node=per_node,
                gpu_memory_gb=memory,
                nodes=tuple(n.name for n in members),
                partitions=tuple(sorted(parts)),
            )
        )
    return tuple(result)


def own_jobs(jobs: Iterable[JobInfo], deployment: str) -> tuple[JobInfo, ...]:
    """The jobs whose tag names ``deployment``."""
    return tuple(j for j in jobs if j.tag is not None and j.tag.deployment == deployment)


def build_snapshot(
    *,
    slurm_version: str,
    observed_at: float,
    deployment: str,
    backend: str,
    raw_nodes: Iterable[RawNode],
    raw_partitions: Iterable[RawPartition],
    jobs: Iterable[JobInfo],
    limits: Limits | None,
    gpu_memory: Callable[[str], float | None],
    gpu_type_map: Mapping[str, str] | None = None,
    partition_qos_limits: Mapping[str, Limits] | None = None,
) -> ClusterSnapshot:
    """Assemble a :class:`ClusterSnapshot` from parsed Slurm output. GRES types become
    catalogue types (``gpu_type_map`` first); what cannot be typed is a warning."""
    jobs = list(jobs)
    own = own_jobs(jobs, deployment)
    own_ids = {id(j) for j in own}
    others = [j for j in jobs
              if id(j) not in own_ids and j.state.split()[0] not in FINISHED_JOB_STATES]
    typed, warnings, site_names = resolve_gpu_types(raw_nodes, gpu_type_map)
    nodes = tuple(replace(n, site_gpu_type=site_names.get(n.name), features=raw.features)
                  for n, raw in zip(build_nodes(typed, gpu_memory), typed))
    partitions = build_partitions(raw_partitions, nodes)
    if partition_qos_limits:
        partitions = tuple(replace(p, qos_limits=partition_qos_limits.get(p.qos)) if p.qos else p
                           for p in partitions)
    return ClusterSnapshot(
        slurm_version=slurm_version,
        observed_at=observed_at,
        deployment=deployment,
        backend=backend,
        nodes=nodes,
        partitions=partitions,
        node_groups=build_node_groups(nodes, partitions),
        jobs=own,
        limits=limits,
        warnings=tuple(warnings),
        other_user_jobs=len(others),
        other_user_jobs_by_account=dict(Counter(j.account or "" for j in others)),
    )


@functools.lru_cache(maxsize=256)
def gpu_memory_lookup(gpu_type: str) -> float | None:
    """GPU memory (GB) of ``gpu_type`` from the solver's GPU catalog; None when the catalog does
    not know the type (or is not installed). Cached: the catalog is read from disk."""
    try:
        from coral_solver.catalog import gpu_memory_gb
    except ImportError:  # the catalog is optional for observing Slurm
        return None
    try:
        return gpu_memory_gb(gpu_type)
    except (KeyError, ValueError, OSError):
        return None
