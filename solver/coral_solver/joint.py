"""The monolithic joint MILP (no templates), for small instances: the proof of the decomposition.

Layout and placement are chosen together, replica by replica: for each model m and replica slot
r, binaries pick a TP degree t and stage count S (``w``), and for every stage position the GPU
type and the layers it holds (``a``); the replica's throughput is bounded by each of its stages'
tabulated throughput. Stages are packed node by node (``q[n,t,p]``: size-t stages on node n,
counted in partition p, Σ t·q ≤ free(n)) — the same packing model Stage 2 uses over aggregated
classes. Demand, quotas, replica bounds and the scarce-demand phases are the same as Stage 2's.
With MIP gap 0 its optimum must equal the two-stage optimum; ``tests/unit/test_joint.py`` checks it
on random instances from :func:`random_instance`.

Also here: :class:`TableThroughput`, a plain-data throughput model (so the proof does not depend on
the calibration of :mod:`coral_solver.perf`), and the instance generator.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

import numpy as np

from coral_solver.allocate import PHASE_TOLERANCE
from coral_solver.allocate_highs import HighsSolver
from coral_solver.allocate_model import INF, LinearModel
from coral_solver.roles import roles_for
from coral_solver.types import (
    Cluster,
    Disaggregation,
    ModelSpec,
    NodeGroup,
    Partition,
    Policy,
    Quota,
)


@dataclass
class TableThroughput:
    """A throughput model given as tables: ``table[(model, gpu, tp, stages)][l-1]`` requests/s."""

    layer_count: dict[str, int]
    weights_gb: dict[str, float]
    tps: dict[str, list[int]]
    table: dict[tuple[str, str, int, int], list[float]] = field(default_factory=dict)
    #: prefill-only / decode-only stage throughput: ``[(model, gpu, tp, stages, role)][l-1]``
    phase_table: dict[tuple[str, str, int, int, str], list[float]] = field(default_factory=dict)
    kv_bytes: dict[str, float] = field(default_factory=dict)  #: KV bytes per request per model

    def layers(self, model: ModelSpec) -> int:
        return self.layer_count[model.name]

    def weight_gb(self, model: ModelSpec) -> float:
        return self.weights_gb[model.name]

    def tp_degrees(self, model: ModelSpec, max_tp: int) -> list[int]:
        return [t for t in self.tps[model.name] if t <= max_tp]

    def runs_on(self, model: ModelSpec, gpu_type: str) -> bool:
        return any(k[0] == model.name and k[1] == gpu_type for k in self.table)

    def throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                   stages: int) -> float:
        row = self.table.get((model.name, gpu_type, tp, stages))
        if row is None or not 1 <= layers <= len(row):
            return 0.0
        return row[layers - 1]

    def calibrated(self, model: ModelSpec, gpu_type: str) -> bool:
        return True

    def phase_throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                         stages: int, role: str) -> float:
        """``phase_table[(model, gpu, tp, stages, role)][l-1]``; role "both" reads ``table``."""
        if role == "both":
            return self.throughput(model, gpu_type, tp, layers, stages)
        row = self.phase_table.get((model.name, gpu_type, tp, stages, role))
        if row is None or not 1 <= layers <= len(row):
            return 0.0
        return row[layers - 1]

    def kv_bytes_per_request(self, model: ModelSpec) -> float:
        return self.kv_bytes.get(model.name, 0.0)

    def fingerprint(self) -> str:
        material = (sorted(self.table.items()), sorted(self.phase_table.items()),
                    sorted(self.kv_bytes.items()))
        return hashlib.sha256(repr(material).encode()).hexdigest()


@dataclass
class Instance:
    models: list[ModelSpec]
    cluster: Cluster
    throughput: TableThroughput
    policy: Policy
    scarce: bool


#: total free GPUs of a generated instance: keeps the joint MILP (one slot per possible replica)
#: small enough to prove optimal in about a second
_FREE_CAP = 6


def random_instance(seed: int, scarce: bool | None = None,
                    disaggregation: Disaggregation | None = None) -> Instance:
    """A small random instance in which layouts matter.

    GPU types differ in memory and speed per price; models are large enough that small GPUs
    need several pipeline stages (or a bigger GPU), and stage throughput falls with the layers
    held, so uneven and heterogeneous splits pay. ``scarce`` instances ask more than fits.
    ``disaggregation`` ("auto" | "on"): every model may (must) be served by prefill and decode
    replicas too; each GPU type gets its own prefill and decode speed-up over aggregated
    serving (compute-rich types prefill faster, bandwidth-rich ones decode faster), so the
    phases prefer different types.
    """
    rng = random.Random(seed)
    phase_rng = random.Random(f"{seed}-phases")  # leaves the aggregated instance unchanged
    scarce = rng.random() < 0.35 if scarce is None else scarce
    kinds = [("big", 40.0, 3.0, 4), ("mid", 24.0, 1.6, 2), ("small", 16.0, 1.0, 2)]
    kinds = rng.sample(kinds, rng.choice([2, 3]))
    groups: list[NodeGroup] = []
    names: list[str] = []
    for gpu, memory, speed, size in kinds:
        nodes = rng.choice([1, 2])
        free = tuple(rng.randint(1 if not scarce else 0, size) for _ in range(nodes))
        room = max(_FREE_CAP - sum(sum(g.free) for g in groups), 0)
        free = tuple(min(f, room - sum(free[:i])) if room > sum(free[:i]) else 0
                     for i, f in enumerate(free))
        groups.append(NodeGroup(f"g-{gpu}", gpu, size, memory,
                                tuple(f"{gpu}-{i}" for i in range(nodes)), free))
        names.append(f"g-{gpu}")
    base_price = {"big": 3.0, "mid": 1.4, "small": 1.0}
    partitions = [Partition("p0", tuple(names),
                            prices={g: base_price[g] * rng.uniform(0.8, 1.2) for g, *_ in kinds})]
    if rng.random() < 0.5:
        subset = tuple(rng.sample(names, rng.randint(1, len(names))))
        partitions.append(Partition("p1", subset, prices={
            g: base_price[g] * rng.uniform(0.6, 1.3) for g, *_ in kinds}))
    quotas: tuple[Quota, ...] = ()
    if rng.random() < 0.3:
        quotas = (Quota("qos", rng.randint(4, 8)),)
    speeds = {g: s for g, _, s, _ in kinds}
    memories = {g: m for g, m, _, _ in kinds}
    models, table, layer_count, weights, tps = [], {}, {}, {}, {}
    phase_table, kv_bytes = {}, {}
    # compute-rich "big" GPUs gain most on prefill, the others on decode (as L40S/H100 vs A100
    # in the paper); weak on the other phase, so neither role wins everywhere
    strong = {"big": "prefill", "mid": "decode", "small": "decode"}
    phase_gain = {g: {role: phase_rng.uniform(1.5, 4.0) if strong[g] == role
                      else phase_rng.uniform(0.6, 1.4) for role in ("prefill", "decode")}
                  for g in speeds}
    for mi in range(rng.choice([1, 2, 2])):
        name = f"m{mi}"
        layers = rng.randint(3, 6)
        weight = rng.uniform(10.0, 45.0)
        layer_count[name], weights[name], tps[name] = layers, weight, [1, 2]
        bias = {g: rng.uniform(0.7, 1.3) for g in speeds}
        for gpu, *_ in kinds:
            for tp in (1, 2):
                for stages in range(1, 4):
                    row = []
                    for held in range(1, layers + 1):
                        fits = held * weight / layers <= 0.85 * tp * memories[gpu]
                        speed = speeds[gpu] * bias[gpu] * tp ** 0.85 * (1 - 0.08 * (stages - 1))
                        row.append(round(speed * 4.0 / held, 4) if fits else 0.0)
                    table[(name, gpu, tp, stages)] = row
                    if disaggregation is not None:
                        for role, gain in phase_gain[gpu].items():
                            phase_table[(name, gpu, tp, stages, role)] = [
                                round(v * gain, 4) for v in row]
        demand = rng.uniform(1.0, 4.0) * (3.0 if scarce else 1.0)
        models.append(ModelSpec(
            name=name, arch=name, input_tokens=100, output_tokens=100, ttft_s=1.0, tpot_s=0.1,
            demand_rps=round(demand, 3), priority=rng.choice([1.0, 2.0]),
            min_replicas=rng.choice([0, 0, 1]),
            max_replicas=rng.choice([None, None, 3]),
            disaggregation=disaggregation or "off",
        ))
        if disaggregation is not None:
            kv_bytes[name] = 1e9 * phase_rng.uniform(0.1, 0.5)
    fabric = None
    if disaggregation is not None and phase_rng.random() < 0.3:
        fabric = phase_rng.uniform(0.5, 2.0)  # GB/s: binds on some instances
    cluster = Cluster(tuple(groups), tuple(partitions), quotas, kv_fabric_gbs=fabric)
    policy = Policy(n_max=3, rho=math.inf, heterogeneous=True, max_tp=2, startup_penalty=0.0,
                    time_limit_s=60.0, mip_gap=0.0, prune=False)
    throughput = TableThroughput(layer_count, weights, tps, table, phase_table, kv_bytes)
    return Instance(models, cluster, throughput, policy, scarce)


# --------------------------------------------------------------------------- the joint model


@dataclass
class JointResult:
    status: str  # "optimal" | "scarce" | "infeasible" | ...
    cost_per_hour: float
    served: dict[str, float]
    phases: dict[str, float]
    seconds: float


def _slots(cluster: Cluster, t_min: int) -> int:
    return sum(f // t_min for g in cluster.node_groups for f in g.free)


def build_joint(inst: Instance) -> tuple[LinearModel, dict]:
    """The monolithic MILP of ``inst`` (see the module docstring for the algebra)."""
    joint = _Joint(inst)
    joint.pack_nodes()
    joint.add_demand()
    for mi, m in enumerate(inst.models):
        joint.add_model(mi, m)
    lm = joint.lm
    cost = np.asarray(lm.cost, float)
    return lm, {"served": joint.served, "phi": joint.phi, "weighted": joint.weighted,
                "cost": cost}


class _Joint:
    """The joint MILP under construction: node packing and stage supply first, then demand,
    then each model's replica slots with their layout and stage choices."""

    def __init__(self, inst: Instance):
        self.inst = inst
        self.lm = LinearModel()
        cluster, tm, policy = inst.cluster, inst.throughput, inst.policy
        self.usable = [p for p in cluster.partitions if p.usable]
        # (name, GPU type, GPUs per node, free GPUs, partitions)
        self.nodes: list[tuple[str, str, int, int, tuple[str, ...]]] = []
        for group in cluster.node_groups:
            parts = tuple(p.name for p in self.usable if group.name in p.node_groups
                          and p.gpu_hour_cost(group.gpu_type) is not None)
            for node, free in zip(group.nodes, group.free):
                if free > 0 and parts:
                    self.nodes.append((node, group.gpu_type, group.gpus_per_node, free, parts))
        self.gpus = sorted({n[1] for n in self.nodes})
        self.sizes = sorted({t for m in inst.models for t in tm.tp_degrees(m, policy.max_tp)})

    def pack_nodes(self) -> None:
        """q[n,t,p] (size-t stages on node n through partition p, Σ t·q ≤ free), e[m,g,t,p]
        (stages of model m, type g, size t in partition p, priced), supply rows tying e to q,
        and the quota rows."""
        lm, inst, nodes = self.lm, self.inst, self.nodes
        models, cluster, tm, policy = inst.models, inst.cluster, inst.throughput, inst.policy
        q_labels = [(n[0], t, p) for n in nodes for t in self.sizes if t <= n[3] for p in n[4]]
        q = dict(zip(q_labels, lm.add_vars("q", q_labels, 0.0, INF, integer=True)))
        cap_rows = dict(zip([n[0] for n in nodes],
                            lm.add_rows("node", [(n[0],) for n in nodes], -INF,
                                        [n[3] for n in nodes])))
        for (node, t, p), col in q.items():
            lm.add_terms(cap_rows[node], col, float(t))
        e_labels = [(m.name, g, t, part.name) for m in models for g in self.gpus
                    if m.allows_gpu(g) for t in tm.tp_degrees(m, policy.max_tp)
                    for part in self.usable if m.allows_partition(part.name) and any(
                        n[1] == g and part.name in n[4] and n[3] >= t for n in nodes)]
        by_name = {p.name: p for p in self.usable}
        e_cost = [by_name[p].stage_cost(g, t) for _, g, t, p in e_labels]
        self.e = dict(zip(e_labels, lm.add_vars("e", e_labels, 0.0, INF, integer=True,
                                                cost=e_cost)))
        supply_labels = sorted({(g, t, p) for _, g, t, p in e_labels})
        supply = dict(zip(supply_labels, lm.add_rows("supply", supply_labels, -INF, 0.0)))
        for (_, g, t, p), col in self.e.items():
            lm.add_terms(supply[(g, t, p)], col, 1.0)
        gpu_of = {n[0]: n[1] for n in nodes}
        for (node, t, p), col in q.items():
            if (gpu_of[node], t, p) in supply:
                lm.add_terms(supply[(gpu_of[node], t, p)], col, -1.0)
        if cluster.quotas:
            rows = lm.add_rows("quota", [(x.name,) for x in cluster.quotas], -INF,
                               [x.max_gpus for x in cluster.quotas])
            for row, quota in zip(rows, cluster.quotas):
                for (_, g, t, p), col in self.e.items():
                    if quota.matches(p, g):
                        lm.add_terms(row, col, float(t))

    def add_demand(self) -> None:
        """served[m] ≤ D_m covered by replicas, phi (fairness), the weighted-served row, the
        KV-fabric row and the replica-count rows."""
        lm, models, cluster = self.lm, self.inst.models, self.inst.cluster
        names = [(m.name,) for m in models]
        demand = np.array([m.demand_rps for m in models])
        self.served = lm.add_vars("served", names, 0.0, demand, integer=False)
        self.phi = lm.add_vars("phi", [()], 1.0, 1.0, integer=False)[0]
        self.cover = lm.add_rows("cover", names, 0.0, INF)
        lm.add_terms(self.cover, self.served, -1.0)
        fair = lm.add_rows("fair", names, 0.0, INF)
        lm.add_terms(fair, self.served, 1.0)
        lm.add_terms(fair, np.full(len(models), self.phi), -demand)
        self.weighted = lm.add_rows("weighted", [()], -INF, INF)[0]
        lm.add_terms(np.full(len(models), self.weighted), self.served,
                     [m.priority for m in models])
        self.fabric_row = None
        if cluster.kv_fabric_gbs is not None and any(m.disaggregation != "off" for m in models):
            self.fabric_row = _append_row(lm, "kv_fabric", (), -INF, cluster.kv_fabric_gbs * 1e9)
        self.count_rows = lm.add_rows(
            "replicas", names, [float(m.min_replicas) for m in models],
            [INF if m.max_replicas is None else float(m.max_replicas) for m in models])

    def add_model(self, mi: int, m: ModelSpec) -> None:
        """Model ``m``'s stage rows (Σ a − Σ_p e = 0 per GPU type and size), its disaggregated
        split, and its replica slots per role."""
        lm, inst = self.lm, self.inst
        tm, policy = inst.throughput, inst.policy
        tps = tm.tp_degrees(m, policy.max_tp)
        slots = _slots(inst.cluster, min(tps))
        if m.max_replicas is not None:
            slots = min(slots, m.max_replicas)
        stage_rows: dict[tuple[str, int], int] = {}
        for g in self.gpus:
            for t in tps:
                cols = [self.e[(m.name, g, t, p.name)] for p in self.usable
                        if (m.name, g, t, p.name) in self.e]
                if cols:
                    stage_rows[(g, t)] = _append_row(lm, "stages", (m.name, g, t), 0.0, 0.0)
                    for col in cols:
                        lm.add_terms(stage_rows[(g, t)], col, -1.0)
        roles = roles_for(m)
        cover_of = {"both": self.cover[mi]}
        if "prefill" in roles:  # split[m]: requests/s through prefill + decode replicas
            split = lm.add_vars(f"split_{m.name}", [(m.name,)], 0.0, m.demand_rps,
                                integer=False)[0]
            lm.add_terms(self.cover[mi], split, 1.0)
            for role in ("prefill", "decode"):
                cover_of[role] = _append_row(lm, f"cover_{role}", (m.name,), 0.0, INF)
                lm.add_terms(cover_of[role], split, -1.0)
            if self.fabric_row is not None:
                lm.add_terms(self.fabric_row, split, tm.kv_bytes_per_request(m))
        for role in roles:
            table = tm.table if role == "both" else {
                k[:4]: v for k, v in tm.phase_table.items() if k[4] == role}
            t_max = max((max(row) for k, row in table.items() if k[0] == m.name), default=0.0)
            previous: tuple[list[int], int] | None = None
            for r in range(slots):
                previous = self._replica_slot(mi, m, role, r, t_max, cover_of[role], stage_rows,
                                              previous)

    def _replica_slot(self, mi: int, m: ModelSpec, role: str, r: int, t_max: float,
                      cover_row: int, stage_rows: dict[tuple[str, int], int],
                      previous: tuple[list[int], int] | None) -> tuple[list[int], int]:
        """Replica slot r of ``m`` in ``role``: its throughput T, one layout (t, S) chosen by
        w, and per stage position the GPU type and layers held (a). Returns (w columns, T)
        for the next slot's symmetry-breaking rows."""
        lm, tm, policy = self.lm, self.inst.throughput, self.inst.policy
        L = tm.layers(m)
        options = [(t, S) for t in tm.tp_degrees(m, policy.max_tp)
                   for S in range(1, min(policy.n_max, L) + 1)]
        label = (m.name, role, r)
        T = lm.add_vars(f"T_{m.name}_{role}_{r}", [label], 0.0, t_max, integer=False)[0]
        lm.add_terms(cover_row, T, 1.0)
        one = _append_row(lm, "one_layout", label, -INF, 1.0)
        active = _append_row(lm, "active_cap", label, -INF, 0.0)  # T ≤ t_max Σ w
        lm.add_terms(active, T, 1.0)
        w_cols = []
        for t, S in options:
            w = lm.add_vars(f"w_{m.name}_{role}_{r}_{t}_{S}", [(*label, t, S)], 0.0, 1.0,
                            integer=True)[0]
            w_cols.append(w)
            lm.add_terms(one, w, 1.0)
            lm.add_terms(active, w, -t_max)
            lm.add_terms(self.count_rows[mi], w, 1.0)
            layer_row = _append_row(lm, "layers", (*label, t, S), 0.0, 0.0)
            lm.add_terms(layer_row, w, -float(L))
            keys_prev = None
            for s in range(S):
                keys = self._stage_position(m, role, label, t, S, s, T, w, t_max, layer_row,
                                            stage_rows)
                if keys_prev is not None:  # stages sorted by (type, layers): no symmetric copies
                    order = _append_row(lm, "stage_order", (*label, t, S, s), 0.0, INF)
                    lm.add_terms(order, [c for c, _ in keys_prev], [k for _, k in keys_prev])
                    lm.add_terms(order, [c for c, _ in keys], [-k for _, k in keys])
                keys_prev = keys
        if previous is not None:  # replicas sorted by throughput: no symmetric copies
            prev_active, prev_T = previous
            order = _append_row(lm, "replica_order", label, 0.0, INF)
            lm.add_terms(order, [prev_T, T], [1.0, -1.0])
            order = _append_row(lm, "replica_active", label, 0.0, INF)
            lm.add_terms(order, prev_active + w_cols,
                         [1.0] * len(prev_active) + [-1.0] * len(w_cols))
        return w_cols, T

    def _stage_position(self, m: ModelSpec, role: str, label: tuple, t: int, S: int, s: int,
                        T: int, w: int, t_max: float, layer_row: int,
                        stage_rows: dict[tuple[str, int], int]) -> list[tuple[int, int]]:
        """Stage s of layout (t, S): one (GPU type, layers held) pick when w is chosen, and T
        bounded by that pick's throughput. Returns (a column, sort key) pairs."""
        lm, tm = self.lm, self.inst.throughput
        L = tm.layers(m)
        pick = _append_row(lm, "pick", (*label, t, S, s), 0.0, 0.0)
        lm.add_terms(pick, w, -1.0)
        # T ≤ Σ thr·a + t_max·(1 − w): binds only when this option is taken
        bottleneck = _append_row(lm, "bottleneck", (*label, t, S, s), -INF, t_max)
        lm.add_terms(bottleneck, T, 1.0)
        lm.add_terms(bottleneck, w, t_max)
        keys = []
        for gi, g in enumerate(self.gpus):
            if (g, t) not in stage_rows:
                continue
            for held in range(1, L - S + 2):
                speed = tm.phase_throughput(m, g, t, held, S, role)
                if speed <= 0:
                    continue
                a = lm.add_vars(f"a_{m.name}_{role}_{label[2]}_{t}_{S}_{s}_{g}_{held}",
                                [(*label, t, S, s, g, held)], 0.0, 1.0, integer=True)[0]
                lm.add_terms(pick, a, 1.0)
                lm.add_terms(layer_row, a, float(held))
                lm.add_terms(bottleneck, a, -speed)
                lm.add_terms(stage_rows[(g, t)], a, 1.0)
                keys.append((a, gi * (L + 1) + held))
        return keys


def _append_row(lm: LinearModel, family: str, label: tuple, lower: float = 0.0,
                upper: float = 0.0) -> int:
    """Add one row to a family that may already exist (rows of a family stay contiguous only
    when added together; here the family just collects labels for reading)."""
    row = lm.num_rows
    lm.row_lower.append(float(lower))
    lm.row_upper.append(float(upper))
    fam = lm.row_families.get(family)
    if fam is None:
        from coral_solver.allocate_model import Family

        lm.row_families[family] = Family(family, [label], row)
    else:
        fam.labels.append(label)
    return row


def solve_joint(inst: Instance) -> JointResult:
    """Solve the joint MILP with the same lexicographic phases as Stage 2 (gap from the policy)."""
    import time

    began = time.perf_counter()
    lm, where = build_joint(inst)
    # HiGHS root restarts cost more than they save on these small, symmetric
    # models (measured: 3-5x slower); they change speed only, never the optimum
    highs = HighsSolver(lm, options={"mip_allow_restart": False})
    gap = inst.policy.mip_gap
    limit = inst.policy.time_limit_s
    # the phases in the order that proves fastest here: first the best served fraction (an
    # infeasibility proof of "all demand met" is slow on this model), then as in Stage 2
    phi, served = where["phi"], where["served"]
    highs.set_col_bounds([phi], 0.0, 1.0)
    objective = np.zeros(lm.num_cols)
    objective[phi] = -1.0
    highs.set_cost(objective)
    first = highs.solve(limit, gap)
    if first.x is None:
        return JointResult(first.status, math.inf, {}, {}, time.perf_counter() - began)
    best_phi = float(first.x[phi])
    phases: dict[str, float] = {}
    status = "optimal"
    if best_phi >= 1.0 - PHASE_TOLERANCE:
        highs.set_col_bounds([phi], 1.0, 1.0)
    else:
        status = "scarce"
        phases["min_served_fraction"] = best_phi
        highs.set_col_bounds([phi], max(best_phi - PHASE_TOLERANCE, 0.0), 1.0)
        objective = np.zeros(lm.num_cols)
        objective[served] = [-m.priority for m in inst.models]
        highs.set_cost(objective)
        second = highs.solve(limit, gap)
        best_weighted = -second.objective
        phases["weighted_served"] = best_weighted
        highs.set_row_bounds(where["weighted"],
                             best_weighted - PHASE_TOLERANCE * max(1.0, abs(best_weighted)), INF)
    highs.set_cost(where["cost"])
    result = highs.solve(limit, gap)
    if result.x is None:
        return JointResult(result.status, math.inf, {}, phases, time.perf_counter() - began)
    if result.status != "optimal":
        status = result.status
    served = {m.name: float(result.x[col]) for m, col in zip(inst.models, where["served"])}
    return JointResult(status, float(result.objective), served, phases, time.perf_counter() - began)
