"""Stage 2's model, defined once as named families of variables and constraints.

:func:`build_model` is a flat recipe of ``define_*`` calls over prepared arrays
(:class:`Prepared`); the result, a :class:`LinearModel`, is handed to HiGHS either as a matrix
(:mod:`coral_solver.allocate_highs`, the fast path) or as a Pyomo model with the same index names
(:mod:`coral_solver.allocate_pyomo`, the readable reference path). Both read this one definition.

Sets: models m; templates j of model m(j), TP t_j, n_{j,g} stages of GPU type g, throughput T_j;
partitions p; node classes k = identical (GPU type g_k, free GPUs f_k, partitions P_k) with N_k
nodes; packing patterns π of a class (maximal multisets of stage sizes fitting in f_k GPUs).

Variables (names as in the Pyomo model):
    nu[j]          ∈ ℤ≥0  replicas of template j
    sigma[j,g,p]   ∈ ℤ≥0  stages of type g of template j's replicas placed in partition p
    y[k,π]         ∈ ℤ≥0  nodes of class k packed with pattern π
    z[k,t,p]       ≥ 0    size-t stage slots of class k used through partition p
    served[m]      ∈ [0, D_m]  requests/s counted as served
    phi            ∈ [0, 1]    smallest served fraction (fixed to 1 when demand can be met)
    split[m]       ∈ [0, D_m]  requests/s served disaggregated (prefill + decode replicas)
    churn[j,g,p]   ≥ 0    new stages beyond the running ones (only where some run)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations_with_replacement

import numpy as np

from coral_solver.types import Cluster, JobLimits, ModelSpec, Partition, Policy, Template

INF = math.inf


# --------------------------------------------------------------------------- a sparse linear model


@dataclass
class Family:
    """A named, indexed family of variables or constraints: labels[i] ↔ position start + i."""

    name: str
    labels: list[tuple]
    start: int

    def index(self) -> dict[tuple, int]:
        return {label: self.start + i for i, label in enumerate(self.labels)}


@dataclass
class LinearModel:
    """min cost·x s.t. row_lower ≤ A x ≤ row_upper, col_lower ≤ x ≤ col_upper, some x integer."""

    col_lower: list[float] = field(default_factory=list)
    col_upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    var_families: dict[str, Family] = field(default_factory=dict)
    row_families: dict[str, Family] = field(default_factory=dict)

    @property
    def num_cols(self) -> int:
        return len(self.col_lower)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def add_vars(self, name: str, labels: list[tuple], lower, upper, integer: bool, cost=0.0) -> np.ndarray:
        """Add a family of variables; returns their column positions."""
        n = len(labels)
        start = self.num_cols
        self.var_families[name] = Family(name, list(labels), start)
        self.col_lower += list(np.broadcast_to(np.asarray(lower, float), (n,)))
        self.col_upper += list(np.broadcast_to(np.asarray(upper, float), (n,)))
        self.integer += [integer] * n
        self.cost += list(np.broadcast_to(np.asarray(cost, float), (n,)))
        return np.arange(start, start + n)

    def add_rows(self, name: str, labels: list[tuple], lower, upper) -> np.ndarray:
        """Add a family of constraints (coefficients come through :meth:`add_terms`)."""
        n = len(labels)
        start = self.num_rows
        self.row_families[name] = Family(name, list(labels), start)
        self.row_lower += list(np.broadcast_to(np.asarray(lower, float), (n,)))
        self.row_upper += list(np.broadcast_to(np.asarray(upper, float), (n,)))
        return np.arange(start, start + n)

    def add_terms(self, rows, cols, vals) -> None:
        rows, cols, vals = np.broadcast_arrays(
            np.atleast_1d(np.asarray(rows, dtype=np.int64)),
            np.atleast_1d(np.asarray(cols, dtype=np.int64)),
            np.atleast_1d(np.asarray(vals, dtype=float)),
        )
        self.rows += rows.tolist()
        self.cols += cols.tolist()
        self.vals += vals.tolist()

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Column-wise (start, index, value) with duplicate entries summed."""
        rows = np.asarray(self.rows, dtype=np.int64)
        cols = np.asarray(self.cols, dtype=np.int64)
        vals = np.asarray(self.vals, dtype=float)
        key = cols * max(self.num_rows, 1) + rows
        unique, inverse = np.unique(key, return_inverse=True)
        summed = np.zeros(len(unique))
        np.add.at(summed, inverse, vals)
        keep = summed != 0
        unique, summed = unique[keep], summed[keep]
        ucols = unique // max(self.num_rows, 1)
        urows = unique % max(self.num_rows, 1)
        start = np.searchsorted(ucols, np.arange(self.num_cols + 1))
        return start.astype(np.int32), urows.astype(np.int32), summed


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
        if reach > 0 and (best is None or reach > best[0] or (reach == best[0] and ordered < best[1])):
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
    slots: dict[tuple[str, int, str], int] = {}  # (gpu, t, partition) → stages that fit at most
    by_type: dict[tuple[str, int], int] = {}  # (gpu, t) → stages that fit, any partition
    for cls in classes:
        for t in range(1, cls.free + 1):
            fit = (cls.free // t) * len(cls.nodes)
            by_type[(cls.gpu_type, t)] = by_type.get((cls.gpu_type, t), 0) + fit
            for p in cls.partitions:
                slots[(cls.gpu_type, t, p)] = slots.get((cls.gpu_type, t, p), 0) + fit
    kept: list[Template] = []
    model_of: list[int] = []
    stage_parts: list[dict[str, list[str]]] = []
    upper: list[float] = []
    dropped = 0
    limit_drops: dict[str, int] = {}
    undominated: dict[tuple, tuple[list[str], int]] = {}
    open_parts: dict[tuple, list[str]] = {}
    excluded = cluster.excluded_stages
    limits = cluster.job_limits
    price_names = sorted(prices)
    for mi, model in enumerate(models):
        for template in library.get(model.name, []):
            broken = _job_limit_broken(template, limits)
            if broken:
                limit_drops[broken] = limit_drops.get(broken, 0) + 1
                dropped += 1
                continue
            group = _environment_group(cluster, model, template, open_parts, mi, price_names, slots)
            if group == ():
                why = "engine environments: no partitions with one environment for every stage type"
                limit_drops[why] = limit_drops.get(why, 0) + 1
                dropped += 1
                continue
            parts: dict[str, list[str]] = {}
            bound = INF if model.max_replicas is None else model.max_replicas
            for gpu, count in template.stage_counts().items():
                base = (mi, gpu, template.tp)
                if base not in open_parts:
                    open_parts[base] = [p for p in price_names if model.allows_partition(p)
                                        and slots.get((gpu, template.tp, p), 0) > 0]
                allowed = open_parts[base]
                if excluded:
                    allowed = [p for p in allowed if (template.id, gpu, p) not in excluded]
                if limits.max_gpus_per_job_by_partition:
                    for p in allowed:
                        cap = limits.max_gpus_per_job_by_partition.get(p)
                        if cap is not None and template.gpus > cap:
                            why = f"partition {p} QOS MaxTRES gres/gpu={cap} per job"
                            limit_drops[why] = limit_drops.get(why, 0) + 1
                    allowed = [p for p in allowed
                               if template.gpus <= limits.max_gpus_per_job_by_partition.get(p, template.gpus)]
                if group is not None:
                    allowed = [p for p in allowed if p in group]
                if limits.max_nodes_by_partition:
                    # conservative: a replica whose stages all land in p is one job of pp nodes
                    for p in allowed:
                        cap = limits.max_nodes_by_partition.get(p, template.pp)
                        if template.pp > cap:
                            why = f"partition {p} MaxNodes={cap} per job"
                            limit_drops[why] = limit_drops.get(why, 0) + 1
                    allowed = [p for p in allowed
                               if template.pp <= limits.max_nodes_by_partition.get(p, template.pp)]
                key = (gpu, template.tp, tuple(allowed))
                if key not in undominated:
                    best = _undominated(cluster, classes, allowed, gpu, template.tp)
                    fit = sum(slots.get((gpu, template.tp, p), 0) for p in best)
                    undominated[key] = (best, min(fit, by_type.get((gpu, template.tp), 0)))
                allowed, fit = undominated[key]
                parts[gpu] = allowed
                bound = min(bound, fit // count)
            if model.demand_rps > 0:
                need = math.ceil(model.demand_rps / template.throughput - 1e-9)
                bound = min(bound, max(need, model.min_replicas))
            else:
                bound = min(bound, model.min_replicas)
            if bound < 1 or not all(parts.values()):
                dropped += 1
                continue
            kept.append(template)
            model_of.append(mi)
            stage_parts.append(parts)
            upper.append(bound)
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
        dropped=dropped,
        limit_drops=limit_drops,
    )


# --------------------------------------------------------------------------- the model, family by family


def define_replicas(lm: LinearModel, data: Prepared) -> np.ndarray:
    """nu[j] ∈ {0..u_j}: replicas of template j."""
    labels = [(t.id,) for t in data.templates]
    return lm.add_vars("nu", labels, 0.0, data.upper, integer=True)


def define_stage_partitions(lm: LinearModel, data: Prepared, nu: np.ndarray) -> dict:
    """sigma[j,g,p] ∈ ℤ≥0 with  Σ_p sigma[j,g,p] = n_{j,g} · nu[j]   (link[j,g]).

    Cost per hour of a stage: c(p,g,t_j); new stages beyond the running ones pay (1+K)× that.
    Where nothing of (j,g,p) runs, churn = sigma, so the penalty goes straight onto sigma."""
    K = data.policy.startup_penalty
    labels, cost, keys = [], [], []
    for j, (template, parts) in enumerate(zip(data.templates, data.stage_parts)):
        for gpu in sorted(parts):
            for p in parts[gpu]:
                c = data.stage_cost[(p, gpu, template.tp)]
                running = data.running.get((j, gpu, p), 0)
                labels.append((template.id, gpu, p))
                keys.append((j, gpu, p))
                cost.append(c if running else (1.0 + K) * c)
    sigma = lm.add_vars("sigma", labels, 0.0, INF, integer=True, cost=cost)
    link_labels = [(t.id, g) for t, parts in zip(data.templates, data.stage_parts) for g in sorted(parts)]
    link = lm.add_rows("link", link_labels, 0.0, 0.0)
    link_index = dict(zip(link_labels, link))
    rows = [link_index[(data.templates[j].id, g)] for j, g, _ in keys]
    lm.add_terms(rows, sigma, 1.0)
    link_rows, link_cols, link_vals = [], [], []
    for j, (template, parts) in enumerate(zip(data.templates, data.stage_parts)):
        counts = template.stage_counts()
        for gpu in sorted(parts):
            link_rows.append(link_index[(template.id, gpu)])
            link_cols.append(nu[j])
            link_vals.append(-float(counts[gpu]))
    if link_rows:
        lm.add_terms(link_rows, link_cols, link_vals)
    # churn[j,g,p] ≥ sigma[j,g,p] − running[j,g,p], paying K·c, only where something runs
    churn_keys = [k for k in keys if data.running.get(k, 0) > 0]
    if churn_keys:
        position = dict(zip(keys, sigma))
        churn_cost = [K * data.stage_cost[(p, g, data.templates[j].tp)] for j, g, p in churn_keys]
        churn = lm.add_vars("churn", [(data.templates[j].id, g, p) for j, g, p in churn_keys],
                            0.0, INF, integer=False, cost=churn_cost)
        startup = lm.add_rows("startup", [(data.templates[j].id, g, p) for j, g, p in churn_keys],
                              [-data.running[k] for k in churn_keys], INF)
        lm.add_terms(startup, churn, 1.0)
        lm.add_terms(startup, [position[k] for k in churn_keys], -1.0)
    return {"sigma": sigma, "keys": keys}


def define_packing(lm: LinearModel, data: Prepared, sigma: dict) -> dict:
    """Per-node packing over aggregated classes, exact:

        nodes[k]:     Σ_π y[k,π] ≤ N_k
        slots[k,t]:   Σ_p z[k,t,p] ≤ Σ_π π_t · y[k,π]
        stages[g,t,p]: Σ_{j: t_j=t} sigma[j,g,p] ≤ Σ_{k: g_k=g, p∈P_k} z[k,t,p]
    """
    y_labels, y_class, y_pattern = [], [], []
    for k, cls in enumerate(data.classes):
        for pi, _ in enumerate(data.patterns.get((cls.gpu_type, cls.free), [])):
            y_labels.append((k, pi))
            y_class.append(k)
            y_pattern.append(pi)
    y_upper = [len(data.classes[k].nodes) for k in y_class]
    y = lm.add_vars("y", y_labels, 0.0, y_upper, integer=True)
    node_rows = lm.add_rows("nodes", [(k,) for k in range(len(data.classes))],
                            -INF, [len(c.nodes) for c in data.classes])
    if y_labels:
        lm.add_terms(node_rows[y_class], y, 1.0)
    # slot rows per (k, t) for each size appearing in the class's patterns
    slot_labels = sorted({(k, t) for k, pi in y_labels
                          for t in data.patterns[(data.classes[k].gpu_type, data.classes[k].free)][pi]})
    slot_rows = dict(zip(slot_labels, lm.add_rows("slots", slot_labels, -INF, 0.0)))
    for col, (k, pi) in zip(y, y_labels):
        pattern = data.patterns[(data.classes[k].gpu_type, data.classes[k].free)][pi]
        for t, count in pattern.items():
            lm.add_terms(slot_rows[(k, t)], col, -float(count))
    # z[k,t,p]
    z_labels = [(k, t, p) for (k, t) in slot_labels for p in data.classes[k].partitions]
    # a slot Slurm gives us only after a wait w pays w ÷ re-plan interval × the stage's cost
    per_s = 1.0 / max(data.policy.replan_interval_s, 1e-9)
    z_cost = [data.classes[k].wait_s * per_s * data.stage_cost.get((p, data.classes[k].gpu_type, t), 0.0)
              for k, t, p in z_labels]
    z = lm.add_vars("z", z_labels, 0.0, INF, integer=False, cost=z_cost)
    lm.add_terms([slot_rows[(k, t)] for k, t, _ in z_labels], z, 1.0)
    stage_labels = sorted({(g, data.templates[j].tp, p) for j, g, p in sigma["keys"]})
    stage_rows = dict(zip(stage_labels, lm.add_rows("stages", stage_labels, -INF, 0.0)))
    lm.add_terms([stage_rows[(g, data.templates[j].tp, p)] for j, g, p in sigma["keys"]],
                 sigma["sigma"], 1.0)
    for col, (k, t, p) in zip(z, z_labels):
        row = stage_rows.get((data.classes[k].gpu_type, t, p))
        if row is not None:
            lm.add_terms(row, col, -1.0)
    return {"y": y, "y_labels": y_labels, "z": z, "z_labels": z_labels}


def define_quotas(lm: LinearModel, data: Prepared, sigma: dict) -> None:
    """quota[q]: Σ_{(j,g,p) ∈ q} t_j · sigma[j,g,p] ≤ Q_q (deployment quotas, QOS GrpTRES)."""
    quotas = data.cluster.quotas
    if not quotas:
        return
    rows = lm.add_rows("quota", [(q.name,) for q in quotas], -INF, [q.max_gpus for q in quotas])
    tp = np.array([data.templates[j].tp for j, _, _ in sigma["keys"]], dtype=float)
    for row, quota in zip(rows, quotas):
        hit = {(g, p): quota.matches(p, g) for _, g, p in set(sigma["keys"])}
        mask = np.array([hit[(g, p)] for _, g, p in sigma["keys"]], dtype=bool)
        if mask.any():
            lm.add_terms(np.full(int(mask.sum()), row), sigma["sigma"][mask], tp[mask])


def define_preemptible(lm: LinearModel, data: Prepared, sigma: dict) -> None:
    """Preemptible capacity, never a model's only replica:

        backed[m]:  Σ_{(j,g,p) ∈ m, p preemptible} sigma[j,g,p]
                    − U_m · Σ_{(j,g,p) ∈ m, p not preemptible} sigma[j,g,p] ≤ 0

    U_m bounds the model's preemptible stages (Σ_j u_j · pp_j), so the row only says "none
    unless at least one stage elsewhere". A multi-stage replica keeps all its stages on one
    side (:meth:`Cluster.pipeline_groups`), so a stage elsewhere is a whole replica that no
    preemption takes: a model keeps serving, at its reduced capacity, while its preempted
    replicas are resubmitted."""
    preemptible = data.cluster.preemptible()
    if not preemptible:
        return
    keys = sigma["keys"]
    models = sorted({int(data.model_of[j]) for j, _, p in keys if p in preemptible})
    if not models:
        return
    rows = dict(zip(models, lm.add_rows("backed", [(data.models[mi].name,) for mi in models],
                                        -INF, 0.0)))
    bound: dict[int, float] = {}
    for j, template in enumerate(data.templates):
        mi = int(data.model_of[j])
        upper = float(data.upper[j]) if math.isfinite(data.upper[j]) else 1e6
        bound[mi] = bound.get(mi, 0.0) + upper * template.pp
    cols, row_ids, vals = [], [], []
    for col, (j, _, p) in zip(sigma["sigma"], keys):
        mi = int(data.model_of[j])
        if mi not in rows:
            continue
        cols.append(col)
        row_ids.append(rows[mi])
        vals.append(1.0 if p in preemptible else -max(bound[mi], 1.0))
    lm.add_terms(row_ids, cols, vals)


def define_demand(lm: LinearModel, data: Prepared, nu: np.ndarray) -> dict:
    """served[m] ∈ [0, D_m], phi ∈ [0, 1] and

        cover[m]:    Σ_{j∈m} min(T_j, D_m) · nu[j] − served[m] ≥ 0
        fair[m]:     served[m] − D_m · phi ≥ 0          (phi = 1 ⇒ every demand met)
        weighted:    Σ_m priority_m · served[m] ≥ W     (W set by the scarce phases)
        replicas[m]: min_m ≤ Σ_{j∈m} nu[j] ≤ max_m
    """
    names = [(m.name,) for m in data.models]
    demand = np.array([m.demand_rps for m in data.models])
    served = lm.add_vars("served", names, 0.0, demand, integer=False)
    phi = lm.add_vars("phi", [()], 1.0, 1.0, integer=False)
    cover = lm.add_rows("cover", names, 0.0, INF)
    # min(T_j, D_m) instead of T_j: equivalent for integer nu (one replica of a template that
    # alone covers D_m already serves all of it) and a much tighter LP relaxation
    throughput = np.array([t.throughput for t in data.templates])
    aggregated = np.array([t.role == "both" for t in data.templates], dtype=bool)
    if len(nu):
        both = np.nonzero(aggregated)[0]
        lm.add_terms(cover[data.model_of[both]], nu[both],
                     np.minimum(throughput[both], demand[data.model_of[both]]))
    lm.add_terms(cover, served, -1.0)
    define_phases(lm, data, nu, cover, throughput, demand)
    fair = lm.add_rows("fair", names, 0.0, INF)
    lm.add_terms(fair, served, 1.0)
    lm.add_terms(fair, np.full(len(fair), phi[0]), -demand)
    weighted = lm.add_rows("weighted", [()], -INF, INF)
    lm.add_terms(np.full(len(served), weighted[0]), served, [m.priority for m in data.models])
    lower = [float(m.min_replicas) for m in data.models]
    upper = [INF if m.max_replicas is None else float(m.max_replicas) for m in data.models]
    replicas = lm.add_rows("replicas", names, lower, upper)
    if len(nu):
        lm.add_terms(replicas[data.model_of], nu, 1.0)
    cap = job_cap(data.cluster.job_limits)
    if cap is not None and len(nu):
        # jobs: Σ_j nu[j] ≤ MaxJobs/MaxSubmit − this user's other jobs (one replica = one job)
        jobs = lm.add_rows("jobs", [()], -INF, float(cap))
        lm.add_terms(np.full(len(nu), jobs[0]), nu, 1.0)
    return {"served": served, "phi": phi[0], "weighted": weighted[0]}


def job_cap(limits: JobLimits) -> int | None:
    """Replica jobs this plan may hold at once under MaxJobs and MaxSubmit; None = no cap."""
    caps = [c for c in (limits.max_jobs, limits.max_submit) if c is not None]
    return max(0, min(caps) - limits.other_jobs) if caps else None

def define_phases(lm: LinearModel, data: Prepared, nu: np.ndarray, cover: np.ndarray,
                  throughput: np.ndarray, demand: np.ndarray) -> dict:
    """Disaggregated serving, for models with prefill/decode templates (ARCHITECTURE "Units"):
    split[m] ∈ [0, D_m] requests/s go through a prefill and then a decode replica, the rest
    through aggregated ones (cover[m] gains + split[m]):

        cover_prefill[m]: Σ_{j∈m, prefill} min(T_j, D_m) · nu[j] − split[m] ≥ 0
        cover_decode[m]:  Σ_{j∈m, decode}  min(T_j, D_m) · nu[j] − split[m] ≥ 0
        kv_fabric:        Σ_m B_m · split[m] ≤ fabric bytes/s   (when the site sets a limit)

    T_j of a prefill template is its prompt tokens/s ÷ mean input tokens, of a decode template
    its output tokens/s ÷ mean output tokens, so both compare with requests/s; B_m = KV bytes
    per request. Where aggregated replicas are cheaper, split stays 0."""
    roles = [t.role for t in data.templates]
    phased = sorted({int(data.model_of[j]) for j, r in enumerate(roles) if r != "both"})
    if not phased:
        return {"split": np.zeros(0, dtype=np.int64), "models": []}
    labels = [(data.models[mi].name,) for mi in phased]
    split = lm.add_vars("split", labels, 0.0, demand[phased], integer=False)
    lm.add_terms(cover[phased], split, 1.0)
    for role in ("prefill", "decode"):
        rows = lm.add_rows(f"cover_{role}", labels, 0.0, INF)
        lm.add_terms(rows, split, -1.0)
        row_of = dict(zip(phased, rows))
        cols = [j for j, r in enumerate(roles) if r == role and int(data.model_of[j]) in row_of]
        if cols:
            mis = data.model_of[cols]
            lm.add_terms([row_of[int(mi)] for mi in mis], nu[cols],
                         np.minimum(throughput[cols], demand[mis]))
    fabric = data.cluster.kv_fabric_gbs
    if fabric is not None:
        per_request: dict[int, float] = {}  # model index → KV bytes its worst template moves
        for t, mi in zip(data.templates, data.model_of):
            per_request[int(mi)] = max(per_request.get(int(mi), 0.0), t.kv_bytes_per_request)
        row = lm.add_rows("kv_fabric", [()], -INF, fabric * 1e9)
        lm.add_terms(np.full(len(split), row[0]), split, [per_request[mi] for mi in phased])
    return {"split": split, "models": phased}


@dataclass
class Stage2Model:
    """The built model plus where each family sits, for phases and decoding."""

    lm: LinearModel
    data: Prepared
    nu: np.ndarray
    sigma: dict
    packing: dict
    demand: dict
    cost: np.ndarray  # the objective's cost vector (start-up penalty included)
    true_cost: np.ndarray  # cost per hour without the penalty (sigma only)


def build_model(data: Prepared) -> Stage2Model:
    """The whole Stage-2 model: a flat recipe of the ``define_*`` families."""
    lm = LinearModel()
    nu = define_replicas(lm, data)
    sigma = define_stage_partitions(lm, data, nu)
    packing = define_packing(lm, data, sigma)
    define_quotas(lm, data, sigma)
    define_preemptible(lm, data, sigma)
    demand = define_demand(lm, data, nu)
    true_cost = np.zeros(lm.num_cols)
    for col, (j, g, p) in zip(sigma["sigma"], sigma["keys"]):
        true_cost[col] = data.stage_cost[(p, g, data.templates[j].tp)]
    return Stage2Model(lm, data, nu, sigma, packing, demand, np.asarray(lm.cost), true_cost)
