"""The real planner: :class:`~coral_hpc.daemon.core.PlanRequest` → Stage 1 → Stage 2 →
:class:`~coral_hpc.daemon.core.PlanOutcome`.

1. Solver inputs from the request (models with the demand and mix to plan for, the cluster's
   available GPUs, partitions and prices, quotas) — :func:`solver_inputs`.
2. Stage 1, :func:`solver.templates.build_library`, cached on disk by a hash of everything it
   depends on (so a re-plan that only moved demand, prices or free GPUs reads JSON files).
3. Templates on crash cool-down leave the library; (template, partitions) shapes that sat pending
   past the timeout, or that Slurm refused, leave the cluster (``Cluster.excluded_stages``).
4. Stage 2, :func:`solver.allocate.allocate`, with the replicas that go on serving as
   ``running`` and the churn penalty K = learnt start-up time ÷ re-plan interval.
5. The independent checker (:func:`solver.check.check_plan`) re-verifies the plan; a plan it
   rejects, or no plan at all, raises :class:`PlanningError` — the daemon keeps its current plan
   (an empty plan would drain every replica) and retries with backoff.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from coral_hpc.config import Deployment
from coral_hpc.daemon.core import PlanOutcome, PlanRequest
from coral_hpc.demand import ModelDemand
from coral_hpc.errors import CoralError
from coral_hpc.reconcile.desired import slots_from_plan
from coral_hpc.reconcile.startup import startup_penalty
from solver.allocate import allocate
from solver.catalog import gpu_memory_gb
from solver.check import check_plan
from solver.templates import PerfThroughput, ThroughputModel, build_library
from solver.types import (
    Billing,
    Cluster,
    ModelSpec,
    NodeGroup,
    Policy,
    Quota,
    RunningReplica,
    Template,
)
from solver.types import Partition as SolverPartition


class PlanningError(CoralError):
    """No plan the daemon may act on: the solver found none, or the checker rejected it."""


class SolverPlanner:
    """Coral's two stages behind the daemon's planning seam. Holds the throughput model (its
    tables are built once) and where Stage 1 caches; the constructor solves nothing."""

    def __init__(self, cache_dir: Path | None = None, throughput: ThroughputModel | None = None,
                 backend: str = "highs"):
        self.cache_dir = cache_dir
        self.throughput = throughput
        self.backend = backend
        #: the last plan's solver objects, for status lines and tests
        self.last: dict[str, Any] = {}

    def _model(self) -> ThroughputModel:
        if self.throughput is None:
            self.throughput = PerfThroughput()
        return self.throughput

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        began = time.perf_counter()
        models, cluster, policy = solver_inputs(request)
        library = build_library(models, cluster.gpu_types(), policy, self._model(),
                                cache_dir=self.cache_dir)
        library = without_templates(library, request.excluded_templates)
        library = placeable(library, cluster)
        cluster = replace(cluster, excluded_stages=excluded_stages(library,
                                                                   request.excluded_shapes))
        plan = allocate(models, library, cluster, policy, backend=self.backend)
        self.last = {"models": models, "cluster": cluster, "policy": policy, "plan": plan,
                     "library": library}
        if plan.status in ("infeasible", "no_solution"):
            raise PlanningError(f"Stage 2 found no plan ({plan.status}): "
                                + ("; ".join(plan.binding) or "no reason given"))
        problems = check_plan(plan, models, cluster, library)
        if problems:
            raise PlanningError("the plan failed the independent check: " + "; ".join(problems))
        return PlanOutcome(
            desired=slots_from_plan(plan, time.time()),
            cost_per_hour=plan.cost_per_hour,
            solve_s=time.perf_counter() - began,
            status=plan.status,
            served=dict(plan.served),
        )


# --------------------------------------------------------------------------- request → solver
#
# The adapter from a ClusterSnapshot + Deployment + demand to solver inputs belongs in
# ``coral_hpc.plan`` (ARCHITECTURE.md); until that module lands, this one carries the adapter the
# daemon needs, written to the same definitions (available GPUs, node groups, prices), so that
# swapping it for ``coral_hpc.plan`` changes no plan.


def solver_inputs(request: PlanRequest) -> tuple[list[ModelSpec], Cluster, Policy]:
    """Models, cluster and policy for this epoch: declared/measured demand with headroom and
    its mix, available GPUs (idle + held by replicas that go on serving, on usable nodes),
    partitions with their prices, quotas, the running replicas and K."""
    deployment = request.deployment
    models = model_specs(deployment, request.demand)
    cluster = cluster_of(deployment, request.snapshot, request.running)
    settings = deployment.policy
    policy = Policy(
        n_max=settings.n_max,
        rho=settings.rho,
        heterogeneous=settings.heterogeneous,
        startup_penalty=startup_penalty(request.startup_s, settings.replan_interval_s),
        time_limit_s=settings.solver_time_limit_s,
        mip_gap=settings.solver_mip_gap,
    )
    return models, cluster, policy


def model_specs(deployment: Deployment, demand: dict[str, ModelDemand]) -> list[ModelSpec]:
    """One :class:`ModelSpec` per configured model, with the demand (after headroom) and mix to
    plan for; a model with no demand entry is planned for nothing beyond ``min_replicas``."""
    out = []
    for m in deployment.models:
        item = demand.get(m.name)
        mix = item.mix if item is not None else None
        out.append(ModelSpec(
            name=m.name,
            arch=m.architecture,
            input_tokens=mix.input_tokens if mix else m.mix.input_tokens,
            output_tokens=mix.output_tokens if mix else m.mix.output_tokens,
            ttft_s=m.slo.ttft_s,
            tpot_s=m.slo.tpot_s,
            demand_rps=item.planned_rps if item is not None else 0.0,
            priority=m.priority,
            min_replicas=m.min_replicas,
            max_replicas=m.max_replicas,
            gpu_types=tuple(m.gpu_types),
            partitions=tuple(m.partitions),
        ))
    return out


def cluster_of(deployment: Deployment, snapshot: Any,
               running: tuple[tuple[str, tuple[str, ...]], ...]) -> Cluster:
    """The Stage-2 cluster over the deployment's partitions.

    Nodes are grouped by (GPU type, GPUs per node, GPU memory, configured partitions holding
    them), so a solver node group is exactly one set of interchangeable nodes. A node's available
    GPUs = its free GPUs (0 unless it is up and not draining) + GPUs held by this deployment's
    replicas that go on serving (``running``): replicas about to be replaced keep their GPUs
    until their successor is READY, so those GPUs are not offered to the successor.
    """
    configured = {p.name: p for p in deployment.cluster.partitions}
    slurm_parts = {p.name: p for p in snapshot.partitions}
    held = _held_gpus(snapshot, running)
    groups: dict[tuple, list[tuple[str, int]]] = {}
    for node in snapshot.nodes:
        if node.gpu_type is None or node.gpus_total <= 0:
            continue
        parts = tuple(sorted(
            p for p in node.partitions if p in configured and p in slurm_parts
            and (not configured[p].gpu_types or node.gpu_type in configured[p].gpu_types)))
        if not parts:
            continue
        memory = node.gpu_memory_gb or gpu_memory_gb(node.gpu_type) or 0.0
        free = node.gpus_free + held.get(node.name, 0) if node.usable else 0
        key = (node.gpu_type, node.gpus_total, float(memory), parts)
        groups.setdefault(key, []).append((node.name, min(free, node.gpus_total)))
    node_groups = []
    members: dict[str, list[str]] = {}
    for i, ((gpu, size, memory, parts), nodes) in enumerate(sorted(groups.items())):
        name = f"{gpu}-{size}x{memory:g}g-{i}"
        node_groups.append(NodeGroup(name, gpu, size, memory, tuple(n for n, _ in nodes),
                                     tuple(f for _, f in nodes)))
        for p in parts:
            members.setdefault(p, []).append(name)
    cluster_cfg = deployment.cluster
    partitions = []
    for name, cfg in configured.items():
        info = slurm_parts.get(name)
        if info is None:
            continue  # a configured partition Slurm does not know: nothing can run there
        partitions.append(SolverPartition(
            name=name,
            node_groups=tuple(members.get(name, ())),
            usable=info.state == "up",
            prices=dict(cfg.price) if isinstance(cfg.price, dict) else None,
            billing=_billing(info.billing_weights, cluster_cfg.cpus_per_gpu,
                             cluster_cfg.mem_per_gpu_gb) if cfg.price == "billing" else None,
        ))
    quotas = [Quota(f"gpu_type:{gpu}", limit, gpu_types=(gpu,))
              for gpu, limit in sorted(cluster_cfg.gpu_quotas.items())]
    quotas += [Quota(f"partition:{p.name}", p.max_gpus, partitions=(p.name,))
               for p in cluster_cfg.partitions if p.max_gpus is not None]
    limits = snapshot.limits
    if limits is not None:
        if limits.grp_gpus is not None:
            quotas.append(Quota("slurm:GrpTRES=gres/gpu", limits.grp_gpus))
        quotas += [Quota(f"slurm:GrpTRES=gres/gpu:{gpu}", limit, gpu_types=(gpu,))
                   for gpu, limit in sorted(limits.grp_gpus_by_type.items())]
    counts = Counter(running)
    return Cluster(
        node_groups=tuple(node_groups),
        partitions=tuple(partitions),
        quotas=tuple(quotas),
        running=tuple(RunningReplica(template_id, tuple(parts), count)
                      for (template_id, parts), count in sorted(counts.items())),
    )


def _billing(weights: dict[str, float], cpus_per_gpu: int, mem_per_gpu_gb: int) -> Billing:
    """Slurm's TRESBillingWeights as the solver's per-GPU billing of a replica's job shape (with
    no weights Slurm bills the CPU count)."""
    if not weights:
        return Billing(cpu=1.0, cpus_per_gpu=cpus_per_gpu, mem_per_gpu_gb=mem_per_gpu_gb)
    by_type = {key.split(":", 1)[1]: value for key, value in weights.items()
               if key.startswith("gres/gpu:")}
    return Billing(cpu=weights.get("cpu", 0.0), mem_gb=weights.get("mem", 0.0),
                   gpu=weights.get("gres/gpu", 0.0), gpu_by_type=by_type,
                   cpus_per_gpu=cpus_per_gpu, mem_per_gpu_gb=float(mem_per_gpu_gb))


def _held_gpus(snapshot: Any, running: tuple[tuple[str, tuple[str, ...]], ...]) -> dict[str, int]:
    """GPUs per node held by this deployment's RUNNING jobs that go on serving: per (template,
    partitions), as many jobs as ``running`` lists, oldest first."""
    wanted = Counter(running)
    held: Counter = Counter()
    jobs = sorted((j for j in snapshot.jobs if j.tag is not None and j.state == "RUNNING"),
                  key=lambda j: (j.start_time or 0.0, j.job_id))
    for job in jobs:
        parts = tuple(c.partition for c in job.components) if job.components else (
            tuple(job.partition.split(",")))
        key = (job.tag.template_id, parts)
        if wanted[key] <= 0:
            # a homogeneous multi-node job names one partition for all its stages
            key = next((k for k in wanted if k[0] == job.tag.template_id and wanted[k] > 0
                        and set(k[1]) == set(parts)), key)
        if wanted[key] <= 0:
            continue
        wanted[key] -= 1
        for component in job.components or (job,):
            nodes = component.nodes
            for node in nodes:
                held[node] += component.gpus // max(len(nodes), 1)
    return dict(held)


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
