"""Baselines Coral is compared with, on the same library, cluster and prices.

- :func:`homo`: every replica of a model on one GPU type — the best type per model (cheapest when
  the model is planned alone) — then all models planned together on their types.
- :func:`melange`: Mélange-style — each model planned alone, in priority order, on what the
  previous ones left; replicas single-GPU-type (types may differ between replicas).
- :func:`cauchy`: Cauchy-style greedy — per model, homogeneous templates ranked by tokens per
  unit cost; replicas of the best one that still fits (first fit on nodes) until demand is met.
- :func:`paper_homo`: the Coral paper's Homo — per model ONE homogeneous strategy, the one with
  the best goodput per cost that still fits, replicated greedily (first fit) until demand is met
  or it no longer fits; no fallback to another strategy.
- :func:`cauchy_adapted`: the Coral paper's Cauchy adaptation — per phase, homogeneous GPU combos
  ranked by tokens per cost: with role templates (``role`` "prefill"/"decode"), prefill replicas
  ranked by prompt tokens per cost and decode replicas by output tokens per cost, each sized to the
  demand; without them (every replica serves both phases) it is :func:`cauchy`.

Each returns a :class:`~coral_solver.types.Plan` the checker (:mod:`coral_solver.check`) accepts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import replace

from coral_solver.allocate import allocate
from coral_solver.types import (
    Cluster,
    ModelSpec,
    NodeGroup,
    Plan,
    PlanRow,
    Policy,
    Quota,
    Template,
    served_capacity,
)


def _single_type(templates: list[Template], gpu: str | None = None) -> list[Template]:
    """Aggregated (role "both") templates on one GPU type (``gpu``, or any single type)."""
    return [t for t in templates if not t.heterogeneous and t.role == "both"
            and (gpu is None or t.stages[0].gpu_type == gpu)]


def _single_type_any_role(templates: list[Template]) -> list[Template]:
    """Templates on one GPU type, of any role."""
    return [t for t in templates if not t.heterogeneous]


def combine(models: list[ModelSpec], plans: list[Plan], seconds: float) -> Plan:
    """One plan out of per-model plans (rows concatenated, figures recomputed)."""
    rows = tuple(row for plan in plans for row in plan.rows)
    capacity = Counter(served_capacity(rows))
    demand = {m.name: m.demand_rps for m in models}
    served = {m.name: min(demand[m.name], capacity[m.name]) for m in models}
    met = all(served[m.name] >= m.demand_rps * (1 - 1e-9) for m in models)
    statuses = {plan.status for plan in plans}
    status = "optimal" if met and statuses <= {"optimal"} else ("feasible" if met else "scarce")
    return Plan(
        rows=rows,
        demand=demand,
        served=served,
        capacity={m.name: capacity[m.name] for m in models},
        cost_per_hour=sum(row.count * row.cost_per_hour for row in rows),
        status=status,
        gap=max((plan.gap for plan in plans), default=0.0),
        solve_seconds=seconds,
        binding=tuple(b for plan in plans for b in plan.binding),
    )


def subtract(cluster: Cluster, plan: Plan) -> Cluster:
    """The cluster left after ``plan``: its placed stages taken off the nodes and the quotas."""
    used: Counter[str] = Counter()
    quota_used: Counter[str] = Counter()
    for row in plan.rows:
        for placed in row.nodes:
            for node in placed:
                used[node] += row.template.tp
        for stage, p in zip(row.template.stages, row.partitions):
            for quota in cluster.quotas:
                if quota.matches(p, stage.gpu_type):
                    quota_used[quota.name] += row.count * row.template.tp
    groups = tuple(
        replace(g, free=tuple(max(f - used[n], 0) for n, f in zip(g.nodes, g.free)))
        for g in cluster.node_groups
    )
    quotas = tuple(replace(q, max_gpus=max(q.max_gpus - quota_used[q.name], 0)) for q in cluster.quotas)
    return replace(cluster, node_groups=groups, quotas=quotas, running=())


def homo(models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster,
         policy: Policy | None = None) -> Plan:
    """Every replica of a model on one GPU type: the type cheapest for the model alone."""
    began = time.perf_counter()
    policy = policy if policy is not None else Policy()
    chosen: dict[str, list[Template]] = {}
    for model in models:
        best_key, best = None, []
        for gpu in sorted({t.stages[0].gpu_type for t in _single_type(library.get(model.name, []))}):
            subset = _single_type(library[model.name], gpu)
            alone = allocate([model], {model.name: subset}, replace(cluster, running=()), policy)
            key = (-alone.served[model.name], alone.cost_per_hour)
            if alone.rows and (best_key is None or key < best_key):
                best_key, best = key, subset
        chosen[model.name] = best
    plan = allocate(models, chosen, replace(cluster, running=()), policy)
    return replace(plan, solve_seconds=time.perf_counter() - began)


def melange(models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster,
            policy: Policy | None = None) -> Plan:
    """Each model alone (priority order) on what is left; single-type replicas of any type."""
    began = time.perf_counter()
    policy = policy if policy is not None else Policy()
    left = replace(cluster, running=())
    plans = []
    for model in sorted(models, key=lambda m: (-m.priority, m.name)):
        plan = allocate([model], {model.name: _single_type(library.get(model.name, []))}, left, policy)
        plans.append(plan)
        left = subtract(left, plan)
    return combine(models, plans, time.perf_counter() - began)


def cauchy(models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster,
           policy: Policy | None = None) -> Plan:
    """Greedy by tokens per unit cost over homogeneous templates, first fit on nodes."""
    return _greedy(models, {m.name: _single_type(library.get(m.name, [])) for m in models},
                   cluster, fallback=True)


def paper_homo(models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster,
               policy: Policy | None = None,
               strategy: Callable[[Template], Hashable] | None = None) -> Plan:
    """The paper's Homo: per model its one best homogeneous strategy (goodput per cost) among
    those that still fit, replicated first-fit until demand is met or it fits no more.

    ``strategy`` maps a template to its strategy (default: the template itself); templates of
    one strategy are interchangeable placements of it (e.g. the same layout in another region),
    tried in their own goodput-per-cost order."""
    return _greedy(models, {m.name: _single_type(library.get(m.name, [])) for m in models},
                   cluster, fallback=False, strategy=strategy)


def cauchy_adapted(models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster,
                   policy: Policy | None = None) -> Plan:
    """The paper's Cauchy adaptation: per phase, homogeneous templates ranked by that phase's
    tokens per cost (see the module doc); :func:`cauchy` when no template has a phase role."""
    homogeneous = {m.name: _single_type_any_role(library.get(m.name, [])) for m in models}
    if not any(t.role != "both" for ts in homogeneous.values() for t in ts):
        return cauchy(models, library, cluster, policy)
    phases = []
    for role in ("prefill", "decode"):
        phases.append({name: [t for t in ts if t.role == role] for name, ts in homogeneous.items()})
    return _greedy(models, phases[0], cluster, fallback=True, phases=phases)


def _tokens_per_cost(template: Template, model: ModelSpec, cost: float) -> float:
    """Tokens of the template's phase per unit cost: prompt tokens for prefill replicas, output
    tokens otherwise (a replica serving both phases is ranked by what the user reads)."""
    tokens = model.input_tokens if template.role == "prefill" else model.output_tokens
    return template.throughput * tokens / cost


def _greedy(models: list[ModelSpec], candidates: dict[str, list[Template]], cluster: Cluster,
            fallback: bool, strategy: Callable[[Template], Hashable] | None = None,
            phases: list[dict[str, list[Template]]] | None = None) -> Plan:
    """Per model (priority order), replicas of its templates in tokens-per-cost order, first fit
    on nodes, until the model's demand is met. ``fallback`` False: only the best strategy's
    templates; ``phases``: one candidate set per phase, each sized to the whole demand."""
    began = time.perf_counter()
    free = {n: f for g in cluster.node_groups for n, f in zip(g.nodes, g.free)}
    group_of = {n: g for g in cluster.node_groups for n in g.nodes}
    quota_left = {q.name: q.max_gpus for q in cluster.quotas}
    rows: Counter = Counter()
    placements: dict[tuple[Template, tuple[str, ...], float], list[tuple[str, ...]]] = {}
    key_of = strategy if strategy is not None else (lambda t: t)
    for model in sorted(models, key=lambda m: (-m.priority, m.name)):
        for phase in (phases if phases is not None else [candidates]):
            options = []
            for t in phase.get(model.name, []):
                for part in cluster.partitions:
                    if not part.usable or not model.allows_partition(part.name):
                        continue
                    cost = part.stage_cost(t.stages[0].gpu_type, t.tp)
                    if cost is None or cost <= 0:
                        continue
                    options.append((-_tokens_per_cost(t, model, cost * t.pp), t.id, part.name, t,
                                    cost * t.pp))
            options.sort(key=lambda o: o[:3])
            capacity = 0.0
            count = 0
            chosen = None  # without fallback: the strategy of the first replica placed
            for _rank, _id, part_name, template, cost in options:
                if not fallback and chosen is not None and key_of(template) != chosen:
                    continue
                while capacity < model.demand_rps - 1e-9 or count < model.min_replicas:
                    if model.max_replicas is not None and count >= model.max_replicas:
                        break
                    nodes = _first_fit(template, part_name, cluster, free, group_of, quota_left)
                    if nodes is None:
                        break
                    key = (template, (part_name,) * template.pp, cost)
                    rows[key] += 1
                    placements.setdefault(key, []).append(nodes)
                    capacity += template.throughput
                    count += 1
                    chosen = key_of(template) if chosen is None else chosen
    plan_rows = tuple(PlanRow(t, parts, n, cost, tuple(placements[(t, parts, cost)]))
                      for (t, parts, cost), n in rows.items())
    single = Plan(plan_rows, {}, {}, {}, 0.0, "feasible", 0.0, 0.0)
    return combine(models, [single], time.perf_counter() - began)


def _first_fit(template: Template, partition: str, cluster: Cluster, free: dict[str, int],
               group_of: dict[str, NodeGroup], quota_left: dict[str, int]) -> tuple[str, ...] | None:
    part = next(p for p in cluster.partitions if p.name == partition)
    gpu = template.stages[0].gpu_type
    quotas: list[Quota] = [q for q in cluster.quotas if q.matches(partition, gpu)]
    need = template.tp * template.pp
    if any(quota_left[q.name] < need for q in quotas):
        return None
    chosen: list[str] = []
    trial = dict(free)
    for _ in template.stages:
        node = next((n for n in sorted(trial) if trial[n] >= template.tp
                     and group_of[n].gpu_type == gpu and group_of[n].name in part.node_groups), None)
        if node is None:
            return None
        trial[node] -= template.tp
        chosen.append(node)
    free.update(trial)
    for q in quotas:
        quota_left[q.name] -= need
    return tuple(chosen)
