"""The daemon's loop in virtual time: a trace replayed against a saved cluster snapshot.

Every ``step_s`` (a minute, or the re-plan interval when that is shorter) of virtual time:

* **Demand** is what the daemon meters: one gateway interval per model and step (requests and
  their prompt/output tokens, :class:`coral_hpc.records.DemandInterval`, none rejected), read
  back through :func:`coral_hpc.demand.deployment_demand` over the last 10 re-plan intervals as
  the daemon reads its store. A model with declared demand is planned for it (with the policy's
  headroom), one with ``demand: auto`` for what the gateway measured. The trace's arrivals
  per ``policy.demand_window_s`` window are counted as the gateway's meter counts them, so
  ``policy.plan_for: pNN`` sizes each model for that percentile of its short-window rate.
* **Re-plans** (:class:`Replanner`) happen when :func:`coral_hpc.reconcile.replan_triggers`
  says so — the function the daemon calls (``coral_hpc.daemon.core``), with the models
  :func:`coral_hpc.demand.changed_models` names: the re-plan interval elapsed, or a model's
  demand or mix moved past ``policy.demand_change_threshold``. Each goes through the daemon's
  :class:`~coral_hpc.plan.planner.Planner` (Stage 1 cached on disk, Stage 2, the independent
  checker; Slurm is never asked: the snapshot's saved start estimates count) with the plan in
  force as the replicas that go on serving; a plan the planner refuses
  (:class:`~coral_hpc.plan.planner.PlanningError`) leaves the old one, as in the daemon. The
  cluster stays as the snapshot saw it: no node fails, no other job comes or goes. Under
  ``policy.capacity: simulated`` Stage 1 rates templates on the lengths the replay serves
  (:func:`replayed_lengths`), not on exponential lengths with the mix's means.
* **Cost** is the plan in force's ``cost_per_hour`` over the time it is in force (the
  provisioning cost; in the snapshot's unit: Slurm billing units or the partitions' prices);
  each replica a plan adds also pays ``startup_s`` of its price (submit to READY), reported
  apart. GPU-hours are booked per partition of every stage.
* **Serving**: while the plan's replicas stay the same, every request of a model is routed to
  them and served by the sim engine's scheduler in virtual time
  (:func:`coral_hpc.simulate.serve.serve_window`, without admission control: the gateway
  refuses only when a model has no replica). When the replicas change, the requests of the
  ``warmup_s`` seconds before are served again on the new replicas, uncounted, so they do not
  start empty. New replicas count as READY at once. A model with no replica refuses its
  requests (counted as missed).
* **Scale to zero** (``idle_after``): the daemon's idle rule; a woken model's requests wait a
  start-up (:mod:`coral_hpc.simulate.zero`).

Replica latencies come from the planner's own performance model, so SLO attainment shows that
the plans keep their promises under the trace's burstiness and lengths (self-consistency), not
that vLLM would.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from coral_hpc.config import Deployment
from coral_hpc.demand import (
    ArrivalWindows,
    Mix,
    ModelDemand,
    changed_models,
    deployment_demand,
    mix_moved,
)
from coral_hpc.plan.planner import Planner, PlanningError, PlanOutcome, PlanRequest
from coral_hpc.reconcile import ReconcileSettings, Trigger, replan_triggers
from coral_hpc.records import DemandInterval
from coral_hpc.simulate.serve import _SERVED, serve_window
from coral_hpc.simulate.traces import ModelWorkload, TraceRows, scaled_workload
from coral_hpc.simulate.zero import ScaleToZero
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_solver import catalog
from coral_solver.types import ModelSpec, ObservedLengths, Plan

#: The gateway's metering interval in virtual time, seconds (at most; the re-plan interval when
#: that is shorter). The daemon scrapes every poll; a minute keeps a day at 1,440 steps.
STEP_S = 60.0
#: Requests served again, uncounted, on new replicas so they do not start empty, seconds (a
#: few times the longest TTFT SLO of the examples, 5 s).
WARMUP_S = 30.0


@dataclass
class ModelFigures:
    """What one model got over the run."""

    requests: int = 0
    output_tokens: int = 0
    within_slo: float = 0.0
    good_output_tokens: float = 0.0
    refused: int = 0
    cost: float = 0.0
    gpu_hours: float = 0.0
    replica_hours: float = 0.0


@dataclass
class PlanPoint:
    """One re-plan: when, why, and what the plan in force is from then on."""

    at_s: float
    trigger: str
    accepted: bool
    status: str
    cost_per_hour: float
    replicas: dict[str, int]
    solve_s: float
    reason: str = ""


@dataclass
class SimulationResult:
    """Everything ``coral-hpc simulate`` reports."""

    span_s: float
    unit: str  #: "billing" or "gpu_hour"
    sources: dict[str, str]
    models: dict[str, ModelFigures] = field(default_factory=dict)
    demand_rps: dict[str, float] = field(default_factory=dict)  #: mean arrivals replayed
    planned_rps: dict[str, float] = field(default_factory=dict)  #: at the last plan
    #: the rate the last plan was sized for before headroom, and why (policy.plan_for)
    sized_rps: dict[str, float] = field(default_factory=dict)
    basis: dict[str, str] = field(default_factory=dict)
    plan_for: str = "mean"
    provisioning_cost: float = 0.0
    startup_cost: float = 0.0
    gpu_hours_by_partition: dict[str, float] = field(default_factory=dict)
    timeline: list[PlanPoint] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    #: per model scaled to zero: wakes, wake waits, held / refused (coral_hpc.simulate.zero)
    scale_to_zero: dict[str, dict] = field(default_factory=dict)
    wake_waits: dict[str, list[float]] = field(default_factory=dict)  #: each held request's
    #: mean (prompt, output) tokens of the requests replayed, as served (cut to the context)
    replayed_mix: dict[str, Mix] = field(default_factory=dict)
    #: the mix the last plan was made for, and whether it was declared or measured
    planned_mix: dict[str, Mix] = field(default_factory=dict)
    mix_source: dict[str, str] = field(default_factory=dict)
    #: policy.demand_change_threshold: the two mixes differ when further apart (the daemon's
    #: own rule for a mix that moved, :func:`coral_hpc.demand.mix_moved`)
    mix_threshold: float = 0.0

    @property
    def cost(self) -> float:
        return self.provisioning_cost + self.startup_cost

    def _mix_json(self, name: str) -> dict:
        """The model's planned mix (and where it came from) beside the replayed one."""
        def tokens(mix: Mix | None) -> dict | None:
            return None if mix is None else {"input_tokens": mix.input_tokens,
                                             "output_tokens": mix.output_tokens}

        planned, replayed = self.planned_mix.get(name), self.replayed_mix.get(name)
        return {"planned": tokens(planned),
                "planned_from": self.mix_source.get(name),
                "replayed": tokens(replayed),
                "differs": (planned is not None and replayed is not None
                            and mix_moved(planned, replayed, self.mix_threshold))}

    def to_json(self) -> dict:
        """JSON-ready figures (``coral-hpc simulate --json``)."""
        hours = self.span_s / 3600.0
        requests = sum(m.requests for m in self.models.values())
        good = sum(m.within_slo for m in self.models.values())
        return {
            "hours": round(hours, 4),
            "unit": self.unit,
            "cost": {
                "total": round(self.cost, 4),
                "provisioning": round(self.provisioning_cost, 4),
                "startup": round(self.startup_cost, 4),
                "per_hour_mean": round(self.provisioning_cost / hours, 4) if hours else 0.0,
            },
            "slo_attainment": round(good / requests, 4) if requests else None,
            "requests": requests,
            "plan_for": self.plan_for,
            "models": {
                name: {
                    "trace": self.sources.get(name, ""),
                    "requests": m.requests,
                    "demand_rps": round(self.demand_rps.get(name, 0.0), 4),
                    "sized_rps": round(self.sized_rps.get(name, 0.0), 4),
                    "planned_rps": round(self.planned_rps.get(name, 0.0), 4),
                    "planned_for": self.basis.get(name, ""),
                    "slo_attainment": round(m.within_slo / m.requests, 4) if m.requests else None,
                    "within_slo": round(m.within_slo, 1),
                    "refused": m.refused,
                    "goodput_tok_s": round(m.good_output_tokens / self.span_s, 2)
                    if self.span_s else 0.0,
                    "cost": round(m.cost, 4),
                    "gpu_hours": round(m.gpu_hours, 4),
                    "mean_replicas": round(m.replica_hours / hours, 3) if hours else 0.0,
                    "mix": self._mix_json(name),
                }
                for name, m in self.models.items()
            },
            "gpu_hours_by_partition": {p: round(v, 4) for p, v in
                                       sorted(self.gpu_hours_by_partition.items())},
            "replicas_over_time": [
                {"at_h": round(p.at_s / 3600.0, 4), "trigger": p.trigger, "accepted": p.accepted,
                 "status": p.status, "cost_per_hour": round(p.cost_per_hour, 4),
                 "replicas": p.replicas, "solve_s": round(p.solve_s, 3),
                 **({"reason": p.reason} if p.reason else {})}
                for p in self.timeline
            ],
            "replans": {
                "count": len(self.timeline),
                "by_trigger": dict(Counter(p.trigger for p in self.timeline)),
                "refused": sum(not p.accepted for p in self.timeline),
            },
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            **({"scale_to_zero": self.scale_to_zero} if self.scale_to_zero else {}),
        }


class Replanner:
    """The daemon's demand meter and re-plan rule, stepped in virtual time: the gateway's
    counters of the last 10 re-plan intervals read through
    :func:`coral_hpc.demand.deployment_demand`, the models
    :func:`coral_hpc.demand.changed_models` names, and
    :func:`coral_hpc.reconcile.replan_triggers` — the functions the daemon calls — on a cluster
    nothing happens to (no replica fails, no node drains, nothing is excluded)."""

    def __init__(self, deployment: Deployment, step_s: float) -> None:
        self.deployment = deployment
        policy = deployment.policy
        self.settings = ReconcileSettings.from_policy(policy)
        self.tau = policy.replan_interval_s
        self.store: deque[list[DemandInterval]] = deque(
            maxlen=max(1, math.ceil(10 * self.tau / step_s)))
        self.plan_time: float | None = None
        self.planned: Mapping[str, ModelDemand] = {}
        self.window_s = policy.demand_window_s
        #: arrivals per closed window by model, the newest policy.demand_windows of them
        self.windows: dict[str, deque[int]] = {}
        self.windows_end = 0.0  #: end of the newest closed window

    def meter(self, intervals: Iterable[DemandInterval]) -> None:
        """Store one step's gateway counters (the oldest step beyond the history goes)."""
        self.store.append(list(intervals))

    def count_windows(self, loads: Mapping[str, ModelWorkload], until: float) -> None:
        """Count the arrivals of every window that closed by ``until`` (windows at multiples of
        ``policy.demand_window_s`` from the start), as the gateway's meter counts them."""
        closed = math.floor(until / self.window_s + 1e-9)
        first = round(self.windows_end / self.window_s)
        if closed <= first:
            return
        edges = np.arange(first, closed + 1) * self.window_s
        keep = self.deployment.policy.demand_windows
        for name, load in loads.items():
            counts = np.diff(np.searchsorted(load.at, edges, side="left"))
            found = self.windows.setdefault(name, deque(maxlen=keep))
            found.extend(int(c) for c in counts[-keep:])
        self.windows_end = closed * self.window_s

    def due(self, now: float) -> tuple[dict[str, ModelDemand], list[Trigger]]:
        """The demand to plan for at ``now`` and why the plan is out of date (empty: it is
        not)."""
        windows = {name: ArrivalWindows(self.window_s, tuple(counts), self.windows_end)
                   for name, counts in self.windows.items()}
        demand = deployment_demand(self.deployment,
                                   (i for batch in self.store for i in batch), self.tau, windows)
        changed = (changed_models(self.planned, demand, self.settings.demand_change_threshold)
                   if self.planned else [])
        return demand, replan_triggers(self.plan_time, now, self.settings, (), changed,
                                       frozenset(), frozenset(), ())

    def planned_at(self, now: float, demand: Mapping[str, ModelDemand]) -> None:
        """A plan was asked for at ``now`` for ``demand`` (accepted or not: the daemon retries
        at the next trigger either way)."""
        self.plan_time, self.planned = now, demand


def model_workloads(deployment: Deployment, traces: Mapping[str, TraceRows], span_s: float,
                    seed: int = 0) -> dict[str, ModelWorkload]:
    """Every model's requests over ``span_s`` seconds from its trace (``traces`` by model
    name): the trace's rate curve scaled to the model's declared demand (``demand: auto``: the
    trace's own rate), its lengths kept, clipped to the architecture's context length (and so
    the window's lengths a simulated capacity is judged on, :func:`replayed_lengths`)."""
    loads = {}
    for index, model in enumerate(deployment.models):
        rows = traces[model.name]
        load = scaled_workload(model.name, rows, 0.0, model.demand_rps, seed + index, span_s)
        max_context = catalog.model_arch(model.arch_key).max_context
        prompt = np.minimum(load.prompt, max_context - 1)
        output = np.minimum(load.output, max_context - prompt)
        lengths = load.lengths
        if lengths is not None:  # the window's pairs as served, cut as the requests are
            cut = [min(p, max_context - 1) for p, _ in lengths.pairs]
            lengths = ObservedLengths(lengths.source, tuple(
                (p, min(o, max_context - p)) for p, (_, o) in zip(cut, lengths.pairs)))
        loads[model.name] = ModelWorkload(load.model, load.at, prompt, output, load.source,
                                          load.mix, lengths=lengths)
    return loads


def replayed_lengths(deployment: Deployment, loads: Mapping[str, ModelWorkload]) -> Deployment:
    """``deployment`` with each replayed model's observed lengths those its replay draws from
    (:attr:`ModelWorkload.lengths`, clipped to the architecture's context as served), so Stage
    1's simulated capacity (``policy.capacity: simulated``) is judged on the lengths the
    replay serves; they stand in for a ``models[].lengths`` trace. ``deployment`` is left as
    it was."""
    replayed = {name: load.lengths for name, load in loads.items() if load.lengths is not None}
    if not replayed:
        return deployment
    copy = deployment.model_copy()
    copy._lengths = {**deployment._lengths, **replayed}
    return copy


def _intervals(loads: Mapping[str, ModelWorkload], start: float,
               end: float) -> list[DemandInterval]:
    """The gateway's counters of [start, end): every request counted, none rejected."""
    out = []
    for name, load in loads.items():
        idx = load.window(start, end)
        out.append(DemandInterval(start, end, name, idx.stop - idx.start,
                                  int(load.prompt[idx].sum()), int(load.output[idx].sum()), 0))
    return out


def _replicas(plan: Plan | None) -> Counter:
    counts: Counter = Counter()
    for row in plan.rows if plan is not None else ():
        counts[(row.template.id, tuple(row.partitions), row.role)] += row.count
    return counts


def simulate(deployment: Deployment, snapshot: ClusterSnapshot,
             loads: Mapping[str, ModelWorkload], span_s: float, planner: Planner,
             log: Callable[[str], None] = lambda line: None,
             warmup_s: float = WARMUP_S) -> SimulationResult:
    """Replay ``loads`` for ``span_s`` seconds (see the module doc)."""
    began = time.perf_counter()
    deployment = replayed_lengths(deployment, loads)
    step = min(STEP_S, deployment.policy.replan_interval_s)
    replanner = Replanner(deployment, step)
    run = _Replay(deployment, snapshot, loads, span_s, planner, log, warmup_s)
    steps = math.ceil(span_s / step)
    for k in range(steps):
        now = k * step
        dt = min(step, span_s - now)
        demand, triggers = replanner.due(now)
        triggers = run.zero.follow(now, dt, _per_model(run.plan)) + triggers  # cold, woken
        if triggers:
            run.replan(now, demand, triggers)
            replanner.planned_at(now, demand)
        run.zero.hold(now, dt, _per_model(run.plan), run.result.models)  # during a wake
        run.book(dt)
        replanner.meter(_intervals(loads, now, now + dt))
        replanner.count_windows(loads, now + dt)
    run.serve_segment(run.serving_since, span_s)
    run.zero.finish(span_s, run.result.models)
    run.result.scale_to_zero = run.zero.report()
    run.result.wake_waits = {name: f.waits for name, f in run.zero.figures.items()}
    run.result.seconds = {"plan": run.plan_s, "serve": run.serve_s,
                          "total": time.perf_counter() - began}
    return run.result


def _empty_result(deployment: Deployment, loads: Mapping[str, ModelWorkload],
                  span_s: float) -> SimulationResult:
    """The figures before the first step: every model at zero, the trace's mean rates."""
    policy = deployment.policy
    result = SimulationResult(span_s, "gpu_hour", {n: w.source for n, w in loads.items()})
    result.models = {m.name: ModelFigures() for m in deployment.models}
    result.demand_rps = {n: len(w.at) / span_s for n, w in loads.items()}
    result.replayed_mix = {n: Mix(max(1, round(float(w.prompt.mean()))),
                                  max(1, round(float(w.output.mean()))))
                           for n, w in loads.items() if len(w.at)}
    result.mix_threshold = policy.demand_change_threshold
    result.plan_for = (policy.plan_for if policy.plan_percentile is None
                       else f"{policy.plan_for} of the {policy.demand_window_s:g} s rate")
    return result


class _Replay:
    """One :func:`simulate` run's state: the plan in force and its replicas, since when they
    serve, the figures so far and the seconds spent planning and serving."""

    def __init__(self, deployment: Deployment, snapshot: ClusterSnapshot,
                 loads: Mapping[str, ModelWorkload], span_s: float, planner: Planner,
                 log: Callable[[str], None], warmup_s: float) -> None:
        self.deployment, self.snapshot, self.loads = deployment, snapshot, loads
        self.planner, self.log, self.warmup_s = planner, log, warmup_s
        self.result = _empty_result(deployment, loads, span_s)
        self.plan: Plan | None = None
        self.specs: dict[str, ModelSpec] = {}
        self.running: tuple = ()
        self.serving_since = 0.0
        self.plan_s = self.serve_s = 0.0
        self.zero = ScaleToZero(deployment, loads, deployment.policy.startup_time_s)

    def serve_segment(self, start: float, end: float) -> None:
        """Serve every request of [start, end) on the plan in force (refused without one)."""
        if end <= start:
            return
        t0 = time.perf_counter()
        plan = self.plan
        for name, load in self.zero.served.items():  # held requests reach a replica once READY
            figures = self.result.models[name]
            spec = self.specs.get(name)
            if plan is None or spec is None:
                idx = load.window(start, end)
                figures.requests += idx.stop - idx.start
                figures.output_tokens += int(load.output[idx].sum())
                figures.refused += idx.stop - idx.start
                continue
            served = serve_window(plan, spec, load, start, end - start,
                                  warmup_s=min(self.warmup_s, start), admission=False)
            figures.requests += served.requests
            figures.output_tokens += served.output_tokens
            figures.within_slo += served.good
            figures.good_output_tokens += served.good_output_tokens
            figures.refused += served.refused
        _SERVED.clear()  # every window is new: keep memory flat
        self.serve_s += time.perf_counter() - t0
        self.log(f"  served {start / 3600:.2f}-{end / 3600:.2f} h in "
                 f"{time.perf_counter() - t0:.1f} s")

    def replan(self, now: float, demand: Mapping[str, ModelDemand],
               triggers: list[Trigger]) -> None:
        """Ask the planner at ``now``; a refused plan leaves the one in force (as the daemon)."""
        t0 = time.perf_counter()
        # scale to zero: cold models at zero demand, warm ones at least one replica
        planned_for, planned_demand = self.zero.planning_inputs(self.deployment, demand)
        request = PlanRequest(planned_for, self.snapshot, planned_demand, self.running,
                              frozenset(), frozenset(), self.deployment.policy.startup_time_s)
        try:
            outcome = self.planner(request)
        except PlanningError as exc:  # the daemon keeps its plan and retries
            self.plan_s += time.perf_counter() - t0
            plan = self.plan
            self.result.timeline.append(PlanPoint(
                now, triggers[0].kind.value, False, "refused",
                plan.cost_per_hour if plan else 0.0, _per_model(plan), 0.0, str(exc)))
            self.log(f"{now / 3600:6.2f} h {triggers[0].kind.value:9s} plan refused ({exc}); "
                     "the plan in force stays")
            return
        self.plan_s += time.perf_counter() - t0
        self._adopt(now, demand, triggers, outcome)

    def _adopt(self, now: float, demand: Mapping[str, ModelDemand], triggers: list[Trigger],
               outcome: PlanOutcome) -> None:
        """Put the planner's plan in force at ``now``: the replicas before it serve up to now;
        the replicas it adds pay their start-up."""
        result = self.result
        solved = outcome.solved
        assert solved is not None  # the planner returns a solved plan or raises
        new = solved.plan
        before, after = _replicas(self.plan), _replicas(new)
        if before != after:
            self.serve_segment(self.serving_since, now)
            self.serving_since = now
            added = {key: n - before[key] for key, n in after.items() if n > before[key]}
            price = {(r.template.id, tuple(r.partitions), r.role): r.cost_per_hour
                     for r in new.rows}
            result.startup_cost += sum(n * price[key] for key, n in added.items()) \
                * self.deployment.policy.startup_time_s / 3600.0
        self.plan, self.specs, result.unit = new, {m.name: m for m in solved.models}, solved.unit
        result.planned_rps = {n: d.planned_rps for n, d in demand.items()}
        result.sized_rps = {n: d.sized for n, d in demand.items()}
        result.basis = {n: d.basis for n, d in demand.items()}
        result.planned_mix = {n: d.mix for n, d in demand.items()}
        result.mix_source = {n: d.source for n, d in demand.items()}
        self.running = tuple((tid, parts) for (tid, parts, _), n in sorted(after.items())
                             for _ in range(n))
        result.timeline.append(PlanPoint(now, triggers[0].kind.value, True,
                                         outcome.status, new.cost_per_hour,
                                         _per_model(new), outcome.solve_s))
        self.log(f"{now / 3600:6.2f} h {triggers[0].kind.value:9s} {outcome.status:8s} "
                 f"{new.cost_per_hour:9.2f}/h  replicas "
                 + ", ".join(f"{m} {n}" for m, n in _per_model(new).items())
                 + f"  (solve {outcome.solve_s:.2f} s)")

    def book(self, dt: float) -> None:
        """Charge ``dt`` seconds of the plan in force: cost, replica- and GPU-hours."""
        if self.plan is None:
            return
        result = self.result
        hours = dt / 3600.0
        result.provisioning_cost += self.plan.cost_per_hour * hours
        for row in self.plan.rows:
            figures = result.models.setdefault(row.model, ModelFigures())
            figures.cost += row.count * row.cost_per_hour * hours
            figures.replica_hours += row.count * hours
            for partition in row.partitions:
                gpu_h = row.count * row.template.tp * hours
                figures.gpu_hours += gpu_h
                by_partition = result.gpu_hours_by_partition
                by_partition[partition] = by_partition.get(partition, 0.0) + gpu_h


def _per_model(plan: Plan | None) -> dict[str, int]:
    counts: Counter = Counter()
    for row in plan.rows if plan is not None else ():
        counts[row.model] += row.count
    return dict(counts)


def replica_steps(result: SimulationResult) -> tuple[list[float], dict[str, list[int]]]:
    """Replicas per model over time: the accepted plans' start times (hours) with one value per
    model each, and the run's end repeating the last (for a step plot)."""
    points = [p for p in result.timeline if p.accepted]
    names: Iterable[str] = result.models
    times = [p.at_s / 3600.0 for p in points]
    series = {n: [p.replicas.get(n, 0) for p in points] for n in names}
    if points:
        times.append(result.span_s / 3600.0)
        for values in series.values():
            values.append(values[-1])
    return times, series
