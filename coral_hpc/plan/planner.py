"""The planner ``serve`` and ``coral-hpc plan`` share: :class:`PlanRequest` → Stage 1 → Stage 2 →
check → :class:`PlanOutcome`.

1. Solver inputs from the request (:mod:`coral_hpc.plan.inputs`): models with the demand and mix
   to plan for; the cluster's available GPUs (free + held by the replicas that go on serving,
   capped by the CPUs and memory a replica asks per GPU), partitions, prices and quotas; the
   policy with K = start-up time ÷ re-plan interval.
2. Stage 1, :func:`coral_solver.templates.build_library`, cached on disk by a hash of everything it
   depends on (so a re-plan that only moved demand, prices or free GPUs reads JSON files).
3. ``min_replicas`` the whole cluster could never hold (more GPUs than the model's partitions
   have, busy or not: :mod:`coral_hpc.plan.capacity`) end planning with an ``infeasible``
   plan naming them: invalid input, not a queue to wait in.
   Templates on crash cool-down leave the library, and so do templates some stage of which finds
   no node with room; (template, partitions) shapes that sat pending past the timeout, or that
   Slurm refused, leave the cluster (``Cluster.excluded_stages``).
4. Reservations the account may use become placements ``partition@reservation`` with their
   own nodes and window (:mod:`coral_hpc.plan.reservations`).
5. Availability on a busy cluster (:mod:`coral_hpc.plan.availability`): Slurm's start estimate
   per job shape (``sbatch --test-only`` within the probe budget, or those saved in the
   snapshot) turns busy nodes Slurm gives us within ``policy.max_queue_wait_s`` into capacity
   with a wait, which Stage 2 prices; site limits (MaxTRES, MaxNodes, MaxJobs/MaxSubmit,
   partition QOS) and engine-environment groups bind.
6. Stage 2, :func:`coral_solver.allocate.allocate`, with the replicas that go on serving as
   ``running``; a model left with nothing gets one replica queued where Slurm expects to
   start it first — without any estimate (none saved, ``sbatch --test-only`` refused or
   rate-limited), on its best shape the site could run, marked start unknown: a busy
   cluster is not invalid input. A model woken from zero (``PlanRequest.waking``) may use
   only its layouts expected READY soonest — Slurm's expected start plus the layout's
   start-up (:mod:`coral_hpc.plan.layout_startup`, asking Slurm about its shapes) — when
   they start now beside the rest; else it is planned as any model.
7. The independent checker (:func:`coral_solver.check.check_plan`) re-verifies the plan, re-checking
   every planned template's throughput with the same throughput model.

:meth:`Planner.solve` returns every outcome (``coral-hpc plan`` prints a rejected plan and exits
1); calling the planner (``serve``'s seam) raises :class:`PlanningError` for a plan the daemon
must not act on — no plan at all, or one the checker rejected: an empty plan would drain every
replica, so the daemon keeps its current plan and retries with backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from coral_hpc.config import Deployment
from coral_hpc.demand import ModelDemand, deployment_demand
from coral_hpc.errors import CoralError, PermanentError
from coral_hpc.plan import availability, capacity, inputs, reservations
from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.plan.figures import use_measured_profiles
from coral_hpc.plan.layout import layout_of
from coral_hpc.plan.layout_startup import (
    LayoutStartup,
    layout_startup,
    profile_startups,
    wake_library,
)
from coral_hpc.slurm.job_shape import ReplicaShape
from coral_hpc.slurm.snapshot import ClusterSnapshot, JobShape
from coral_solver.allocate import SolverUnavailable as NoSuchSolver
from coral_solver.allocate import allocate
from coral_solver.check import check_plan
from coral_solver.kv_room import kv_limit
from coral_solver.templates import PerfThroughput, ThroughputModel, build_library
from coral_solver.types import Cluster, ModelSpec, Plan, Policy, Template


class PlanningError(CoralError):
    """No plan the daemon may act on: the solver found none, or the checker rejected it."""


class SolverUnavailable(PlanningError, PermanentError):
    """``policy.solver`` names a Pyomo solver this host cannot use: the message names it and how
    to install it. Re-planning will not help until the site installs it or changes the field."""


class InfeasiblePlan(PlanningError):
    """Stage 2 proved that no plan meets the deployment's hard demands (``min_replicas``) within
    its quotas and limits on this cluster, or the whole cluster could never hold them
    (``shortfalls``): an input problem, not a transient one."""

    def __init__(self, message: str, shortfalls: tuple[capacity.Shortfall, ...] = ()):
        super().__init__(message)
        self.shortfalls = shortfalls


@dataclass(frozen=True)
class PlanRequest:
    """What the planner is asked each time the plan is out of date."""

    deployment: Deployment
    snapshot: ClusterSnapshot
    demand: Mapping[str, ModelDemand]
    #: replicas that will go on serving: (template id, partition of each stage) each
    running: tuple[inputs.ReplicaKey, ...]
    excluded_templates: frozenset[str]
    excluded_shapes: frozenset[inputs.ReplicaKey]
    startup_s: float
    #: models woken from zero (scaled to zero, no replica alive): their replica goes to the
    #: layout expected READY soonest (:mod:`coral_hpc.plan.layout_startup`)
    waking: frozenset[str] = frozenset()
    #: start-up (job start → READY) per template id from this deployment's own replicas
    layout_startups: Mapping[str, LayoutStartup] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, deployment: Deployment, snapshot: ClusterSnapshot) -> PlanRequest:
        """What ``serve`` would be asked at start on this snapshot (``coral-hpc plan``): the
        declared demand with the policy's headroom (``demand: auto`` models count 0 until
        measured), this deployment's live jobs as the replicas that go on serving, no
        exclusions, and the configured start-up time."""
        return cls(deployment, snapshot, deployment_demand(deployment, ()),
                   inputs.running_of(snapshot), frozenset(), frozenset(),
                   deployment.policy.startup_time_s)


@dataclass(frozen=True)
class Solved:
    """The solver objects behind a plan (for ``coral-hpc plan``'s documents and for tests)."""

    models: list[ModelSpec]
    cluster: Cluster
    policy: Policy
    library: dict[str, list[Template]]
    plan: Plan
    stage1_s: float
    stage2_s: float
    unit: str  #: "gpu_hour" or "billing"
    #: what the plan could not use or had to adjust, each naming the node, partition or field
    warnings: tuple[str, ...] = ()
    #: Slurm's start estimates the plan used (sbatch --test-only)
    estimates: tuple = ()
    #: min_replicas the whole cluster could never hold (the plan is then "infeasible")
    shortfalls: tuple[capacity.Shortfall, ...] = ()
    #: what solved Stage 2: ``policy.solver`` (``highs`` or ``pyomo:<name>``)
    solver: str = "highs"


@dataclass(frozen=True)
class PlanOutcome:
    """A plan and what it promises."""

    desired: DesiredPlan
    cost_per_hour: float
    solve_s: float
    status: str
    served: dict[str, float] = field(default_factory=dict)
    #: the independent checker's findings (empty = accepted)
    problems: tuple[str, ...] = ()
    solved: Solved | None = None


def desired_plan(plan: Plan, models: list[ModelSpec], now: float,
                 time_limit_of: Callable[[tuple[str, ...]], int] | None = None,
                 shape_of: Callable[[tuple[str, ...]], ReplicaShape] | None = None) -> DesiredPlan:
    """The Stage-2 plan as slots, each with its layout; rows with count 0 are dropped. Queued
    rows (``plan.queued``: nothing starts within the horizon) are slots too, marked ``queued``:
    they are submitted now and wait in Slurm's queue. ``time_limit_of(partitions)`` gives a
    slot's job time limit when the partitions' MaxTime clips the configured one;
    ``shape_of(partitions)`` the CPUs and memory per GPU its job asks (what Stage 2 packed)."""
    arch = {m.name: m.arch for m in models}
    rows = [(row, False) for row in plan.rows] + [(row, True) for row in plan.queued]
    return DesiredPlan(time=now, slots=tuple(
        Slot(model=row.template.model, template_id=row.template.id, count=int(row.count),
             throughput=float(row.template.throughput), cost_per_hour=float(row.cost_per_hour),
             layout=layout_of(row.template, row.partitions, arch[row.template.model]),
             time_limit_s=time_limit_of(tuple(row.partitions)) if time_limit_of else None,
             expected_wait_s=float(row.wait_s), queued=queued,
             start_known=row.start_known,
             **_shape_fields(shape_of(tuple(row.partitions)) if shape_of else None))
        for row, queued in rows if row.count > 0))


def _shape_fields(shape: ReplicaShape | None) -> dict[str, int | None]:
    return ({"cpus_per_gpu": None, "mem_per_gpu_gb": None} if shape is None else
            {"cpus_per_gpu": shape.cpus_per_gpu, "mem_per_gpu_gb": shape.mem_per_gpu_gb})


def _gpu_types_of(cluster: Cluster, model: ModelSpec) -> dict[str, tuple[int, float]]:
    """:meth:`Cluster.gpu_types` on the partitions the model may use only."""
    names = {g for p in cluster.partitions if model.allows_partition(p.name)
             for g in p.node_groups}
    types = {cluster.node_group(g).gpu_type for g in names}
    return {g: v for g, v in cluster.gpu_types().items() if g in types}


def refused_plan(models: list[ModelSpec], reasons: list[str], solve_s: float) -> Plan:
    """The empty, ``infeasible`` plan of a deployment whose ``min_replicas`` the cluster could
    never hold (:mod:`coral_hpc.plan.capacity`): Stage 2 is not asked, and ``reasons`` are its
    binding lines."""
    names = [m.name for m in models]
    return Plan(rows=(), demand={m.name: m.demand_rps for m in models},
                served=dict.fromkeys(names, 0.0), capacity=dict.fromkeys(names, 0.0),
                cost_per_hour=0.0, status="infeasible", gap=float("inf"),
                solve_seconds=solve_s, binding=tuple(reasons))


def _refused_outcome(solved: Solved) -> PlanOutcome:
    """The outcome of a deployment whose ``min_replicas`` the whole cluster could never hold:
    ``solved.plan`` is the refused plan; Stage 2 was not asked."""
    plan = solved.plan
    return PlanOutcome(
        desired=desired_plan(plan, solved.models, time.time()), cost_per_hour=0.0,
        solve_s=solved.stage1_s, status=plan.status, served=dict(plan.served), solved=solved)


def _snapshot_warnings(deployment: Deployment, snapshot: ClusterSnapshot) -> list[str]:
    """What the snapshot makes the plan adjust: configuration the cluster contradicts,
    reservations the account cannot use, partitions that may preempt."""
    return (availability.config_warnings(deployment, snapshot)
            + reservations.usable_reservations(deployment, snapshot)[1]
            + availability.preemption_warnings(deployment, snapshot))


@dataclass(frozen=True)
class _Stage2:
    """Stage 2 on one set of Slurm start estimates: the cluster with those waits, the library
    placeable on it, the plan. Called again when a first plan without fresh estimates fails."""

    models: list[ModelSpec]
    policy: Policy
    base: Cluster
    full_library: dict[str, list[Template]]
    snapshot: ClusterSnapshot
    shapes: list[JobShape]
    excluded_shapes: frozenset[inputs.ReplicaKey]
    solver: str
    waking: frozenset[str] = frozenset()
    #: each template's start-up (by id), for the woken models' choice
    startups: Mapping[str, LayoutStartup] = field(default_factory=dict)

    def __call__(self, estimates: tuple) -> tuple[Cluster, dict, Plan]:
        cluster = availability.with_estimates(self.base, estimates, self.policy.max_queue_wait_s,
                                              availability.own_queue_options(self.snapshot))
        # shapes without an estimate still queue, of unknown start (after known ones)
        cluster = availability.with_unknown_starts(cluster, self.shapes, estimates)
        # a queued replica waits for its nodes: every template may be queued, not only
        # those that fit in the GPUs available now
        library = inputs.placeable(self.full_library, cluster)
        cluster = replace(cluster, excluded_stages=inputs.excluded_stages(
            self.full_library, self.excluded_shapes))
        if self.waking:
            # a wake from zero: the woken model's layouts READY soonest only, Stage 2 then
            # picks the cheapest of them; should they not all start now beside the rest (the
            # plan would queue or fail), the plan without that narrowing, as before
            full, choices = wake_library(self.full_library, self.models, self.waking, cluster,
                                         self.startups)
            kept = {t.id for templates in full.values() for t in templates}
            narrowed = {m: [t for t in ts if t.id in kept] for m, ts in library.items()}
            plan = self._allocate(narrowed, cluster, full)
            if plan.status in ("optimal", "feasible"):
                return cluster, narrowed, replace(
                    plan, binding=plan.binding + tuple(c.note() for c in choices))
        return cluster, library, self._allocate(library, cluster, self.full_library)

    def _allocate(self, library: dict, cluster: Cluster, queue_library: dict) -> Plan:
        try:
            return allocate(self.models, library, cluster, self.policy, backend=self.solver,
                            queue_library=queue_library)
        except NoSuchSolver as exc:  # the site's to fix: named, not a traceback
            raise SolverUnavailable(str(exc)) from None


def _desired(plan: Plan, models: list[ModelSpec], deployment: Deployment,
             snapshot: ClusterSnapshot) -> DesiredPlan:
    """:func:`desired_plan` with each slot's job time limit and CPUs and memory per GPU as this
    cluster's partitions set them."""

    def time_limit(parts: tuple[str, ...]) -> int:
        return availability.time_limit_for(deployment, snapshot, parts)

    def shape(parts: tuple[str, ...]) -> ReplicaShape:
        return inputs.job_shape(deployment, snapshot)

    return desired_plan(plan, models, time.time(), time_limit, shape)


def _merged(older: tuple, newer: tuple) -> tuple:
    """Start estimates of both, one per job shape, ``newer``'s where both have one."""
    def key(e: Any) -> tuple:
        return (e.partition, e.gpu_type, e.gpus_per_node, e.nodes, e.reservation)

    fresh = {key(e) for e in newer}
    return tuple(e for e in older if key(e) not in fresh) + tuple(newer)


def _startups(request: PlanRequest, models: list[ModelSpec],
              library: Mapping[str, list[Template]]) -> dict[str, LayoutStartup]:
    """Each woken model's templates' start-up (:func:`layout_startup`): its own replicas',
    its measured profile's, else the deployment-wide figure. Empty when nothing wakes."""
    if not request.waking:
        return {}
    from coral_hpc.plan.figures import measured_profile_dirs

    profiles = profile_startups(measured_profile_dirs(request.deployment))
    default = LayoutStartup(request.startup_s, "the deployment-wide start-up "
                            "(policy.startup_time_s until its replicas have been seen start)")
    arch = {m.name: m.arch for m in models}
    return {t.id: layout_startup(t.id, arch[name], [s.gpu_type for s in t.stages], t.tp,
                                 request.layout_startups, profiles, default)
            for name, templates in library.items() if name in request.waking
            for t in templates}


class Planner:
    """Coral's two stages. Holds the throughput model (its tables are built once) and where
    Stage 1 caches; the constructor solves nothing."""

    def __init__(self, cache_dir: Path | None = None, throughput: ThroughputModel | None = None,
                 backend: str | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 probe: bool = False, prober: Any = None):
        self.cache_dir = cache_dir
        self.throughput = throughput
        #: Stage 2's solver for every request; None: each deployment's ``policy.solver``
        self.backend = backend
        self.progress = progress
        #: ask Slurm when each job shape would start (``sbatch --test-only``, within the
        #: deployment's ``slurm.probe_calls_per_min``); off, the snapshot's saved estimates count
        self.probe = probe
        self.prober = prober
        self.probe_client: Any = None

    def use_client(self, client: Any) -> None:
        """Probe through ``client`` (the daemon's own, so the probes are charged to its one Slurm
        call budget, ``coral_hpc.slurm.budget``) instead of a client of the planner's own."""
        self.probe_client = client

    def _prober(self, deployment: Deployment) -> Any:
        if self.prober is None and self.probe:
            from coral_hpc.slurm import client_for_deployment
            from coral_hpc.slurm.availability import StartProber
            from coral_hpc.slurm.client import call_budget

            client = self.probe_client or client_for_deployment(deployment)
            self.prober = StartProber(
                client, budget=call_budget(client),
                calls_per_min=deployment.cluster.slurm.probe_calls_per_min,
                ttl_s=deployment.policy.replan_interval_s)
        return self.prober

    def _model(self) -> ThroughputModel:
        if self.throughput is None:
            self.throughput = PerfThroughput()
        return self.throughput

    def inputs(self, request: PlanRequest) -> tuple[list[ModelSpec], Cluster, Policy]:
        """Models, cluster and policy for this request (see the module docstring)."""
        deployment = request.deployment
        models = inputs.model_specs(
            deployment,
            {name: item.planned_rps for name, item in request.demand.items()},
            {name: (item.mix.input_tokens, item.mix.output_tokens)
             for name, item in request.demand.items()},
        )
        snapshot, _ = availability.type_untyped_nodes(deployment, request.snapshot)
        held = inputs.held_gpus(snapshot, request.running)
        cluster = inputs.cluster_from_snapshot(deployment, snapshot,
                                               inputs.running_replicas(request.running), held)
        cluster = availability.with_site_rules(deployment, snapshot, cluster)
        cluster, _ = reservations.with_reservations(deployment, snapshot, cluster, held)
        cluster, _ = availability.with_preemption(deployment, snapshot, cluster)
        cluster = inputs.fit_job_shape(cluster, snapshot, held,
                                       inputs.job_shape(deployment, snapshot))
        models = reservations.models_with(models, cluster)
        return models, cluster, inputs.policy_of(deployment, request.startup_s)

    def stage1_spec(self, request: PlanRequest) -> Any:
        """The Stage-1 work this request needs, as a :class:`coral_solver.stage1.Spec`: run it
        elsewhere (``python -m coral_solver.stage1``, a Slurm array job on CPU nodes) and
        ``merge`` it into this planner's ``cache_dir``, and :meth:`solve` reads the library from
        there (same cache key) instead of building it. Solves nothing."""
        from coral_hpc.plan.figures import measured_profile_dirs
        from coral_solver.stage1 import Spec

        use_measured_profiles(request.deployment)
        models, cluster, policy = self.inputs(request)
        return Spec(tuple(models), {"site": cluster.gpu_types()}, policy,
                    measured_dirs=tuple(str(p) for p in measured_profile_dirs(request.deployment)))

    def never_held(self, request: PlanRequest) -> tuple[capacity.Shortfall, ...]:
        """The ``min_replicas`` the whole cluster could never hold (:mod:`coral_hpc.plan.capacity`)
        as :meth:`solve` finds them, without Stage 2: ``validate``'s check. Builds (or reads
        from the cache) the Stage-1 library only when some model sets ``min_replicas``."""
        deployment = request.deployment
        if not any(m.min_replicas for m in deployment.models):
            return ()
        use_measured_profiles(deployment)
        models, cluster, policy = self.inputs(request)
        library = build_library(models, cluster.gpu_types(), policy, self._model(),
                                cache_dir=self.cache_dir, progress=self.progress)
        snapshot, _ = availability.type_untyped_nodes(deployment, request.snapshot)
        return tuple(capacity.never_held(deployment, snapshot, library))

    def solve(self, request: PlanRequest) -> PlanOutcome:
        """Plan once; the outcome carries the checker's findings instead of raising. Raises
        :class:`SolverUnavailable` when ``policy.solver`` names a Pyomo solver this host lacks."""
        began = time.perf_counter()
        use_measured_profiles(request.deployment)
        models, cluster, policy = self.inputs(request)
        throughput = self._model()
        library = build_library(models, cluster.gpu_types(), policy, throughput,
                                cache_dir=self.cache_dir, progress=self.progress)
        deployment = request.deployment
        snapshot, warnings = availability.type_untyped_nodes(deployment, request.snapshot)
        # the layouts refused because a stage cannot hold one max_model_len request's KV: the
        # plan says so per model rather than leave it unplanned without a word
        warnings += [line for m in models
                     if (line := kv_limit(throughput, m, _gpu_types_of(cluster, m), policy))]
        # before cool-downs narrow the library: a template on cool-down comes back
        shortfalls = tuple(capacity.never_held(deployment, snapshot, library))
        if shortfalls:
            stage1 = time.perf_counter() - began
            return _refused_outcome(Solved(
                models, cluster, policy, library, refused_plan(
                    models, [s.reason(deployment) for s in shortfalls], stage1),
                stage1, 0.0, deployment.cluster.price_unit, tuple(warnings),
                shortfalls=shortfalls))
        library = inputs.without_templates(library, request.excluded_templates)
        warnings += _snapshot_warnings(deployment, snapshot)
        shapes = availability.probe_shapes(deployment, snapshot, library)
        stage2 = _Stage2(models, policy, cluster, library, snapshot, shapes,
                         request.excluded_shapes, self.backend or deployment.policy.solver,
                         request.waking, _startups(request, models, library))
        stage1 = time.perf_counter() - began
        prober = self._prober(deployment)
        # Slurm's estimates are asked for only when what is free now does not serve the plan:
        # on a cluster with room, planning costs no sbatch --test-only at all
        estimates = tuple(snapshot.estimates) or (prober.cached() if prober is not None else ())
        if prober is not None and request.waking:
            # a wake from zero goes where its first replica is READY soonest: Slurm's word on
            # when each shape of the woken models starts (cached for an epoch, within budget)
            woken = {m: ts for m, ts in library.items() if m in request.waking}
            estimates = _merged(estimates, prober.estimates(
                availability.probe_shapes(deployment, snapshot, woken)))
        cluster, library, plan = stage2(estimates)
        if prober is not None and plan.status not in ("optimal", "feasible"):
            estimates = prober.estimates(shapes)
            cluster, library, plan = stage2(estimates)
        stage2_s = time.perf_counter() - began - stage1
        problems = tuple(check_plan(plan, models, cluster, library, throughput,
                                    policy=policy))
        return PlanOutcome(
            desired=_desired(plan, models, deployment, snapshot),
            cost_per_hour=plan.cost_per_hour,
            solve_s=time.perf_counter() - began,
            status=plan.status,
            served=dict(plan.served),
            problems=problems,
            solved=Solved(models, cluster, policy, library, plan, stage1, stage2_s,
                          request.deployment.cluster.price_unit, tuple(warnings), tuple(estimates),
                          solver=stage2.solver),
        )

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        """``serve``'s seam: a plan the daemon may act on, or :class:`PlanningError`."""
        outcome = self.solve(request)
        if outcome.status in ("infeasible", "no_solution"):
            plan = outcome.solved.plan if outcome.solved else None
            error = InfeasiblePlan if outcome.status == "infeasible" else PlanningError
            message = (f"Stage 2 found no plan ({outcome.status}): "
                       + ("; ".join(plan.binding if plan else ()) or "no reason given"))
            if error is InfeasiblePlan:
                raise InfeasiblePlan(message, outcome.solved.shortfalls if outcome.solved else ())
            raise PlanningError(message)
        if outcome.problems:
            raise PlanningError("the plan failed the independent check: "
                                + "; ".join(outcome.problems))
        return outcome
