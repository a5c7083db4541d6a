"""Stage 2's model, defined once as named families of variables and constraints.

:func:`build_model` is a flat recipe of ``define_*`` calls over prepared arrays
(:class:`~coral_solver.allocate_data.Prepared`); the result, a :class:`LinearModel`, is handed
to HiGHS either as a matrix (:mod:`coral_solver.allocate_highs`, the fast path) or as a Pyomo
model with the same index names (:mod:`coral_solver.allocate_pyomo`, the readable reference
path). Both read this one definition.

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

import numpy as np

from coral_solver.allocate_data import INF, Prepared
from coral_solver.types import JobLimits

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

    def add_vars(self, name: str, labels: list[tuple], lower, upper, integer: bool,
                 cost=0.0) -> np.ndarray:
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


# ---------------------------------------------------------------- the model, family by family


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
    link_labels = [(t.id, g) for t, parts in zip(data.templates, data.stage_parts)
                   for g in sorted(parts)]
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


def _pattern(data: Prepared, k: int, pi: int) -> dict[int, int]:
    """Packing pattern ``pi`` of node class ``k``: stage size → how many."""
    cls = data.classes[k]
    return data.patterns[(cls.gpu_type, cls.free)][pi]


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
    slot_labels = sorted({(k, t) for k, pi in y_labels for t in _pattern(data, k, pi)})
    slot_rows = dict(zip(slot_labels, lm.add_rows("slots", slot_labels, -INF, 0.0)))
    for col, (k, pi) in zip(y, y_labels):
        for t, count in _pattern(data, k, pi).items():
            lm.add_terms(slot_rows[(k, t)], col, -float(count))
    # z[k,t,p]
    z_labels = [(k, t, p) for (k, t) in slot_labels for p in data.classes[k].partitions]
    # a slot Slurm gives us only after a wait w pays w ÷ re-plan interval × the stage's cost
    per_s = 1.0 / max(data.policy.replan_interval_s, 1e-9)
    z_cost = [data.classes[k].wait_s * per_s
              * data.stage_cost.get((p, data.classes[k].gpu_type, t), 0.0)
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
