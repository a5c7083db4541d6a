"""From Stage 2's solution to a plan: which nodes each replica's stages take (:func:`decode`),
and the plan with its served demand, costs and the constraints that bind
(:func:`assemble_plan`)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from coral_solver.allocate_data import Prepared
from coral_solver.allocate_model import Stage2Model, job_cap
from coral_solver.types import Plan, PlanRow, Template, served_capacity

# --------------------------------------------------------------------------- decoding


def decode(sm: Stage2Model, x: np.ndarray) -> list[PlanRow]:
    """Turn a solution into plan rows: replicas per (template, partition of each stage), each
    with a node per stage (the packing the model chose, made concrete)."""
    data = sm.data
    nu = np.rint(x[sm.nu]).astype(int)
    sigma = {key: round(float(x[col])) for col, key in zip(sm.sigma["sigma"], sm.sigma["keys"])}
    slots = _slot_pools(sm, x, sigma)
    rows: Counter = Counter()
    nodes: dict[tuple[int, tuple[str, ...]], list[tuple[str, ...]]] = {}
    for j, count in enumerate(nu):
        if count <= 0:
            continue
        template = data.templates[j]
        pool = {g: Counter({p: sigma.get((j, g, p), 0) for p in parts})
                for g, parts in data.stage_parts[j].items()}
        replicas: list[tuple[str, ...]] = []
        # keep running replicas where they are, as far as the plan's partitions allow
        for (jj, parts), running in sorted(data.running_replicas.items()):
            if jj != j:
                continue
            for _ in range(running):
                if len(replicas) == count or not _take(pool, template, parts):
                    break
                replicas.append(parts)
        while len(replicas) < count:
            chosen: list[str] = []
            for stage in template.stages:
                options = pool[stage.gpu_type]
                previous = chosen[-1] if chosen else None
                choice = previous if previous and options[previous] > 0 else max(
                    sorted(options), key=lambda p: options[p])
                options[choice] -= 1
                chosen.append(choice)
            replicas.append(tuple(chosen))
        for parts in replicas:
            rows[(j, parts)] += 1
            placed: list[str] = []
            for stage, p in zip(template.stages, parts):
                placed.append(_pop_slot(slots, stage.gpu_type, template.tp, p, avoid=placed))
            nodes.setdefault((j, parts), []).append(tuple(placed))
    wait_of = {node: cls.wait_s for cls in data.classes for node in cls.nodes}
    out = []
    for (j, parts), count in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        template = data.templates[j]
        cost = sum(data.stage_cost[(p, s.gpu_type, template.tp)]
                   for s, p in zip(template.stages, parts))
        replica_nodes = tuple(nodes[(j, parts)])
        # a replica starts when its last stage's node is given to us
        waits = tuple(max((wait_of.get(n, 0.0) for n in replica), default=0.0)
                      for replica in replica_nodes)
        out.append(PlanRow(template, parts, count, cost, replica_nodes, waits))
    return out


def _take(pool: dict[str, Counter], template: Template, parts: tuple[str, ...]) -> bool:
    need = Counter((s.gpu_type, p) for s, p in zip(template.stages, parts))
    if any(pool.get(g, Counter())[p] < n for (g, p), n in need.items()):
        return False
    for (g, p), n in need.items():
        pool[g][p] -= n
    return True


def _slot_pools(sm: Stage2Model, x: np.ndarray, sigma: dict
                ) -> dict[tuple[str, int, str], list[str]]:
    """Node names per (gpu, size, partition) slot, from the chosen patterns and slot routing."""
    data = sm.data
    packing = sm.packing
    # per class: the size-t slots on its nodes, node by node, following the chosen patterns
    class_slots: dict[tuple[int, int], list[str]] = {}
    next_node: Counter[int] = Counter()
    for col, (k, pi) in zip(packing["y"], packing["y_labels"]):
        cls = data.classes[k]
        pattern = data.patterns[(cls.gpu_type, cls.free)][pi]
        for _ in range(round(float(x[col]))):
            node = cls.nodes[next_node[k]]
            next_node[k] += 1
            for size, count in pattern.items():
                class_slots.setdefault((k, size), []).extend([node] * count)
    need: Counter[tuple[str, int, str]] = Counter()
    for (j, g, p), count in sigma.items():
        need[(g, data.templates[j].tp, p)] += count
    pools: dict[tuple[str, int, str], list[str]] = {}
    # first follow the solver's routing z[k,t,p], then fill any rounding gap from classes that
    # may serve the partition
    for col, (k, t, p) in zip(packing["z"], packing["z_labels"]):
        key = (data.classes[k].gpu_type, t, p)
        want = min(round(float(x[col])), need[key] - len(pools.get(key, [])))
        free = class_slots.get((k, t), [])
        take, class_slots[(k, t)] = free[:max(want, 0)], free[max(want, 0):]
        pools.setdefault(key, []).extend(take)
    for key, count in need.items():
        g, t, p = key
        pool = pools.setdefault(key, [])
        for k, cls in enumerate(data.classes):
            if len(pool) >= count:
                break
            if cls.gpu_type == g and p in cls.partitions:
                free = class_slots.get((k, t), [])
                missing = count - len(pool)
                pool.extend(free[:missing])
                class_slots[(k, t)] = free[missing:]
    return pools


def _pop_slot(slots: dict, gpu: str, tp: int, partition: str, avoid=()) -> str:
    """A node for one stage; prefers a node the replica does not use yet (Slurm gives each
    node of a job, or each hetjob component, a node of its own)."""
    pool = slots.get((gpu, tp, partition), [])
    if not pool:
        return "?"
    for i, node in enumerate(pool):
        if node not in avoid:
            return pool.pop(i)
    return pool.pop(0)


# --------------------------------------------------------------------------- plan assembly


def assemble_plan(data: Prepared, rows: list[PlanRow], status: str, gap: float, seconds: float,
          phases: dict[str, float], solved: dict[str, float] | None = None) -> Plan:
    capacity = {m.name: 0.0 for m in data.models}
    capacity.update(served_capacity(rows))  # a disaggregated request needs prefill and decode
    demand = {m.name: m.demand_rps for m in data.models}
    served = {name: min(demand[name], capacity[name]) for name in demand}
    if data.cluster.kv_fabric_gbs is not None and solved is not None:
        # the shared KV fabric may carry less than the replicas could serve: the solver's
        # split between models is what the plan serves
        phased = {r.model for r in rows if r.role != "both"}
        for name in phased:
            served[name] = min(served[name], max(float(solved[name]), 0.0))
    cost = sum(row.count * row.cost_per_hour for row in rows)
    return Plan(
        rows=tuple(rows),
        demand=demand,
        served=served,
        capacity=capacity,
        cost_per_hour=cost,
        status=status,
        gap=gap,
        solve_seconds=seconds,
        binding=tuple(binding_constraints(data, rows, served)),
        phases=phases,
    )


def binding_constraints(data: Prepared, rows: list[PlanRow], served: dict[str, float]) -> list[str]:
    """Constraints at their limit in this plan, in words (what a user would relax)."""
    out = []
    used_type: Counter = Counter()
    used_quota: Counter = Counter()
    replicas: Counter = Counter()
    for row in rows:
        replicas[row.model] += row.count
        for stage, p in zip(row.template.stages, row.partitions):
            used_type[stage.gpu_type] += row.count * row.template.tp
            for quota in data.cluster.quotas:
                if quota.matches(p, stage.gpu_type):
                    used_quota[quota.name] += row.count * row.template.tp
    free_type: Counter = Counter()
    for cls in data.classes:
        free_type[cls.gpu_type] += cls.free * len(cls.nodes)
    for gpu in sorted(used_type):
        if used_type[gpu] >= free_type[gpu]:
            out.append(f"gpus {gpu}: all {free_type[gpu]} available GPUs used")
    for quota in data.cluster.quotas:
        if used_quota[quota.name] >= quota.max_gpus:
            out.append(f"quota {quota.name}: {used_quota[quota.name]} of {quota.max_gpus} GPUs")
    for why, count in sorted(data.limit_drops.items()):
        out.append(f"site limit {why}: {count} template placement(s) kept out")
    cap = job_cap(data.cluster.job_limits)
    if cap is not None and sum(replicas.values()) >= cap:
        limits = data.cluster.job_limits
        names = [f"MaxJobs={limits.max_jobs}" if limits.max_jobs is not None else "",
                 f"MaxSubmit={limits.max_submit}" if limits.max_submit is not None else ""]
        out.append(f"site limit {' / '.join(n for n in names if n)}: {sum(replicas.values())} "
                   f"replica jobs planned, {limits.other_jobs} other job(s) of this user")
    preemptible = data.cluster.preemptible()
    if preemptible:
        offered = {data.models[int(data.model_of[j])].name for j, parts in
                   enumerate(data.stage_parts) if any(p in preemptible for ps in parts.values()
                                                       for p in ps)}
        for row in rows:
            if any(p in preemptible for p in row.partitions):
                out.append(f"risk: {row.count} replica(s) of {row.model} on preemptible "
                           f"{', '.join(sorted(set(row.partitions) & preemptible))}: Slurm may "
                           "preempt them (resubmitted when it does); the model keeps a replica "
                           "elsewhere")
        for name in sorted(offered):
            if not any(r.model == name and not (set(r.partitions) & preemptible) for r in rows):
                out.append(f"model {name}: preemptible partitions unused: never a model's only "
                           "replica")
    for model in data.models:
        if model.max_replicas is not None and replicas[model.name] >= model.max_replicas:
            out.append(f"model {model.name}: max_replicas {model.max_replicas} reached")
        if model.min_replicas and replicas[model.name] == model.min_replicas:
            out.append(f"model {model.name}: min_replicas {model.min_replicas} held")
        if served[model.name] < model.demand_rps * (1 - 1e-9):
            out.append(
                f"model {model.name}: demand {model.demand_rps:.4g} req/s, "
                f"served {served[model.name]:.4g}"
            )
    return out
