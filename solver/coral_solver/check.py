"""An independent checker: re-verifies any plan from the raw inputs with plain numpy.

It shares no code with Stage 2's model: per-node GPU use is recomputed from the plan's own
placement, costs from the partitions' prices, capacity from the templates, and limits from the
quotas and replica bounds. :func:`check_plan` returns every problem found (empty = accepted).
"""

from __future__ import annotations

import numpy as np

from coral_solver.types import Cluster, ModelSpec, Plan, Policy, Template


def check_plan(
    plan: Plan,
    models: list[ModelSpec],
    cluster: Cluster,
    library: dict[str, list[Template]] | None = None,
    throughput=None,
    rel_tol: float = 1e-6,
    policy: Policy | None = None,
) -> list[str]:
    """Problems with ``plan``: availability and packing per node, partitions, costs, demand,
    quotas, replica bounds, and (given ``library``/``throughput``) the templates themselves.
    ``policy``: the one Stage 1 ran with (its ``capacity`` says how a template's throughput is
    re-checked; None: analytic)."""
    by_name = {m.name: m for m in models}
    tally = _Tally(cluster, by_name)
    library_ids = {m: {t.id: t for t in ts} for m, ts in (library or {}).items()}
    problems: list[str] = []
    for r, row in enumerate(plan.rows):
        problems += _check_row(r, row, tally, library_ids if library is not None else None,
                               throughput, rel_tol, policy)
    problems += _check_preemptible(plan, cluster)
    for r, row in enumerate(plan.queued):
        problems += _check_queued(r, row, by_name, tally.parts, cluster, tally.replicas)
    problems += _check_totals(plan, tally, rel_tol)
    for name, model in by_name.items():
        problems += _check_model(plan, model, tally, cluster, rel_tol)
    if cluster.kv_fabric_gbs is not None:
        problems += _check_fabric(plan, cluster, tally.role_capacity)
    return problems


class _Tally:
    """What the plan's rows add up to, recomputed from the raw inputs: GPUs used per node, GPUs
    per quota, capacity per model and role, replicas per model, and the total cost."""

    def __init__(self, cluster: Cluster, by_name: dict[str, ModelSpec]):
        self.by_name = by_name
        self.parts = {p.name: p for p in cluster.partitions}
        self.quotas = cluster.quotas
        self.excluded_stages = cluster.excluded_stages
        self.node_index: dict[str, int] = {}
        self.node_type: list[str] = []
        self.node_free: list[int] = []
        self.node_parts: list[set[str]] = []
        for group in cluster.node_groups:
            members = {p.name for p in cluster.partitions if group.name in p.node_groups}
            for node, free in zip(group.nodes, group.free):
                self.node_index[node] = len(self.node_type)
                self.node_type.append(group.gpu_type)
                self.node_free.append(free)
                self.node_parts.append(members)
        self.used = np.zeros(len(self.node_type), dtype=np.int64)
        self.role_capacity: dict[str, dict[str, float]] = {}
        self.replicas = dict.fromkeys(by_name, 0)
        self.quota_use = np.zeros(len(cluster.quotas))
        self.total = 0.0

    def capacity(self, name: str) -> float:
        """A disaggregated request needs one prefill and one decode: the lesser side counts."""
        roles = self.role_capacity.get(name)
        return 0.0 if roles is None else roles["both"] + min(roles["prefill"], roles["decode"])


def _check_row(r: int, row, tally: _Tally, library_ids: dict[str, dict[str, Template]] | None,
               throughput, rel_tol: float, policy: Policy | None = None) -> list[str]:
    """One placed row: its shape, template, stages' partitions and prices, placements and
    role; adds what it uses and serves to ``tally``."""
    t = row.template
    where = f"row {r} ({t.id})"
    model = tally.by_name.get(t.model)
    if model is None:
        return [f"{where}: model {t.model} is not configured"]
    if row.count < 1 or len(row.partitions) != t.pp or len(row.nodes) != row.count:
        return [f"{where}: count {row.count}, {len(row.partitions)} partitions for "
                f"{t.pp} stages, {len(row.nodes)} placements"]
    problems: list[str] = []
    if library_ids is not None:
        known = library_ids.get(t.model, {}).get(t.id)
        if known is None or abs(known.throughput - t.throughput) > rel_tol * known.throughput:
            problems.append(f"{where}: not in the Stage-1 library with this throughput")
    if throughput is not None:
        problems += _check_template(t, model, throughput, rel_tol, policy)
    cost = _check_stages(where, row, model, tally, problems)
    if abs(cost - row.cost_per_hour) > rel_tol * max(cost, 1.0):
        problems.append(f"{where}: cost_per_hour {row.cost_per_hour} but prices give {cost}")
    _check_placements(where, row, tally, problems)
    roles = tally.role_capacity.setdefault(t.model, {"both": 0.0, "prefill": 0.0, "decode": 0.0})
    if t.role not in roles:
        problems.append(f"{where}: role {t.role!r} is not both, prefill or decode")
        return problems
    if t.role != "both" and model.disaggregation == "off":
        problems.append(f"{where}: {t.role} replica but {model.name} is not disaggregated")
    if t.role == "both" and model.disaggregation == "on":
        problems.append(f"{where}: aggregated replica but {model.name} is disaggregated only")
    roles[t.role] += row.count * t.throughput
    tally.replicas[t.model] += row.count
    tally.total += row.count * cost
    return problems


def _check_stages(where: str, row, model: ModelSpec, tally: _Tally, problems: list[str]) -> float:
    """Each stage's partition: usable, allowed, not excluded, priced; returns the row's price
    per replica and counts its GPUs against the quotas."""
    t = row.template
    cost = 0.0
    for s, (stage, p) in enumerate(zip(t.stages, row.partitions)):
        part = tally.parts.get(p)
        if part is None or not part.usable:
            problems.append(f"{where}: stage {s} partition {p} is unknown or not usable")
            continue
        if not model.allows_partition(p) or not model.allows_gpu(stage.gpu_type):
            problems.append(f"{where}: stage {s} on {p}/{stage.gpu_type} not allowed for {model.name}")
        if (t.id, stage.gpu_type, p) in tally.excluded_stages:
            problems.append(f"{where}: stage {s} on {p}/{stage.gpu_type} is excluded")
        price = part.stage_cost(stage.gpu_type, t.tp)
        if price is None:
            problems.append(f"{where}: partition {p} has no price for {stage.gpu_type}")
            continue
        cost += price
        for q, quota in enumerate(tally.quotas):
            if quota.matches(p, stage.gpu_type):
                tally.quota_use[q] += row.count * t.tp
    return cost


def _check_placements(where: str, row, tally: _Tally, problems: list[str]) -> None:
    """Each replica's nodes: one per stage, of the stage's GPU type, in its partition; counts
    the GPUs each node gives."""
    t = row.template
    for placed in row.nodes:
        if len(placed) != t.pp:
            problems.append(f"{where}: placement {placed} has not one node per stage")
            continue
        for s, (node, stage, p) in enumerate(zip(placed, t.stages, row.partitions)):
            i = tally.node_index.get(node)
            if i is None:
                problems.append(f"{where}: stage {s} on unknown node {node}")
                continue
            if tally.node_type[i] != stage.gpu_type:
                problems.append(f"{where}: stage {s} needs {stage.gpu_type}, node {node} has "
                                f"{tally.node_type[i]}")
            if p not in tally.node_parts[i]:
                problems.append(f"{where}: node {node} is not in partition {p}")
            tally.used[i] += t.tp


def _check_totals(plan: Plan, tally: _Tally, rel_tol: float) -> list[str]:
    """GPUs per node and per quota within what is free, and the plan's cost the rows' sum."""
    problems = []
    over = np.nonzero(tally.used > np.asarray(tally.node_free, dtype=np.int64))[0]
    names = list(tally.node_index)
    for n in over:
        problems.append(f"node {names[n]}: {tally.used[n]} GPUs planned, "
                        f"{tally.node_free[n]} available")
    for q, quota in enumerate(tally.quotas):
        if tally.quota_use[q] > quota.max_gpus:
            problems.append(f"quota {quota.name}: {tally.quota_use[q]:g} GPUs planned, "
                            f"limit {quota.max_gpus}")
    if abs(tally.total - plan.cost_per_hour) > rel_tol * max(tally.total, 1.0):
        problems.append(f"cost_per_hour {plan.cost_per_hour} but rows sum to {tally.total}")
    return problems


def _check_model(plan: Plan, model: ModelSpec, tally: _Tally, cluster: Cluster,
                 rel_tol: float) -> list[str]:
    """One model's capacity, served rate, demand and replica bounds against the rows."""
    problems = []
    name = model.name
    capacity = tally.capacity(name)
    replicas = tally.replicas[name]
    if abs(capacity - plan.capacity.get(name, 0.0)) > rel_tol * max(capacity, 1.0):
        problems.append(f"model {name}: capacity {plan.capacity.get(name)} but rows give {capacity}")
    served = min(capacity, model.demand_rps)
    claimed = plan.served.get(name, 0.0)
    if cluster.kv_fabric_gbs is not None and tally.role_capacity.get(name, {}).get("prefill"):
        # the shared KV fabric may hold a disaggregated model below its replicas' capacity
        # (checked over all models below); never above
        if claimed > served + rel_tol * max(served, 1.0):
            problems.append(f"model {name}: served {claimed} but rows give at most {served}")
    elif abs(served - claimed) > rel_tol * max(served, 1.0):
        problems.append(f"model {name}: served {claimed} but rows give {served}")
    if plan.status in ("optimal", "feasible") and min(capacity, claimed) < \
            model.demand_rps * (1 - rel_tol):
        problems.append(f"model {name}: demand {model.demand_rps} not met ({capacity})")
    queued = sum(row.count for row in plan.queued if row.model == name)
    if replicas + queued < model.min_replicas:
        problems.append(f"model {name}: {replicas} replicas (+{queued} queued) < "
                        f"min_replicas {model.min_replicas}")
    if model.max_replicas is not None and replicas > model.max_replicas:
        problems.append(f"model {name}: {replicas} replicas > max_replicas {model.max_replicas}")
    return problems


def _check_queued(r: int, row, by_name, parts, cluster: Cluster, replicas) -> list[str]:
    """A queued replica: one job of one homogeneous shape, allowed and priced where it queues,
    for a model the plan gives no other replica."""
    t = row.template
    where = f"queued row {r} ({t.id})"
    model = by_name.get(t.model)
    if model is None:
        return [f"{where}: model {t.model} is not configured"]
    out = []
    if replicas.get(t.model, 0) > 0 and replicas[t.model] + row.count > model.min_replicas:
        out.append(f"{where}: {t.model} already has replicas in the plan")
    if row.count < 1 or len(set(row.partitions)) != 1 or t.heterogeneous:
        out.append(f"{where}: a queued replica is one job of one shape")
    for stage, p in zip(t.stages, row.partitions):
        part = parts.get(p)
        if part is None or not part.usable or part.stage_cost(stage.gpu_type, t.tp) is None:
            out.append(f"{where}: partition {p} is unknown, not usable or has no price for "
                       f"{stage.gpu_type}")
        elif not model.allows_partition(p) or not model.allows_gpu(stage.gpu_type):
            out.append(f"{where}: {p}/{stage.gpu_type} not allowed for {model.name}")
        if (t.id, stage.gpu_type, p) in cluster.excluded_stages:
            out.append(f"{where}: {p}/{stage.gpu_type} is excluded")
    return out

def _check_fabric(plan: Plan, cluster: Cluster, role_capacity: dict[str, dict[str, float]]
                  ) -> list[str]:
    """The KV bytes/s the served demand needs at least (what aggregated replicas cannot take
    goes prefill → decode) fit in the site's fabric."""
    need = 0.0
    for row in plan.rows:
        if row.role == "prefill":
            roles = role_capacity[row.model]
            through = max(plan.served.get(row.model, 0.0) - roles["both"], 0.0)
            need += through * row.template.kv_bytes_per_request * row.count * row.throughput \
                / max(roles["prefill"], 1e-12)
    # check_plan calls this only for a cluster with a fabric limit
    assert cluster.kv_fabric_gbs is not None
    limit = cluster.kv_fabric_gbs * 1e9
    if need > limit * (1 + 1e-6) + 1e-6:
        return [f"kv fabric: {need / 1e9:.4g} GB/s of KV transfers planned, limit {limit / 1e9:.4g}"]
    return []


def _check_template(t: Template, model: ModelSpec, tm, rel_tol: float,
                    policy: Policy | None = None) -> list[str]:
    """Layers add up, TP is valid, and every stage sustains the template's throughput (with
    simulated capacity: the whole replica, simulated again, sustains it)."""
    out = []
    layers = tm.layers(model)
    if sum(s.layers for s in t.stages) != layers or min(s.layers for s in t.stages) < 1:
        out.append(f"template {t.id}: layers {t.layer_partition} do not split {layers}")
    if t.tp not in tm.tp_degrees(model, max(t.tp, 1)):
        out.append(f"template {t.id}: TP {t.tp} not valid for {model.arch}")
    if t.role != "both":
        from coral_solver.roles import check_phase_template

        return out + check_phase_template(t, model, tm, rel_tol, policy)
    simulated = (policy is not None and policy.capacity == "simulated"
                 and hasattr(tm, "simulated_throughput"))
    measured = getattr(tm, "measured", None)
    if simulated and not (t.pp == 1 and measured is not None
                          and measured(model, t.stages[0].gpu_type, t.tp)):
        speed = tm.simulated_throughput(model, t, policy.slo_attainment)  # type: ignore[union-attr]
        if speed < t.throughput * (1 - rel_tol):
            out.append(f"template {t.id}: the replica simulated serves {speed:.4g} < "
                       f"{t.throughput:.4g} req/s within SLO")
        return out
    for stage in t.stages:
        speed = tm.throughput(model, stage.gpu_type, t.tp, stage.layers, t.pp)
        if speed < t.throughput * (1 - rel_tol):
            out.append(f"template {t.id}: stage {stage.gpu_type} with {stage.layers} layers "
                       f"sustains {speed:.4g} < {t.throughput:.4g} req/s")
    return out


def _check_preemptible(plan: Plan, cluster: Cluster) -> list[str]:
    """A replica with a stage on a preemptible partition is preemptible as a whole; a model may
    have such replicas only beside one that is not (never its only replica)."""
    preemptible = cluster.preemptible()
    if not preemptible:
        return []
    exposed: dict[str, int] = {}
    safe: dict[str, int] = {}
    problems = []
    for r, row in enumerate(plan.rows):
        hit = [p in preemptible for p in row.partitions]
        if any(hit) and not all(hit):
            problems.append(f"row {r} ({row.template.id}): stages on preemptible and other "
                            "partitions in one replica")
        counter = exposed if any(hit) else safe
        counter[row.model] = counter.get(row.model, 0) + row.count
    for model in sorted(exposed):
        if not safe.get(model):
            problems.append(f"model {model}: {exposed[model]} replica(s) on preemptible "
                            "partitions and none elsewhere")
    for r, row in enumerate(plan.queued):
        if any(p in preemptible for p in row.partitions):
            problems.append(f"queued row {r} ({row.template.id}): a model's only replica "
                            "queued on a preemptible partition")
    return problems
