"""Deployment + ClusterSnapshot (+ demand) → solver inputs → a plan, and the plan as data.

The one adapter between coral-hpc and the pure ``solver`` package (ARCHITECTURE.md):

- :func:`model_specs`: configured models with the demand (requests/s of their mix) to plan for;
- :func:`cluster_from_snapshot`: node groups with available GPUs per node (free + held by this
  deployment's running replicas, 0 on nodes that are down or draining), the configured
  partitions Slurm knows with their prices (per GPU-hour, or Slurm billing of the replica job
  shape: GPUs, ``cpus_per_gpu`` × GPUs CPUs, ``mem_per_gpu_gb`` × GPUs memory, per hour with the
  partition's TRESBillingWeights), deployment quotas and the account's QOS/association GPU
  limits, and the running replicas (start-up penalty);
- :func:`plan_deployment`: Stage 1 (disk cache) and Stage 2, checked by the independent checker;
- :func:`plan_json` / :func:`templates_json`: the ``coral-hpc plan --json`` and
  ``--export-templates`` documents.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from coral_hpc import availability
from coral_hpc.config import Deployment
from coral_hpc.demand import deployment_demand
from coral_hpc.slurm.snapshot import ClusterSnapshot
from solver.allocate import allocate
from solver.catalog import gpu_memory_gb
from solver.check import check_plan
from solver.templates import PerfThroughput, ThroughputModel, build_library
from solver.types import (
    Billing,
    Cluster,
    ModelSpec,
    NodeGroup,
    Plan,
    Policy,
    Quota,
    RunningReplica,
    Template,
)
from solver.types import Partition as SolverPartition


def model_specs(deployment: Deployment, demand_rps: Mapping[str, float] | None = None,
                mix: Mapping[str, tuple[int, int]] | None = None) -> list[ModelSpec]:
    """One :class:`ModelSpec` per configured model. Demand: ``demand_rps[name]`` when given, else
    the declared demand (0 for ``demand: auto`` until it is measured); mix likewise."""
    out = []
    for m in deployment.models:
        rps = (demand_rps or {}).get(m.name, m.demand_rps)
        inp, outp = (mix or {}).get(m.name, (m.mix.input_tokens, m.mix.output_tokens))
        out.append(ModelSpec(
            name=m.name, arch=m.architecture, input_tokens=inp, output_tokens=outp,
            ttft_s=m.slo.ttft_s, tpot_s=m.slo.tpot_s, demand_rps=float(rps or 0.0),
            priority=m.priority, min_replicas=m.min_replicas, max_replicas=m.max_replicas,
            gpu_types=tuple(m.gpu_types), partitions=tuple(m.partitions),
        ))
    return out


def billing_of(weights: Mapping[str, float], cpus_per_gpu: int, mem_per_gpu_gb: float) -> Billing:
    """A partition's TRESBillingWeights (lower-case keys, ``mem`` per GB) as the solver's billing
    of a replica stage's job shape. With no weights at all Slurm bills the CPU count."""
    if not weights:
        return Billing(cpu=1.0, cpus_per_gpu=cpus_per_gpu, mem_per_gpu_gb=float(mem_per_gpu_gb))
    by_type = {key.split(":", 1)[1]: value for key, value in weights.items()
               if key.startswith("gres/gpu:")}
    return Billing(cpu=weights.get("cpu", 0.0), mem_gb=weights.get("mem", 0.0),
                   gpu=weights.get("gres/gpu", 0.0), gpu_by_type=by_type,
                   node=weights.get("node", 0.0),
                   cpus_per_gpu=cpus_per_gpu, mem_per_gpu_gb=float(mem_per_gpu_gb))


def own_running(snapshot: ClusterSnapshot) -> tuple[tuple[RunningReplica, ...], dict[str, int]]:
    """This deployment's RUNNING replicas (template, partition per stage) and the GPUs they hold
    per node (which count as available: otherwise every epoch would churn)."""
    counts: Counter = Counter()
    held: Counter = Counter()
    for job in snapshot.jobs:
        if job.tag is None or not job.tag.template_id or job.state != "RUNNING":
            continue
        components = job.components or (job,)
        parts = tuple(c.partition for c in components)
        if not job.components and job.num_nodes > 1:
            parts = (job.partition,) * job.num_nodes  # one stage per node
        counts[(job.tag.template_id, parts)] += 1
        for component in components:
            for node in component.nodes:
                held[node] += component.gpus // max(len(component.nodes), 1)
    running = tuple(RunningReplica(tid, parts, n) for (tid, parts), n in sorted(counts.items()))
    return running, dict(held)


def cluster_from_snapshot(deployment: Deployment, snapshot: ClusterSnapshot,
                          running: tuple[RunningReplica, ...] | None = None,
                          held: Mapping[str, int] | None = None) -> Cluster:
    """The Stage-2 cluster over the deployment's partitions (see the module docstring).

    Nodes are grouped by (GPU type, GPUs per node, GPU memory, configured partitions holding them),
    so each solver node group is one set of interchangeable nodes and each node appears once."""
    if running is None or held is None:
        running, held = own_running(snapshot)
    configured = {p.name: p for p in deployment.cluster.partitions}
    slurm_parts = {p.name: p for p in snapshot.partitions}
    groups: dict[tuple, list[tuple[str, int]]] = {}
    for node in snapshot.nodes:
        if not node.gpu_type or node.gpus_total <= 0:
            continue
        parts = tuple(sorted(
            p for p in node.partitions if p in configured and p in slurm_parts
            and (not configured[p].gpu_types or node.gpu_type in configured[p].gpu_types)))
        if not parts:
            continue
        memory = node.gpu_memory_gb or gpu_memory_gb(node.gpu_type) or 0.0
        free = node.gpus_free + held.get(node.name, 0) if node.usable else 0
        key = (node.gpu_type, node.gpus_total, float(memory), parts)
        groups.setdefault(key, []).append((node.name, max(0, min(free, node.gpus_total))))
    node_groups, members = [], {}
    for i, ((gpu, size, memory, parts), nodes) in enumerate(sorted(groups.items())):
        name = f"{gpu}-{size}x{memory:g}g-{i}"
        node_groups.append(NodeGroup(name, gpu, size, memory, tuple(n for n, _ in nodes),
                                     tuple(f for _, f in nodes)))
        for p in parts:
            members.setdefault(p, []).append(name)
    cfg = deployment.cluster
    partitions = []
    for name, part in configured.items():
        info = slurm_parts.get(name)
        if info is None:
            continue  # configured but unknown to Slurm: nothing can run there
        partitions.append(SolverPartition(
            name=name,
            node_groups=tuple(members.get(name, ())),
            usable=info.state == "up",
            prices=dict(part.price) if isinstance(part.price, dict) else None,
            billing=billing_of(info.billing_weights, cfg.cpus_per_gpu, cfg.mem_per_gpu_gb)
            if part.price == "billing" else None,
        ))
    quotas = [Quota(f"gpu_quotas[{gpu}]", limit, gpu_types=(gpu,))
              for gpu, limit in sorted(cfg.gpu_quotas.items())]
    quotas += [Quota(f"partition {p.name} max_gpus", p.max_gpus, partitions=(p.name,))
               for p in cfg.partitions if p.max_gpus is not None]
    limits = snapshot.limits
    if limits is not None:
        if limits.grp_gpus is not None:
            quotas.append(Quota("GrpTRES=gres/gpu", limits.grp_gpus))
        quotas += [Quota(f"GrpTRES=gres/gpu:{gpu}", limit, gpu_types=(gpu,))
                   for gpu, limit in sorted(limits.grp_gpus_by_type.items())]
    return Cluster(tuple(node_groups), tuple(partitions), tuple(quotas), tuple(running))



# --------------------------------------------------------------------------- what Slurm can start

def fit_job_shape(cluster: Cluster, snapshot: ClusterSnapshot, held: dict[str, int], cpus_per_gpu: int,
                  mem_per_gpu_gb: float) -> Cluster:
    """Available GPUs per node capped by the CPUs and memory a replica asks per GPU.

    A stage with ``g`` GPUs asks ``g × cpus_per_gpu`` CPUs and ``g × mem_per_gpu_gb`` memory; a
    node whose free memory holds only two GPUs' worth starts no third stage, however many GPUs
    it has idle (found on the local cluster: 64 GB nodes with 4-8 GPUs at 32 GB per GPU left a
    planned hetjob pending). What our serving replicas hold comes back with their GPUs."""
    nodes = {n.name: n for n in snapshot.nodes}
    groups = []
    for group in cluster.node_groups:
        free = []
        for name, gpus in zip(group.nodes, group.free):
            node = nodes.get(name)
            if node is None or gpus <= 0:
                free.append(gpus)
                continue
            back = held.get(name, 0)
            cpus = node.cpus - node.cpus_alloc + back * cpus_per_gpu
            mem = node.mem_gb - node.mem_alloc_gb + back * mem_per_gpu_gb
            fit = min(gpus, int(cpus // cpus_per_gpu), int(mem // mem_per_gpu_gb + 1e-9))
            free.append(max(0, min(fit, group.gpus_per_node)))
        groups.append(replace(group, free=tuple(free)))
    return replace(cluster, node_groups=tuple(groups))



def without_templates(library: dict[str, list[Template]],
                      excluded: frozenset[str]) -> dict[str, list[Template]]:
    """The library less the templates on cool-down."""
    return {model: [t for t in templates if t.id not in excluded]
            for model, templates in library.items()}



def placeable(library: dict[str, list[Template]], cluster: Cluster) -> dict[str, list[Template]]:
    """The templates whose stages can each get a node of their own this epoch.

    A replica runs one stage per node: submitit asks for ``pp`` nodes, and Slurm's backfill
    scheduler starts a heterogeneous job only when it can give each component a different node
    (Slurm's heterogeneous_jobs page, "Limitations"). Stage 2 packs GPUs per node and may put two
    stages of one replica on one node; a template with more stages of a GPU type than there are
    nodes of that type with room for one stage (``tp`` free GPUs) would then never start."""
    nodes_with_room: dict[tuple[str, int], int] = {}
    for group in cluster.node_groups:
        for tp in range(1, group.gpus_per_node + 1):
            key = (group.gpu_type, tp)
            nodes_with_room[key] = nodes_with_room.get(key, 0) + sum(
                1 for free in group.free if free >= tp)
    return {
        model: [t for t in templates
                if all(count <= nodes_with_room.get((gpu, t.tp), 0)
                       for gpu, count in t.stage_counts().items())]
        for model, templates in library.items()
    }



def excluded_stages(library: dict[str, list[Template]],
                    shapes: frozenset[tuple[str, tuple[str, ...]]]) -> frozenset:
    """(template id, GPU type, partition) for every stage of every excluded shape. Stage 2 routes
    stages to partitions per (template, GPU type), so a shape is kept out stage by stage."""
    by_id = {t.id: t for templates in library.values() for t in templates}
    out = set()
    for template_id, partitions in shapes:
        template = by_id.get(template_id)
        if template is None:
            continue  # no longer in the library (cooled down, or an old cache): nothing to keep out
        for stage, partition in zip(template.stages, partitions):
            out.add((template_id, stage.gpu_type, partition))
    return frozenset(out)


def policy_of(deployment: Deployment, startup_s: float | None = None) -> Policy:
    """The solver policy from ``policy:`` (K = start-up time ÷ re-plan interval)."""
    p = deployment.policy
    startup = p.startup_time_s if startup_s is None else startup_s
    return Policy(n_max=p.n_max, rho=p.rho, heterogeneous=p.heterogeneous,
                  startup_penalty=startup / p.replan_interval_s,
                  time_limit_s=p.solver_time_limit_s, mip_gap=p.solver_mip_gap,
                  replan_interval_s=p.replan_interval_s, max_queue_wait_s=p.max_queue_wait_s)


@dataclass(frozen=True)
class PlanResult:
    """A plan and everything that produced it."""

    models: list[ModelSpec]
    cluster: Cluster
    policy: Policy
    library: dict[str, list[Template]]
    plan: Plan
    stage1_s: float
    stage2_s: float
    problems: list[str]  #: the independent checker's findings (empty = accepted)
    unit: str  #: "gpu_hour" or "billing"
    #: what the plan could not use or had to adjust, each naming the node, partition or field
    warnings: list[str] = field(default_factory=list)
    #: Slurm's start estimates the plan used (sbatch --test-only)
    estimates: tuple = ()


def plan_deployment(deployment: Deployment, snapshot: ClusterSnapshot,
                    demand_rps: Mapping[str, float] | None = None,
                    cache_dir: Path | None = None,
                    throughput: ThroughputModel | None = None,
                    progress: Callable[[str, int, int], None] | None = None,
                    prober: Any = None) -> PlanResult:
    """Stage 1 (cached on disk) then Stage 2 for this deployment on this snapshot, checked.

    Without ``demand_rps`` it plans for what ``serve`` plans for at start: the declared demand
    with the policy's headroom (``demand: auto`` models count 0 until measured). ``prober``
    (a :class:`coral_hpc.slurm.availability.StartProber`) asks Slurm when each job shape would
    start; without one, the estimates saved in the snapshot are used."""
    if demand_rps is None:
        demand_rps = {name: d.planned_rps for name, d in deployment_demand(deployment, ()).items()}
    snapshot, warnings = availability.type_untyped_nodes(deployment, snapshot)
    warnings += availability.config_warnings(deployment, snapshot)
    models = model_specs(deployment, demand_rps)
    running, held = own_running(snapshot)
    cluster = cluster_from_snapshot(deployment, snapshot, running, held)
    # the same rules `serve` plans with: a node offers only the GPUs whose CPU and memory share
    # it can also give, and every stage of a replica needs a node of its own
    cluster = fit_job_shape(cluster, snapshot, held, deployment.cluster.cpus_per_gpu,
                            deployment.cluster.mem_per_gpu_gb)
    cluster = availability.with_site_rules(deployment, snapshot, cluster)
    policy = policy_of(deployment)
    tm = throughput if throughput is not None else PerfThroughput()
    began = time.perf_counter()
    library = build_library(models, cluster.gpu_types(), policy, tm, cache_dir=cache_dir,
                            progress=progress)
    estimates = snapshot.estimates
    if prober is not None:
        estimates = prober.estimates(availability.probe_shapes(deployment, snapshot, library))
    cluster = availability.with_estimates(cluster, estimates, policy.max_queue_wait_s)
    library = placeable(library, cluster)
    stage1 = time.perf_counter() - began
    plan = allocate(models, library, cluster, policy)
    stage2 = time.perf_counter() - began - stage1
    problems = check_plan(plan, models, cluster, library, tm)
    return PlanResult(models, cluster, policy, library, plan, stage1, stage2, problems,
                      deployment.cluster.price_unit, warnings, tuple(estimates))


def plan_json(result: PlanResult) -> dict[str, Any]:
    """The ``coral-hpc plan --json`` document (demand and throughput in requests/s of each
    model's mix; cost per hour in the deployment's unit)."""
    plan = result.plan

    def row_json(row: Any, queued: bool) -> dict[str, Any]:
        return {
            "model": row.model,
            "template": row.template.id,
            "partition": ",".join(dict.fromkeys(row.partitions)),
            "count": row.count,
            "throughput": row.throughput,
            "cost_per_hour": row.cost_per_hour,
            "tp": row.template.tp,
            "pp": row.template.pp,
            "layer_partition": row.template.layer_partition,
            "calibrated": row.template.calibrated,
            "stages": [{"gpu_type": s.gpu_type, "gpus": row.template.tp, "layers": s.layers,
                        "partition": p} for s, p in zip(row.template.stages, row.partitions)],
            "nodes": [list(n) for n in row.nodes],
            "expected_wait_s": row.wait_s,
            "start": availability.start_label(row.wait_s, queued),
            "queued": queued,
        }

    return {
        "mode": plan.status,
        "cost_per_hour": plan.cost_per_hour,
        "cost_unit": result.unit,
        "solve_seconds": {"stage1": result.stage1_s, "stage2": result.stage2_s},
        "gap": plan.gap if plan.gap != float("inf") else None,
        "models": [{"name": m.name, "demand": m.demand_rps, "served": plan.served[m.name],
                    "capacity": plan.capacity[m.name]} for m in result.models],
        "replicas": [row_json(row, False) for row in plan.rows]
        + [row_json(row, True) for row in plan.queued],
        "binding": list(plan.binding),
        "checker_problems": result.problems,
        "warnings": list(result.warnings),
    }


def templates_json(result: PlanResult) -> dict[str, Any]:
    """The Stage-1 library for ``--export-templates``: per template its model, GPUs used per
    configuration (GPU type and GPUs on one node → stages), throughput and price per partition
    where every stage could run, so anyone can re-solve Stage 2 independently."""
    partitions = [p for p in result.cluster.partitions if p.usable]
    out = []
    for model in result.models:
        for t in result.library.get(model.name, []):
            price = {}
            for p in partitions:
                costs = [p.stage_cost(s.gpu_type, t.tp) for s in t.stages]
                if all(c is not None for c in costs):
                    price[p.name] = sum(costs)
            out.append({
                "id": t.id, "model": t.model, "tp": t.tp, "pp": t.pp,
                "usage": [{"gpu_type": g, "gpus": tp, "stages": n}
                          for (g, tp), n in sorted(t.usage().items())],
                "stages": [{"gpu_type": s.gpu_type, "layers": s.layers} for s in t.stages],
                "layer_partition": t.layer_partition,
                "throughput": t.throughput,
                "calibrated": t.calibrated,
                "price_per_hour": price,
            })
    return {"cost_unit": result.unit,
            "models": [{"name": m.name, "demand": m.demand_rps, "architecture": m.arch}
                       for m in result.models],
            "templates": out}
