"""The real planner: :class:`~coral_hpc.daemon.core.PlanRequest` → Stage 1 → Stage 2 →
:class:`~coral_hpc.daemon.core.PlanOutcome`.

1. Solver inputs from the request through the adapter ``coral_hpc.plan`` (models with the
   demand and mix to plan for; the cluster's available GPUs, partitions, prices and quotas) —
   :func:`solver_inputs`.
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

from coral_hpc import plan as plan_adapter
from coral_hpc.daemon.core import PlanOutcome, PlanRequest
from coral_hpc.errors import CoralError
from coral_hpc.reconcile.desired import slots_from_plan
from solver.allocate import allocate
from solver.check import check_plan
from solver.templates import PerfThroughput, ThroughputModel, build_library
from solver.types import (
    Cluster,
    ModelSpec,
    Policy,
    RunningReplica,
)


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
        library = plan_adapter.without_templates(library, request.excluded_templates)
        library = plan_adapter.placeable(library, cluster)
        cluster = replace(cluster, excluded_stages=plan_adapter.excluded_stages(library,
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


def solver_inputs(request: PlanRequest) -> tuple[list[ModelSpec], Cluster, Policy]:
    """Models, cluster and policy for this epoch through ``coral_hpc.plan``, with what only the
    daemon knows: the demand (headroom included) and mix it measured, the replicas that go on
    serving and the GPUs they hold, and the learnt start-up time behind K."""
    deployment = request.deployment
    models = plan_adapter.model_specs(
        deployment,
        {name: item.planned_rps for name, item in request.demand.items()},
        {name: (item.mix.input_tokens, item.mix.output_tokens)
         for name, item in request.demand.items()},
    )
    counts = Counter(request.running)
    running = tuple(RunningReplica(template_id, tuple(partitions), count)
                    for (template_id, partitions), count in sorted(counts.items()))
    # only replicas that go on serving offer their GPUs: one being replaced keeps its GPUs until
    # its successor is READY, so they must not be planned for the successor
    held = _held_gpus(request.snapshot, request.running)
    cluster = plan_adapter.cluster_from_snapshot(deployment, request.snapshot, running, held)
    cluster = plan_adapter.fit_job_shape(cluster, request.snapshot, held, deployment.cluster.cpus_per_gpu,
                            deployment.cluster.mem_per_gpu_gb)
    return models, cluster, plan_adapter.policy_of(deployment, request.startup_s)


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
