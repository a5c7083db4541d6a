"""Stage 2's prepared data: the library restricted to what this epoch's cluster can run, node
classes and their packing patterns, stage prices and every replica bound (:func:`prepare`).
:mod:`coral_solver.allocate_model` builds the model over it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations_with_replacement

import numpy as np

from coral_solver.types import Cluster, JobLimits, ModelSpec, Partition, Policy, Template

INF = math.inf


# --------------------------------------------------------------------------- prepared data


@dataclass
class NodeClass:
    """Identical nodes for packing: GPU type, free GPUs, partitions that may use them."""

    gpu_type: str
    free: int
    partitions: tuple[str, ...]
    nodes: list[str]
    #: seconds until Slurm expects to give these GPUs to a job of ours (0 = now)
    wait_s: float = 0.0


@dataclass
class Prepared:
    """Everything Stage 2 needs, as plain arrays and lists; built by :func:`prepare`."""

    models: list[ModelSpec]
    templates: list[Template]
    model_of: np.ndarray  # template → model index
    stage_parts: list[dict[str, list[str]]]  # template → GPU type → allowed partitions
    stage_cost: dict[tuple[str, str, int], float]  # (partition, gpu, gpus) → cost per hour
    classes: list[NodeClass]
    patterns: dict[tuple[str, int], list[dict[int, int]]]  # (gpu, free) → maximal patterns
    running: dict[tuple[int, str, str], int]  # (template, gpu, partition) → running stages
    running_replicas: dict[tuple[int, tuple[str, ...]], int]  # (template, partitions) → count
    upper: np.ndarray  # template → bound on replicas
    cluster: Cluster
    policy: Policy
    dropped: int = 0  # templates removed because availability rules them out
    #: site limit in words → templates (or template stages) it kept out of this plan
    limit_drops: dict[str, int] = field(default_factory=dict)


def _patterns(free: int, sizes: list[int]) -> list[dict[int, int]]:
    """Maximal multisets of ``sizes`` with total ≤ ``free`` (no further size fits)."""
    out = []
    smallest = min(sizes)
    for count in range(1, free // smallest + 1):
        for combo in combinations_with_replacement(sorted(sizes), count):
            used = sum(combo)
            if used <= free and free - used < smallest:
                pattern: dict[int, int] = {}
                for size in combo:
                    pattern[size] = pattern.get(size, 0) + 1
                out.append(pattern)
    return out


def node_classes(cluster: Cluster) -> list[NodeClass]:
    """Group nodes by (GPU type, free GPUs, usable partitions containing them); each node once."""
    partitions_of: dict[str, list[str]] = {}
    for part in cluster.partitions:
        if not part.usable:
            continue
        for group_name in part.node_groups:
            partitions_of.setdefault(group_name, []).append(part.name)
    seen: set[str] = set()
    classes: dict[tuple, NodeClass] = {}
    for group in cluster.node_groups:
        parts = tuple(sorted(p for p in partitions_of.get(group.name, [])
                             if _priced(cluster, p, group.gpu_type)))
        for node, free in zip(group.nodes, group.free):
            if node in seen:
                raise ValueError(f"node {node} is listed in two node groups")
            seen.add(node)
            if free <= 0 or not parts:
                continue
            key = (group.gpu_type, free, parts, float(group.wait_s))
            classes.setdefault(key, NodeClass(group.gpu_type, free, parts, [],
                                              float(group.wait_s))).nodes.append(node)
    return [classes[k] for k in sorted(classes)]


def _priced(cluster: Cluster, partition: str, gpu_type: str) -> bool:
    for part in cluster.partitions:
        if part.name == partition:
            return part.gpu_hour_cost(gpu_type) is not None
    return False


def _stage_price(part: Partition, gpu: str, tp: int) -> float:
    """A stage's cost per hour in a partition Stage 2 kept for ``gpu``: node classes list only
    the partitions that price the type (:func:`_priced`), so the price is never None here."""
    cost = part.stage_cost(gpu, tp)
    assert cost is not None, f"partition {part.name} has no price for {gpu}"
    return cost


def _undominated(cluster: Cluster, classes: list[NodeClass], parts: list[str], gpu: str,
                 tp: int) -> list[str]:
    """Drop partition q for a (gpu, tp) stage when another partition p is as good in every way:
    no dearer, reaches every node q reaches, and counts against no quota q does not. Any stage
    in q can then move to p without raising cost or breaking a limit, so this is exact.
    Identical partitions keep the first by name."""
    price = {p.name: _stage_price(p, gpu, tp) for p in cluster.partitions if p.name in parts}
    reach = {p: {n for c in classes if c.gpu_type == gpu and c.free >= tp and p in c.partitions
                 for n in c.nodes} for p in parts}
    quotas = {p: {q.name for q in cluster.quotas if q.matches(p, gpu)} for p in parts}

    def beats(p: str, q: str) -> bool:
        if p == q or price[p] > price[q] or not reach[p] >= reach[q] or not quotas[p] <= quotas[q]:
            return False
        same = price[p] == price[q] and reach[p] == reach[q] and quotas[p] == quotas[q]
        return not same or p < q

    return [q for q in parts if not any(beats(p, q) for p in parts)]


def _environment_group(cluster: Cluster, model: ModelSpec, template: Template,
                       open_parts: dict, mi: int, price_names: list[str],
                       slots: dict) -> tuple[str, ...] | None:
    """The partitions a multi-stage template may spread over: None = any (single stage, or no
    environment groups given); ``()`` = none (no group offers a partition for every stage type).
    Of several groups that could host it, the one with the most partitions for its types (then
    the first by name): conservative, a replica could not mix groups anyway."""
    groups = cluster.pipeline_groups()
    if template.pp == 1 or not groups:
        return None
    best: tuple[int, tuple[str, ...]] | None = None
    for group in groups:
        reach = 0
        for gpu in template.stage_counts():
            usable = [p for p in price_names if p in group and model.allows_partition(p)
                      and slots.get((gpu, template.tp, p), 0) > 0]
            if not usable:
                reach = -1
                break
            reach += len(usable)
        ordered = tuple(sorted(group))
        better = best is None or reach > best[0] or (reach == best[0] and ordered < best[1])
        if reach > 0 and better:
            best = (reach, ordered)
    return () if best is None else best[1]


def _job_limit_broken(template: Template, limits: JobLimits) -> str | None:
    """The per-job GPU limit (MaxTRES) one replica job of ``template`` would break, in words."""
    if limits.max_gpus_per_job is not None and template.gpus > limits.max_gpus_per_job:
        return f"MaxTRES gres/gpu={limits.max_gpus_per_job} per job"
    for gpu, stages in template.stage_counts().items():
        cap = limits.max_gpus_per_job_by_type.get(gpu)
        if cap is not None and stages * template.tp > cap:
            return f"MaxTRES gres/gpu:{gpu}={cap} per job"
    return None


def prepare(
    models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster, policy: Policy
) -> Prepared:
    """Restrict the library to what this epoch's cluster can run and compute every bound.

    Exact reductions only: a template is dropped when some stage type has no allowed partition or
    it needs more stages of a configuration than the free nodes can hold at all; replica counts
    are bounded by max_replicas, by availability, and by ⌈D_m/T_j⌉ (a replica beyond that can be
    removed without losing served demand, at lower cost) or min_replicas.
    """
    classes = node_classes(cluster)
    prices = {p.name: p for p in cluster.partitions if p.usable}
    restrict = _Restriction(cluster, classes, sorted(prices))
    kept: list[Template] = []
    model_of: list[int] = []
    stage_parts: list[dict[str, list[str]]] = []
    upper: list[float] = []
    for mi, model in enumerate(models):
        for template in library.get(model.name, []):
            found = restrict.parts_and_bound(mi, model, template)
            if found is None:
                continue
            kept.append(template)
            model_of.append(mi)
            stage_parts.append(found[0])
            upper.append(found[1])
    stage_cost: dict[tuple[str, str, int], float] = {}
    sizes: dict[str, set[int]] = {}
    for template, parts in zip(kept, stage_parts):
        for gpu, allowed in parts.items():
            sizes.setdefault(gpu, set()).add(template.tp)
            for p in allowed:
                stage_cost[(p, gpu, template.tp)] = _stage_price(prices[p], gpu, template.tp)
    patterns = {}
    for cls in classes:
        if cls.gpu_type in sizes and (cls.gpu_type, cls.free) not in patterns:
            usable = [s for s in sizes[cls.gpu_type] if s <= cls.free]
            patterns[(cls.gpu_type, cls.free)] = _patterns(cls.free, usable) if usable else []
    running, running_replicas = _running_counts(cluster, kept)
    return Prepared(
        models=list(models),
        templates=kept,
        model_of=np.asarray(model_of, dtype=np.int64),
        stage_parts=stage_parts,
        stage_cost=stage_cost,
        classes=classes,
        patterns=patterns,
        running=running,
        running_replicas=running_replicas,
        upper=np.asarray(upper, dtype=float),
        cluster=cluster,
        policy=policy,
        dropped=restrict.dropped,
        limit_drops=restrict.limit_drops,
    )


class _Restriction:
    """Where each template's stages may go this epoch and how many replicas of it can matter,
    with the drops counted (and why, for Slurm's limits). Partition lists and undominated sets
    are cached across templates that share a stage configuration."""

    def __init__(self, cluster: Cluster, classes: list, price_names: list[str]):
        self.cluster = cluster
        self.classes = classes
        self.price_names = price_names
        self.limits = cluster.job_limits
        # (gpu, t, partition) → stages that fit at most; (gpu, t) → in any partition
        self.slots: dict[tuple[str, int, str], int] = {}
        self.by_type: dict[tuple[str, int], int] = {}
        for cls in classes:
            for t in range(1, cls.free + 1):
                fit = (cls.free // t) * len(cls.nodes)
                self.by_type[(cls.gpu_type, t)] = self.by_type.get((cls.gpu_type, t), 0) + fit
                for p in cls.partitions:
                    self.slots[(cls.gpu_type, t, p)] = self.slots.get((cls.gpu_type, t, p), 0) + fit
        self.dropped = 0
        self.limit_drops: dict[str, int] = {}
        self.undominated: dict[tuple, tuple[list[str], int]] = {}
        self.open_parts: dict[tuple, list[str]] = {}

    def _drop(self, why: str | None = None) -> None:
        self.dropped += 1
        if why is not None:
            self._count(why)

    def _count(self, why: str) -> None:
        self.limit_drops[why] = self.limit_drops.get(why, 0) + 1

    def parts_and_bound(self, mi: int, model: ModelSpec, template: Template
                        ) -> tuple[dict[str, list[str]], float] | None:
        """Each stage type's partitions and the replica bound, or None (counted as dropped)
        when the template cannot run here this epoch."""
        broken = _job_limit_broken(template, self.limits)
        if broken:
            self._drop(broken)
            return None
        group = _environment_group(self.cluster, model, template, self.open_parts, mi,
                                   self.price_names, self.slots)
        if group == ():
            self._drop("engine environments: no partitions with one environment for every "
                       "stage type")
            return None
        parts: dict[str, list[str]] = {}
        bound = INF if model.max_replicas is None else model.max_replicas
        for gpu, count in template.stage_counts().items():
            allowed, fit = self._stage_partitions(mi, model, template, gpu, group)
            parts[gpu] = allowed
            bound = min(bound, fit // count)
        if model.demand_rps > 0:
            need = math.ceil(model.demand_rps / template.throughput - 1e-9)
            bound = min(bound, max(need, model.min_replicas))
        else:
            bound = min(bound, model.min_replicas)
        if bound < 1 or not all(parts.values()):
            self._drop()
            return None
        return parts, bound

    def _stage_partitions(self, mi: int, model: ModelSpec, template: Template, gpu: str,
                          group: tuple[str, ...] | None) -> tuple[list[str], int]:
        """The undominated partitions a stage of type ``gpu`` may use, and how many such
        stages fit in them."""
        base = (mi, gpu, template.tp)
        if base not in self.open_parts:
            self.open_parts[base] = [p for p in self.price_names if model.allows_partition(p)
                                     and self.slots.get((gpu, template.tp, p), 0) > 0]
        allowed = self.open_parts[base]
        if self.cluster.excluded_stages:
            allowed = [p for p in allowed
                       if (template.id, gpu, p) not in self.cluster.excluded_stages]
        gpu_caps = self.limits.max_gpus_per_job_by_partition
        if gpu_caps:
            for p in allowed:
                cap = gpu_caps.get(p)
                if cap is not None and template.gpus > cap:
                    self._count(f"partition {p} QOS MaxTRES gres/gpu={cap} per job")
            allowed = [p for p in allowed if template.gpus <= gpu_caps.get(p, template.gpus)]
        if group is not None:
            allowed = [p for p in allowed if p in group]
        node_caps = self.limits.max_nodes_by_partition
        if node_caps:
            # conservative: a replica whose stages all land in p is one job of pp nodes
            for p in allowed:
                cap = node_caps.get(p, template.pp)
                if template.pp > cap:
                    self._count(f"partition {p} MaxNodes={cap} per job")
            allowed = [p for p in allowed if template.pp <= node_caps.get(p, template.pp)]
        key = (gpu, template.tp, tuple(allowed))
        if key not in self.undominated:
            best = _undominated(self.cluster, self.classes, allowed, gpu, template.tp)
            fit = sum(self.slots.get((gpu, template.tp, p), 0) for p in best)
            self.undominated[key] = (best, min(fit, self.by_type.get((gpu, template.tp), 0)))
        return self.undominated[key]


RunningStages = dict[tuple[int, str, str], int]        # (template, stage type, partition)
RunningReplicas = dict[tuple[int, tuple[str, ...]], int]  # (template, partitions)


def _running_counts(cluster: Cluster, kept: list[Template]
                    ) -> tuple[RunningStages, RunningReplicas]:
    """Replicas already running, per (template, stage type, partition) and per (template,
    partitions): the start-up credit's counts."""
    index = {t.id: j for j, t in enumerate(kept)}
    running: dict[tuple[int, str, str], int] = {}
    running_replicas: dict[tuple[int, tuple[str, ...]], int] = {}
    for replica in cluster.running:
        j = index.get(replica.template_id)
        if j is None or len(replica.partitions) != kept[j].pp:
            continue  # no longer in the library: gets no start-up credit
        replica_key = (j, tuple(replica.partitions))
        running_replicas[replica_key] = running_replicas.get(replica_key, 0) + replica.count
        for stage, p in zip(kept[j].stages, replica.partitions):
            running[(j, stage.gpu_type, p)] = running.get((j, stage.gpu_type, p), 0) + replica.count
    return running, running_replicas
