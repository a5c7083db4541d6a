"""A site's day in virtual time: the daemon's re-plan loop on the day's gateway counters, the
plans' cost minute by minute, and sampled windows served by the sim engine's scheduler.

* **Demand** is what the daemon meters: one gateway interval per model and minute (requests and
  their prompt/output tokens, :class:`coral_hpc.records.DemandInterval`), smoothed by
  :func:`coral_hpc.demand.deployment_demand` over the last 10 re-plan intervals as the daemon
  reads its store (``demand: auto``: rate and bucketed mix measured, headroom added). The store
  starts with the day's last 10 intervals (the day wraps), so the first plan has history.
* **Re-plans** happen when :func:`coral_hpc.reconcile.triggers.replan_triggers` says so
  (through :class:`coral_hpc.simulate.run.Replanner`, as ``coral-hpc simulate`` asks), checked
  every minute (each new interval): the re-plan interval elapsed, or a model's demand or mix
  moved past ``policy.demand_change_threshold``. Each goes through the daemon's planner
  (:class:`coral_hpc.plan.planner.Planner` called as ``serve`` calls it: Stage 1 cached on disk,
  Stage 2, the independent checker) with the plan in force as the replicas that go on serving;
  a plan the planner refuses (:class:`~coral_hpc.plan.planner.PlanningError`) leaves the old one.
  There is no other Slurm traffic: every node is free to the deployment, nothing fails.
* **Cost** per minute is the plan in force's ``cost_per_hour``; each replica a plan adds pays
  ``startup_s`` of its price (submit to READY), and walltime rotation adds, per replica-hour,
  the overlap of a successor with its predecessor (start-up + drain grace) every usable life
  (time limit − signal lead − walltime lead + start-up): the daemon keeps a replica until its
  successor is READY.
* **Goodput** is sampled: at the middle of each sampled hour every model's requests of
  ``sim_s`` seconds (after ``warmup_s`` seconds served but not counted, so replicas are not
  empty) are routed to the plan in force and served by the sim engine's scheduler in virtual
  time (:func:`bench.paper_eval.evaluate.serve_window`: gateway weights, admission of what the
  plan's capacity allows, one replica per plan row simulated). The hour's requests and output
  tokens times the sample's within-SLO shares give the hour's goodput; hours not sampled take
  the nearest sampled hour's shares. New replicas count as READY at once in the samples.

Replica latencies come from the planner's own performance model, so the SLO figures show that
the plans keep their promises under the trace (self-consistency), not that vLLM would.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.paper_eval import evaluate
from bench.paper_eval.workload import ModelWorkload
from bench.scale_eval import site as S
from coral_hpc.plan.planner import Planner, PlanningError, PlanRequest
from coral_hpc.records import DemandInterval
from coral_hpc.simulate import day as D
from coral_hpc.simulate.rotation import rotation_overhead
from coral_hpc.simulate.run import Replanner
from coral_solver import catalog
from coral_solver.types import ModelSpec, Plan

HOURS = 24


@dataclass(frozen=True)
class Config:
    """One run's knobs (the defaults are the reported run)."""

    models: int = 50
    total_rps: float = 500.0
    seed: int = 0
    replan_interval_s: float = 900.0
    #: policy.demand_change_threshold (the daemon's default is 0.25)
    demand_change_threshold: float = 0.25
    sample_every_h: int = 3
    sim_s: float = 30.0
    warmup_s: float = 15.0
    workers: int = 2
    cache_dir: Path | None = None  #: Stage-1 cache; None: a fresh one (a cold start)


@dataclass
class Replan:
    """One plan the daemon asked for."""

    at: float
    trigger: str
    status: str
    accepted: bool
    cost_per_hour: float
    solve_s: float
    stage1_s: float
    stage2_s: float
    problems: int


@dataclass
class Sample:
    """What one model's sampled window got."""

    hour: int
    requests: int
    output_tokens: int
    good: float
    good_tokens: float
    refused: int


@dataclass
class DayResult:
    """Everything the report needs."""

    config: Config
    models: list[S.SiteModel]
    mixes: dict[str, tuple[int, int]]
    days: dict[str, D.ModelDay]
    replans: list[Replan] = field(default_factory=list)
    cost_hour: np.ndarray = field(default_factory=lambda: np.zeros(HOURS))
    startup_hour: np.ndarray = field(default_factory=lambda: np.zeros(HOURS))
    rotation_hour: np.ndarray = field(default_factory=lambda: np.zeros(HOURS))
    gpus_hour: np.ndarray = field(default_factory=lambda: np.zeros(HOURS))  #: GPU-hours
    initial_startup_usd: float = 0.0
    model_cost: Counter = field(default_factory=Counter)  #: $ over the day per model
    model_gpu_hours: Counter = field(default_factory=Counter)
    model_replica_hours: Counter = field(default_factory=Counter)
    model_gpu_types: dict[str, Counter] = field(default_factory=dict)
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)  #: PlanningError messages


def policy_of(cfg: Config) -> dict:
    """The ``policy:`` section of the site's models.yaml."""
    return {"replan_interval_s": cfg.replan_interval_s,
            "demand_change_threshold": cfg.demand_change_threshold}


def _gpus(row) -> int:
    return row.count * row.template.tp * len(row.template.stages)


def _serve_sample(plan: Plan, spec: ModelSpec, load: ModelWorkload, start: float, sim_s: float,
                  warmup_s: float, hour: int) -> Sample:
    """One model's window served (runs in a worker process)."""
    served = evaluate.serve_window(plan, spec, load, start, sim_s, warmup_s=warmup_s)
    # the cache of served windows only pays off when methods share rows (bench/paper.py); here
    # every window is new, so it is emptied to keep the worker's memory flat
    evaluate._SERVED.clear()
    return Sample(hour, served.requests, served.output_tokens, served.good,
                  served.good_output_tokens, served.refused)


def _window_load(name: str, days: dict[str, D.ModelDay], mix, start: float,
                 end: float) -> ModelWorkload:
    at, prompt, output = days[name].requests(start, end)
    return ModelWorkload(name, at, prompt, output, days[name].rows.name, mix)


def draw_day(cfg: Config, traces_dir: Path) -> tuple[list, dict, dict]:
    """The day's models, each one's mean mix and its drawn day (:class:`D.ModelDay`): the same
    for :func:`run_day` and :func:`count_replans`, from the same seed."""
    models = S.draw_models(cfg.models, cfg.total_rps, cfg.seed)
    rows = {t: D.load_rows(t, traces_dir) for t in sorted({m.trace for m in models})}
    mixes = {m.name: rows[m.trace].mean_mix() for m in models}
    days = {m.name: D.ModelDay(rows[m.trace], m.phase, m.mean_rps, i, cfg.seed,
                               catalog.model_arch(m.arch).max_context)
            for i, m in enumerate(models)}
    return models, mixes, days


def run_day(cfg: Config, traces_dir: Path, log: Callable[[str], None] = print) -> DayResult:
    """The day (see the module doc)."""
    began = time.perf_counter()
    models, mixes, days = draw_day(cfg, traces_dir)
    result = DayResult(cfg, models, mixes, days)
    result.seconds["trace"] = time.perf_counter() - began
    log(f"  {len(models)} models' days drawn in {result.seconds['trace']:.1f} s: "
        f"{sum(int(d.counts.sum()) for d in days.values()):,} requests")

    deployment = S.deployment(models, mixes, policy_of(cfg))
    S.check_site(deployment)
    replanner = Replanner(deployment, D.MINUTE_S)
    snapshot = S.snapshot()
    cache = cfg.cache_dir or Path(tempfile.mkdtemp(prefix="coral-scale-templates-"))
    planner = Planner(cache_dir=cache)
    rotation = rotation_overhead(deployment)
    startup_s = deployment.policy.startup_time_s

    def interval(minute: int, start: float) -> list[DemandInterval]:
        return gateway_intervals(models, days, minute, start)

    history_min = replanner.store.maxlen or 0
    for minute in range(D.MINUTES - history_min, D.MINUTES):  # yesterday's end: the day wraps
        replanner.meter(interval(minute, (minute - D.MINUTES) * D.MINUTE_S))

    plan: Plan | None = None
    counts: Counter = Counter()
    running: tuple = ()
    sample_hours = set(range(0, HOURS, cfg.sample_every_h))
    futures: list[tuple[str, Future]] = []
    pool = ProcessPoolExecutor(max_workers=cfg.workers) if cfg.workers > 0 else None
    plan_s = 0.0
    try:
        for minute in range(D.MINUTES):
            now = minute * D.MINUTE_S
            hour = minute // 60
            demand, triggers = replanner.due(now)
            if triggers:
                t0 = time.perf_counter()
                request = PlanRequest(deployment, snapshot, demand, running, frozenset(),
                                      frozenset(), startup_s)
                try:
                    outcome, accepted = planner(request), True
                except PlanningError as exc:  # the daemon keeps its plan and retries
                    outcome, accepted = None, False
                    result.refusals.append(f"{now / 3600:.2f} h: {exc}")
                plan_s += time.perf_counter() - t0
                solved = outcome.solved if outcome is not None else None
                result.replans.append(Replan(
                    now, triggers[0].kind.value, outcome.status if outcome else "error", accepted,
                    outcome.cost_per_hour if outcome else 0.0, outcome.solve_s if outcome else 0.0,
                    solved.stage1_s if solved else 0.0, solved.stage2_s if solved else 0.0,
                    len(outcome.problems) if outcome else 0))
                replanner.planned_at(now, demand)  # the daemon retries on failure; so do we
                if accepted and solved is not None:
                    new = Counter()
                    for row in solved.plan.rows:
                        new[(row.template.id, tuple(row.partitions))] += row.count
                    added = sum(max(0, row.count - counts[(row.template.id, tuple(row.partitions))])
                                * row.cost_per_hour for row in solved.plan.rows)
                    if plan is None:
                        result.initial_startup_usd += added * startup_s / 3600.0
                    else:
                        result.startup_hour[hour] += added * startup_s / 3600.0
                    plan, counts = solved.plan, new
                    running = tuple(key for key, n in sorted(counts.items()) for _ in range(n))
                log(f"    {now / 3600:5.2f} h {triggers[0].kind.value:8s} "
                    f"{result.replans[-1].status:8s} ${result.replans[-1].cost_per_hour:9.2f}/h "
                    f"solve {result.replans[-1].solve_s:5.2f} s"
                    + ("" if accepted else " REFUSED, old plan kept"))
            if plan is not None:
                minute_h = D.MINUTE_S / 3600.0
                result.cost_hour[hour] += plan.cost_per_hour * minute_h
                result.rotation_hour[hour] += plan.cost_per_hour * minute_h * rotation
                for row in plan.rows:
                    result.gpus_hour[hour] += _gpus(row) * minute_h
                    result.model_cost[row.model] += row.count * row.cost_per_hour * minute_h
                    result.model_gpu_hours[row.model] += _gpus(row) * minute_h
                    result.model_replica_hours[row.model] += row.count * minute_h
                    types = result.model_gpu_types.setdefault(row.model, Counter())
                    for stage in row.template.stages:
                        types[stage.gpu_type] += row.count * row.template.tp * minute_h
            sample_at = hour * 3600.0 + 1800.0 - cfg.sim_s / 2
            if hour in sample_hours and plan is not None and now <= sample_at < now + D.MINUTE_S:
                for m in models:
                    start = sample_at - cfg.warmup_s
                    load = _window_load(m.name, days, mixes[m.name], start, sample_at + cfg.sim_s)
                    rate = len(load.at) / (cfg.sim_s + cfg.warmup_s)
                    spec = ModelSpec(m.name, m.arch, *mixes[m.name], *m.slo,
                                     demand_rps=max(rate, 1e-9))
                    args = (plan, spec, load, sample_at, cfg.sim_s, cfg.warmup_s, hour)
                    futures.append((m.name, pool.submit(_serve_sample, *args) if pool
                                    else _done(_serve_sample(*args))))
            replanner.meter(interval(minute, now))
        result.seconds["plan"] = plan_s
        waited = time.perf_counter()
        for name, fut in futures:
            result.samples.setdefault(name, []).append(fut.result())
        result.seconds["serve_wait"] = time.perf_counter() - waited
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    result.seconds["total"] = time.perf_counter() - began
    result.seconds["stage1"] = sum(r.stage1_s for r in result.replans)
    result.seconds["stage2"] = sum(r.stage2_s for r in result.replans)
    return result


def gateway_intervals(models: list[S.SiteModel], days: dict[str, D.ModelDay], minute: int,
                      start: float) -> list[DemandInterval]:
    """The gateway's counters of minute ``minute`` of the day, stamped from ``start``: every
    request counted, none rejected (the gateway refuses only with no READY replica)."""
    return [DemandInterval(start, start + D.MINUTE_S, m.name, int(days[m.name].counts[minute]),
                           int(days[m.name].prompt_sums[minute]),
                           int(days[m.name].output_sums[minute]), 0)
            for m in models]


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


# --------------------------------------------------------------------------- figures


def hour_shares(samples: list[Sample]) -> dict[int, tuple[float, float, float]]:
    """Per sampled hour: (within-SLO share of requests, of output tokens, refused share)."""
    out = {}
    for s in samples:
        out[s.hour] = (s.good / s.requests if s.requests else 1.0,
                       s.good_tokens / s.output_tokens if s.output_tokens else 1.0,
                       s.refused / s.requests if s.requests else 0.0)
    return out


def nearest(hour: int, sampled: list[int]) -> int:
    """The sampled hour nearest ``hour`` on the day's circle (earlier on a tie)."""
    return min(sampled, key=lambda h: (min(abs(h - hour), HOURS - abs(h - hour)), h))


def figures(result: DayResult) -> dict:
    """JSON-ready figures: per hour, per model, planning, wall time."""
    per_hour_good = np.zeros(HOURS)
    per_hour_good_req = np.zeros(HOURS)
    per_hour_req = np.zeros(HOURS)
    per_hour_tokens = np.zeros(HOURS)
    per_model = {}
    for m in result.models:
        d = result.days[m.name]
        req_h, tok_h = d.hourly(d.counts), d.hourly(d.output_sums)
        shares = hour_shares(result.samples.get(m.name, []))
        sampled = sorted(shares)
        good = good_req = refused = 0.0
        for h in range(HOURS):
            if not sampled:
                continue
            a_req, a_tok, a_ref = shares[nearest(h, sampled)]
            good += tok_h[h] * a_tok
            good_req += req_h[h] * a_req
            refused += req_h[h] * a_ref
            per_hour_good[h] += tok_h[h] * a_tok
            per_hour_good_req[h] += req_h[h] * a_req
        per_hour_req += req_h
        per_hour_tokens += tok_h
        requests = int(req_h.sum())
        types = result.model_gpu_types.get(m.name, Counter())
        gpu_h = sum(types.values())
        per_model[m.name] = {
            "arch": m.arch, "size": m.size, "trace": m.trace,
            "mix": list(result.mixes[m.name]), "slo": list(m.slo),
            "mean_rps": round(requests / D.DAY_S, 3),
            "requests": requests,
            "cost_usd_day": round(result.model_cost[m.name], 2),
            "mean_replicas": round(result.model_replica_hours[m.name] / HOURS, 2),
            "mean_gpus": round(result.model_gpu_hours[m.name] / HOURS, 1),
            "gpu_types": {g: round(v / gpu_h, 3) for g, v in types.most_common()} if gpu_h else {},
            "slo_attainment": round(good_req / requests, 4) if requests else 0.0,
            "refused_share": round(refused / requests, 4) if requests else 0.0,
            "goodput_tok_s": round(good / D.DAY_S, 1),
            "usd_per_million_good_tokens": round(result.model_cost[m.name] / good * 1e6, 3)
            if good else None,
            "samples": len(sampled),
        }
    replans = result.replans
    solve = [r.solve_s for r in replans[1:]] or [0.0]
    hourly = []
    for h in range(HOURS):
        hourly.append({
            "hour": h,
            "cost_usd": round(result.cost_hour[h] + result.startup_hour[h]
                              + result.rotation_hour[h], 2),
            "provisioning_usd": round(result.cost_hour[h], 2),
            "startup_usd": round(result.startup_hour[h], 2),
            "rotation_usd": round(result.rotation_hour[h], 2),
            "gpus": round(result.gpus_hour[h], 1),
            "requests": int(per_hour_req[h]),
            "offered_tok_s": round(per_hour_tokens[h] / 3600.0, 1),
            "goodput_tok_s": round(per_hour_good[h] / 3600.0, 1),
            "slo_attainment": round(per_hour_good_req[h] / per_hour_req[h], 4)
            if per_hour_req[h] else 0.0,
            "replans": sum(1 for r in replans if int(r.at // 3600) == h),
            "sampled": h in set(range(0, HOURS, result.config.sample_every_h)),
        })
    total_cost = sum(x["cost_usd"] for x in hourly)
    total_good = float(per_hour_good.sum())
    return {
        "hourly": hourly,
        "per_model": per_model,
        "day": {
            "cost_usd": round(total_cost, 2),
            "initial_startup_usd": round(result.initial_startup_usd, 2),
            "cost_per_hour_mean": round(total_cost / HOURS, 2),
            "cost_per_hour_max": max(x["cost_usd"] for x in hourly),
            "goodput_tok_s_mean": round(total_good / D.DAY_S, 1),
            "offered_tok_s_mean": round(float(per_hour_tokens.sum()) / D.DAY_S, 1),
            "slo_attainment": round(float(per_hour_good_req.sum() / per_hour_req.sum()), 4),
            "usd_per_million_good_tokens": round(total_cost / total_good * 1e6, 3)
            if total_good else None,
            "requests": int(per_hour_req.sum()),
            "mean_gpus": round(float(result.gpus_hour.sum()) / HOURS, 1),
        },
        "planning": {
            "replans": len(replans),
            "by_trigger": dict(Counter(r.trigger for r in replans)),
            "refused": sum(not r.accepted for r in replans),
            "statuses": dict(Counter(r.status for r in replans)),
            "checker_problems": sum(r.problems for r in replans),
            "first_plan_s": round(replans[0].solve_s, 2) if replans else None,
            "first_stage1_s": round(replans[0].stage1_s, 2) if replans else None,
            "replan_solve_s_median": round(statistics.median(solve), 3),
            "replan_solve_s_max": round(max(solve), 3),
            "replan_stage2_s_median": round(statistics.median(
                [r.stage2_s for r in replans[1:]] or [0.0]), 3),
            "stage1_s_total": round(result.seconds.get("stage1", 0.0), 2),
            "stage2_s_total": round(result.seconds.get("stage2", 0.0), 2),
        },
        "seconds": {k: round(v, 1) for k, v in result.seconds.items()},
    }


def count_replans(cfg: Config, traces_dir: Path) -> Counter:
    """The re-plans the daemon's triggers ask for over the day, by trigger kind, without
    solving: what a threshold costs before a run spends the Stage-2 time (same models, same day,
    same demand meter as :func:`run_day`; a refused plan cannot happen here)."""
    models, mixes, days = draw_day(cfg, traces_dir)
    deployment = S.deployment(models, mixes, policy_of(cfg))
    S.check_site(deployment)
    replanner = Replanner(deployment, D.MINUTE_S)

    def interval(minute: int, start: float) -> list[DemandInterval]:
        return gateway_intervals(models, days, minute, start)

    history_min = replanner.store.maxlen or 0
    for minute in range(D.MINUTES - history_min, D.MINUTES):
        replanner.meter(interval(minute, (minute - D.MINUTES) * D.MINUTE_S))
    kinds: Counter = Counter()
    for minute in range(D.MINUTES):
        now = minute * D.MINUTE_S
        demand, triggers = replanner.due(now)
        if triggers:
            kinds[triggers[0].kind.value] += 1
            replanner.planned_at(now, demand)
        replanner.meter(interval(minute, now))
    return kinds
