"""The daemon: wires observe → (plan) → decide → act → publish, and the demand scrape.

It owns no logic of its own: every rule lives in ``coral_hpc.reconcile`` (status, triggers,
decide), ``coral_hpc.demand`` and ``coral_hpc.plan`` (the planner, injected). Each loop is one
step function with its own interval;
errors are caught and logged only at the loop boundary; sleeps wait on an Event so SIGTERM stops
the daemon at once. Collaborators (Slurm client, store, planner, clock, gateway) are injected and
the constructor starts nothing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from coral_hpc.config import Deployment
from coral_hpc.daemon.loop import Loop
from coral_hpc.daemon.metrics import DaemonMetrics
from coral_hpc.daemon.routing import TablePublisher, ready_routes
from coral_hpc.daemon.scrape import DemandScraper
from coral_hpc.daemon.wake import (
    idle_rules,
    last_requests,
    planning_inputs,
    ready_counts,
    replica_startup,
    wake_infos,
)
from coral_hpc.demand import ModelDemand, changed_models, demand_basis, deployment_demand
from coral_hpc.engine.vllm_metrics import fetch_engine_load
from coral_hpc.errors import ConfigError
from coral_hpc.gateway.wake import clear_wake, pending_wakes
from coral_hpc.plan.desired import DesiredPlan, plan_from_rows, slot_rows
from coral_hpc.plan.figures import measured_profile_dirs
from coral_hpc.plan.layout_startup import (
    LayoutStartup,
    ProfileKey,
    own_layout_startups,
    profile_startups,
)
from coral_hpc.plan.planner import InfeasiblePlan, PlanOutcome, PlanRequest, SolverUnavailable
from coral_hpc.plan.report import infeasible_problems
from coral_hpc.reconcile import (
    Cancel,
    Decision,
    Drain,
    ReconcileSettings,
    ReplicaFacts,
    ReplicaState,
    Submit,
    decide,
    goes_on_serving,
    replan_triggers,
    replica_status,
)
from coral_hpc.reconcile.act import Actor
from coral_hpc.reconcile.backoff import Backoff
from coral_hpc.reconcile.hysteresis import PlanHistory
from coral_hpc.reconcile.idle import IdleTracker, Temperature, Transition
from coral_hpc.reconcile.observe import Observed, Observer
from coral_hpc.reconcile.startup import lead_startup_s, learned_startup_s
from coral_hpc.reconcile.triggers import Trigger, TriggerKind
from coral_hpc.records import ReplicaRecord
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_hpc.store import Store
from coral_hpc.types import ShapeExclusion, TemplateExclusion

log = logging.getLogger("coral_hpc.daemon")

#: seconds between two reads of the READY replicas' engine /metrics (at least the poll interval)
ENGINE_SCRAPE_S = 5.0


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """One deployment's controller. Build it, then :meth:`run` (or call the steps in tests)."""

    def __init__(
        self,
        deployment: Deployment,
        store: Store,
        client: Any,  # coral_hpc.slurm.client.SlurmClient
        planner: Callable[[PlanRequest], PlanOutcome],
        *,
        api_key_file: Path | None,
        table_path: Path,
        clock: Callable[[], float] = time.time,
        metrics: DaemonMetrics | None = None,
        demand_source: Callable[[], dict] | None = None,
        observer: Observer | None = None,
        actor: Actor | None = None,
        instance: str = "",
        may_act: Callable[[], bool] = lambda: True,
        on_cycle: Callable[[float], None] | None = None,
        config_path: Path | None = None,
        budget: CallBudget | None = None,
        wake_folder: Path | None = None,
    ):
        self.deployment = deployment
        # the one Slurm call budget (coral_hpc.slurm.budget) the client charges: the reconcile
        # loop waits for one observe cycle's tokens, so probes and acts never push it over
        self.budget = budget
        self.store = store
        self.client = client
        self.planner = planner
        self.may_act = may_act  # the lease still ours (coral_hpc.daemon.lease): checked each act
        self.on_cycle = on_cycle  # after each cycle (serve publishes status for other hosts)
        self.clock = clock
        self.metrics = metrics or DaemonMetrics()
        self.settings = ReconcileSettings.from_policy(deployment.policy)
        self.api_key_file = api_key_file
        self.publisher = TablePublisher(table_path)
        self.demand_source = demand_source
        self.scraper = DemandScraper()
        # the instance (coral_hpc.instance) tags every job; only jobs carrying it are ours
        self.observer = observer or Observer(
            deployment, store, client, self.settings, clock, throughput_of=self._throughput_of,
            instance=instance, api_key_file=api_key_file)
        self.actor = actor or Actor(deployment, store, client, self.settings, clock, api_key_file,
                                    instance=instance)
        self.config_path = config_path  # named in errors about the file
        #: set when serving cannot begin (the first plan is infeasible): the loops stop and
        #: ``serve`` raises it (exit 2) — nothing was submitted
        self.fatal: ConfigError | None = None
        self._stop: threading.Event | None = None
        self._init_plan_state()
        self.last_decision: Decision | None = None
        self.last_observed: Observed | None = None
        self._lock = threading.RLock()
        self._engine_pool: ThreadPoolExecutor | None = None
        self._init_scale_to_zero(wake_folder)

    def _init_plan_state(self) -> None:
        """No plan yet: the first cycle plans (``_maybe_plan``), with nothing to compare to."""
        self.plan: DesiredPlan | None = None
        self.plan_history = PlanHistory()  # the plans this daemon made: hysteresis (decide)
        self.plan_time: float | None = None
        self.planned_demand: dict[str, ModelDemand] = {}
        self.unavailable_at_plan: frozenset[str] | None = None
        self.plan_backoff = Backoff(base_s=self.settings.poll_interval_s, max_s=300.0)

    def _init_scale_to_zero(self, wake_folder: Path | None) -> None:
        """Scale to zero: which models are cold (``coral_hpc.reconcile.idle``); the folder the
        gateway asks for wakes in (``coral_hpc.gateway.wake``); the event that cuts the
        reconcile wait short."""
        self.idle = IdleTracker(idle_rules(self.deployment))
        self.wake_folder = wake_folder
        self.nudge = threading.Event()
        #: models no partition can ever run, and why (a wake of them fails at once)
        self.unservable: dict[str, str] = {}
        self.typical_startup_s = 0.0  # learnt each cycle (_learn_startup)
        #: start-up per layout (coral_hpc.plan.layout_startup), learnt each cycle while models
        #: scale to zero: a wake's layout and its Retry-After use them
        self.layout_startups: dict[str, LayoutStartup] = {}
        self.profile_startups: dict[ProfileKey, LayoutStartup] = {}
        #: wakes the demand scrape found (requests whose wake signal was missed)
        self._scale_triggers: list[Trigger] = []

    # ------------------------------------------------------------------ configuration

    def reload(self, deployment: Deployment) -> None:
        """Use a new ``models.yaml`` (SIGHUP); the next cycle re-plans with it."""
        with self._lock:
            self.deployment = deployment
            self.settings = ReconcileSettings.from_policy(deployment.policy)
            self.observer.deployment = deployment
            self.observer.settings = self.settings
            self.actor.deployment = deployment
            self.actor.settings = self.settings
            self.idle.configure(idle_rules(deployment))
            self.unservable = {}  # a new file may make them servable
            self.plan_time = None  # re-plan now
            self.store.add_event(self.clock(), "reload", "models.yaml reloaded")

    # ------------------------------------------------------------------ the reconcile step

    def reconcile_once(self) -> bool:
        """observe → publish → re-plan if out of date → decide → act → publish. Returns True
        when the cycle should run again at once (a new exclusion asks for a new plan)."""
        with self._lock:
            began = time.monotonic()
            observed = self.observer.observe()
            self.metrics.slurm_seconds.observe(time.monotonic() - began)
            self.last_observed = observed
            if observed.error:
                self.metrics.slurm_errors.labels("observe").inc()
                log.warning("%s", observed.error)
            now = self.clock()
            # route what is READY now: planning (a solve) and acting (sbatch) take seconds, and
            # `status` already calls these replicas READY
            scaled = self._follow_idle(observed, now)
            self.publish(now)
            self._learn_startup()
            self._maybe_plan(observed, now, scaled)
            if self.fatal is not None:
                return False  # nothing decided or acted on: serve stops with the error
            decision = decide(self.plan, observed.facts, now, self.settings,
                              # also those ended within the cool-down: a failed start
                              # continues their back-off (reconcile.start_backoff)
                              exclusions=self.store.exclusions(
                                  now - self.settings.crash_cooldown_s),
                              observation=observed.observation,
                              # a cold model may lose its last READY replica: it drains
                              configured=frozenset(m.name for m in self.deployment.models)
                              - self.idle.cold(),
                              history=self.plan_history)
            self.last_decision = decision
            if decision.held_back and any(isinstance(a, (Submit, Drain, Cancel))
                                          for a in decision.actions) is False:
                log.debug("%s", decision.held_back)
            if not self.may_act():
                # another daemon took the lease over: it acts now, we must not
                log.error("lease no longer ours: not acting on %d action(s)",
                          len(decision.actions))
                return False
            result = self.actor.apply(decision)
            for kind, items in (("submit", result.submitted), ("drain", result.drained),
                                ("cancel", result.cancelled), ("exclude", result.excluded)):
                if items:
                    self.metrics.actions.labels(kind).inc(len(items))
            if result.transient:
                self.metrics.slurm_errors.labels("act").inc()
            self.publish(now)
            if self.on_cycle is not None:
                try:
                    self.on_cycle(now)
                except Exception:  # a status file must never stop the reconcile loop
                    log.exception("publishing status failed")
            return bool(result.excluded)

    def _learn_startup(self) -> None:
        """Rotate replicas at least one start-up time ahead of their walltime: the slowest
        recent one (``reconcile.startup.lead_startup_s``)."""
        observed = self.store.startups(limit=50)
        # a wake's Retry-After uses the typical start-up, walltime leads the slowest
        self.typical_startup_s = learned_startup_s(observed, self.deployment.policy.startup_time_s)
        startup = lead_startup_s(observed, self.deployment.policy.startup_time_s)
        if startup != self.settings.startup_s:
            self.settings = replace(self.settings, startup_s=startup)
            self.observer.settings = self.actor.settings = self.settings
            self._warn_if_time_limit_short(startup)
        if self.idle.tracked:
            self.layout_startups = own_layout_startups(self.store.replicas(live_only=False))
            self.profile_startups = profile_startups(measured_profile_dirs(self.deployment))

    def _startup_of(self, record: ReplicaRecord) -> float:
        """Seconds from ``record``'s job start to READY, from its layout
        (:func:`~coral_hpc.plan.layout_startup.layout_startup`)."""
        return replica_startup(self.deployment, record, self.layout_startups,
                               self.profile_startups,
                               self.typical_startup_s or self.deployment.policy.startup_time_s)

    def _woken_from_zero(self, observed: Observed,
                         statuses: dict[str, Any]) -> frozenset[str]:
        """Models scaled to zero, not cold, with no replica alive (none READY, starting or
        queued): the plan gives each its first replica, on the layout READY soonest."""
        alive = {f.record.model for f in observed.facts
                 if statuses[f.record.id].state.live
                 and statuses[f.record.id].state is not ReplicaState.DRAINING}
        return frozenset(self.idle.tracked - self.idle.cold() - alive)

    def _warn_if_time_limit_short(self, startup_s: float) -> None:
        """A walltime lead is at most half a replica's usable time (``reconcile.status``): with
        a start-up longer than that, successors cannot be READY before their predecessors stop
        and the model has gaps. Say so, with the time limit that would fit."""
        limit = self.deployment.cluster.time_limit_s
        signal = min(self.settings.walltime_signal_s, 0.5 * limit)
        if startup_s <= 0.5 * (limit - signal):
            return
        fits = math.ceil((2 * startup_s + signal) / 60)
        message = (f"replicas take up to {startup_s:.0f}s to start, more than half of the "
                   f"{limit - signal:.0f}s a {self.deployment.cluster.time_limit} time limit "
                   f"leaves them: walltime successors cannot start a whole start-up ahead and "
                   f"the models may have gaps; cluster.time_limit of at least {fits} min fits")
        log.warning("%s", message)
        self.store.add_event(self.clock(), "warning", message)

    def _look_for_wakes(self) -> None:
        """Nudge the reconcile loop when the gateway asked for a wake of a model scaled to zero
        (the models read now: a reload may have changed them)."""
        if self.wake_folder is None or not self.idle.tracked:
            return
        if set(pending_wakes(self.wake_folder)) & self.idle.tracked:
            self.nudge.set()

    def _follow_idle(self, observed: Observed, now: float) -> list[Trigger]:
        """Scale to zero: take the gateway's wake requests, apply the idle rule, record what
        changed; a re-plan trigger for each model that went cold or began to wake."""
        if not self.idle.tracked:
            return []
        statuses = {f.record.id: replica_status(f, now, self.settings) for f in observed.facts}
        if not self.idle.seeded:
            rules = self.idle.rules
            lookback = max(max(4 * r.idle_after_s, r.wake_timeout_s) for r in rules.values())
            live = {f.record.model for f in observed.facts if statuses[f.record.id].state.live}
            self.idle.seed(last_requests(self.store, rules, now - lookback), live, now)
        changes: list[Transition] = []
        if self.wake_folder is not None:
            for model, at in sorted(pending_wakes(self.wake_folder).items()):
                change = self.idle.wake(model, min(at, now))
                clear_wake(self.wake_folder, model)
                if change is not None:
                    changes.append(change)
        changes += self.idle.step(now, ready_counts(observed.facts, statuses))
        earlier, self._scale_triggers = self._scale_triggers, []
        return earlier + self._record_transitions(changes, now)

    def _record_transitions(self, changes: list[Transition], now: float) -> list[Trigger]:
        triggers = []
        for change in changes:
            self.metrics.scale_to_zero.labels(change.model, change.to.value).inc()
            self.store.add_event(now, f"scale_{change.to.value}",
                                 f"{change.model} {change.to.value}: {change.reason}",
                                 model=change.model)
            if change.to is Temperature.COLD:
                triggers.append(Trigger(TriggerKind.IDLE, f"{change.model} went cold "
                                                          f"({change.reason})"))
            elif change.to is Temperature.WAKING:
                triggers.append(Trigger(TriggerKind.WAKE, f"{change.model} woken by "
                                                          f"{change.reason}"))
        return triggers

    def _maybe_plan(self, observed: Observed, now: float,
                    scaled: list[Trigger] | None = None) -> None:
        """Re-plan when a trigger (scale to zero, time, demand, failures, exclusions) says the
        plan is out of date, Slurm was seen and the plan back-off allows another attempt."""
        demand = self._demand_now(now)
        triggers = [*(scaled or []), *self._replan_triggers(observed, now, demand)]
        if not triggers or observed.snapshot is None or not self.plan_backoff.ready(now):
            return
        planned_for, request = self._plan_request(observed, observed.snapshot, now, demand)
        try:
            outcome = self.planner(request)
        except InfeasiblePlan as exc:
            self._plan_infeasible(exc, observed, planned_for, now)
            return
        except Exception as exc:
            self._plan_failed(now, exc)
            return
        self._adopt_plan(outcome, observed, demand, triggers, now)

    def _demand_now(self, now: float) -> dict[str, ModelDemand]:
        """Each model's demand from the stored requests and the scraped windows; sets the
        demand gauges."""
        policy = self.deployment.policy
        tau = policy.replan_interval_s
        # the newest window ends up to a window and a scrape before now; deployment_demand keeps
        # the newest policy.demand_windows of those still fresh
        windows = self.scraper.windows_at(now, (policy.demand_windows + 1) * policy.demand_window_s
                                          + policy.poll_interval_s)
        demand = deployment_demand(self.deployment, self.store.demand_since(now - 10 * tau), tau,
                                   windows)
        for name, item in demand.items():
            self.metrics.demand.labels(name).set(item.planned_rps)
        return demand

    def _replan_triggers(self, observed: Observed, now: float,
                         demand: dict[str, ModelDemand]) -> list[Trigger]:
        """Why the current plan is out of date (``reconcile.replan_triggers``); empty when it
        is not."""
        changed = (changed_models(self.planned_demand, demand,
                                  self.settings.demand_change_threshold)
                   if self.planned_demand else [])
        return replan_triggers(
            self.plan_time, now, self.settings, observed.facts, changed, observed.unavailable,
            self.unavailable_at_plan, self.store.exclusions(now),
        )

    def _plan_request(self, observed: Observed, snapshot: ClusterSnapshot, now: float,
                      demand: dict[str, ModelDemand]) -> tuple[Deployment, PlanRequest]:
        """The planner's input on ``snapshot``: the deployment as planned (scale to zero
        applied), the replicas that go on serving, the exclusions in force and the learnt
        start-up time."""
        exclusions = self.store.exclusions(now)
        statuses = {f.record.id: replica_status(f, now, self.settings) for f in observed.facts}
        running = tuple((f.record.template_id, f.record.partitions) for f in observed.facts
                        if goes_on_serving(statuses[f.record.id]))
        # scale to zero: cold models at zero demand, warm ones at least one replica
        planned_for, planned_demand = planning_inputs(self.deployment, demand, self.idle)
        request = PlanRequest(
            deployment=planned_for,
            snapshot=snapshot,
            demand=planned_demand,
            running=running,
            excluded_templates=frozenset(e.target.template_id for e in exclusions
                                         if isinstance(e.target, TemplateExclusion)),
            excluded_shapes=frozenset((e.target.template_id, e.target.partitions)
                                      for e in exclusions
                                      if isinstance(e.target, ShapeExclusion)),
            startup_s=learned_startup_s(self.store.startups(limit=50),
                                        self.deployment.policy.startup_time_s),
            waking=self._woken_from_zero(observed, statuses),
            layout_startups=dict(self.layout_startups),
        )
        return planned_for, request

    def _plan_infeasible(self, exc: InfeasiblePlan, observed: Observed,
                         planned_for: Deployment, now: float) -> None:
        """No plan fits: an unservable woken model goes cold (the others planned at once); the
        first plan stops serving (exit 2); a later one keeps the current plan and backs off."""
        if self._unservable(exc, planned_for, now):
            # a wake (or a warm model's floor) no partition can ever hold: that model goes
            # cold and says why; plan the others at once
            self._maybe_plan(observed, now, [Trigger(TriggerKind.WAKE, "unservable model")])
            return
        if self.plan_history.plans == 0:
            # the first plan: the file asks for what this cluster can never give
            # (min_replicas beyond any capacity); stop before submitting anything, as
            # `coral-hpc plan` does. Later, a cluster that shrank keeps the current plan.
            path = str(self.config_path or "models.yaml")
            self.fatal = ConfigError(path, infeasible_problems(
                path, self.deployment, done="nothing was submitted; serve stops",
                shortfalls=exc.shortfalls))
            self.store.add_event(now, "plan_error", f"no feasible plan: {exc}; stopping")
            if self._stop is not None:
                self._stop.set()
            return
        self._plan_failed(now, exc)

    def _adopt_plan(self, outcome: PlanOutcome, observed: Observed,
                    demand: dict[str, ModelDemand], triggers: list[Trigger], now: float) -> None:
        """Make ``outcome`` the plan decide works to; record it (store, metrics, an event
        naming the triggers)."""
        self.plan_backoff.succeeded()
        self.plan = outcome.desired
        self.plan_history.observe(outcome.desired)
        self.plan_time = now
        self.planned_demand = demand
        self.unavailable_at_plan = observed.unavailable
        self.metrics.plan_cost.set(outcome.cost_per_hour)
        self.metrics.solve_seconds.observe(outcome.solve_s)
        self.metrics.plans.labels(triggers[0].kind.value).inc()
        for model in self.deployment.models:
            self.metrics.plan_replicas.labels(model.name).set(
                sum(s.count for s in outcome.desired.slots if s.model == model.name))
        self.store.add_plan(now, outcome.cost_per_hour, slot_rows(outcome.desired),
                            {m: d.planned_rps for m, d in demand.items()},
                            solve_s=outcome.solve_s, status=outcome.status,
                            demand_basis=demand_basis(demand.values()))
        summary = ", ".join(f"{s.count}×{s.template_id}@{','.join(s.partitions)}"
                            for s in outcome.desired.slots) or "no replicas"
        # a wake's choice of layout (coral_hpc.plan.layout_startup) is said with the plan
        woken = [line for line in (outcome.solved.plan.binding if outcome.solved else ())
                 if " woken from zero: " in line]
        self.store.add_event(now, "plan", f"{outcome.status}, {outcome.cost_per_hour:.3g}/h: "
                             f"{summary} (because: {'; '.join(t.reason for t in triggers)})"
                             + "".join(f"; {line}" for line in woken))

    def _unservable(self, exc: InfeasiblePlan, planned_for: Deployment, now: float) -> bool:
        """Models scaled to zero whose one-replica floor made the plan infeasible: marked
        unservable (the gateway refuses their requests at once, saying why) and cold. True
        when there were any."""
        floored = self.idle.tracked - self.idle.cold()
        names = {planned_for.models[i].name for s in exc.shortfalls for i in s.models
                 if i < len(planned_for.models)} & floored
        for name in sorted(names):
            why = f"no partition can ever run it ({exc})"
            self.unservable[name] = why
            self.idle.force_cold(name, now)
            self.metrics.scale_to_zero.labels(name, "impossible").inc()
            self.store.add_event(now, "scale_impossible", f"{name} cannot be woken: {why}",
                                 model=name)
        return bool(names)

    def _plan_failed(self, now: float, exc: Exception) -> None:
        delay = self.plan_backoff.failed(now)
        self.metrics.loop_errors.labels("plan").inc()
        self.store.add_event(now, "plan_error", f"planning failed: {exc}; retry in {delay:.0f}s")
        # an infeasible plan or a solver this host lacks is the site's to fix and its message
        # says how: one line, not a traceback (which only helps with an unexpected error)
        log.error("planning failed: %s", exc,
                  exc_info=not isinstance(exc, (InfeasiblePlan, SolverUnavailable)))

    # ------------------------------------------------------------------ publishing

    def publish(self, now: float | None = None) -> bool:
        """Write the routing table when READY replicas changed; refresh state gauges."""
        now = self.clock() if now is None else now
        observed = self.last_observed
        facts = observed.facts if observed is not None else self.observer._facts(now, frozenset())
        # re-read: the act step may have drained replicas since the observation
        live = {r.id: r for r in self.store.replicas(live_only=True)}
        current = [type(f)(live[f.record.id], f.node_unavailable) for f in facts
                   if f.record.id in live]
        statuses = {f.record.id: replica_status(f, now, self.settings) for f in current}
        models = [m.name for m in self.deployment.models]
        self.metrics.set_replicas(models, [(f.record.model, statuses[f.record.id].state)
                                           for f in current])
        startup = self.typical_startup_s or self.deployment.policy.startup_time_s
        return self.publisher.publish(
            ready_routes(models, current, statuses),
            wake_infos(self.idle, current, statuses, startup, now, self.unservable,
                       self._startup_of))

    # ------------------------------------------------------------------ demand

    def scrape_once(self) -> int:
        """Store the gateway's counter deltas; returns the rows written."""
        if self.demand_source is None:
            return 0
        snapshot = self.demand_source()
        rows = self.scraper.intervals(snapshot, self.clock(),
                                      [m.name for m in self.deployment.models])
        self.store.add_demand(rows)
        with self._lock:  # requests a wake signal missed wake the model here
            changes = [c for r in rows if r.requests > 0
                       and (c := self.idle.requests_seen(r.model, r.end)) is not None]
            triggers = self._record_transitions(changes, self.clock())
            if triggers:
                self._scale_triggers.extend(triggers)  # the next cycle re-plans for them
                self.nudge.set()
        return len(rows)

    def scrape_engines_once(self) -> int:
        """Read every READY replica's engine ``/metrics`` (vLLM's names, read through
        :mod:`coral_hpc.engine.vllm_metrics`) into the daemon's per-model engine gauges (load:
        running / waiting requests, KV-cache use; the live replicas' token counters). Returns
        how many replicas answered. A replica that does not answer is only counted as a failed
        scrape: ``/health`` (the observe step) decides whether it serves."""
        now = self.clock()
        with self._lock:
            ready = [r for r in self.store.replicas(live_only=True) if r.endpoint
                     and replica_status(ReplicaFacts(r), now, self.settings).state
                     is ReplicaState.READY]
        if self._engine_pool is None:
            self._engine_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="engine")
        loads = list(self._engine_pool.map(lambda r: fetch_engine_load(r.endpoint), ready))
        self.metrics.set_engine_loads([m.name for m in self.deployment.models],
                                      [(r.model, load) for r, load in zip(ready, loads)])
        return sum(load is not None for load in loads)

    # ------------------------------------------------------------------ helpers

    def resume_plan(self) -> None:
        """Load the last stored plan (for status until the first new plan; a restart re-plans
        on its first cycle anyway)."""
        stored = self.store.latest_plan()
        if stored is not None:
            self.plan = plan_from_rows(stored.rows, stored.time)

    def _throughput_of(self, template_id: str) -> float | None:
        for source in ([self.plan] if self.plan else []):
            for slot in source.slots:
                if slot.template_id == template_id:
                    return slot.throughput
        stored = self.store.latest_plan()
        for row in stored.rows if stored else []:
            if row.get("template_id") == template_id:
                return float(row["throughput"])
        return None

    def loops(self, stop: threading.Event,
              monotonic: Callable[[], float] = time.monotonic) -> list[Loop]:
        """The daemon's loops: reconcile (poll interval, or longer while the Slurm call budget
        has no tokens for a cycle), demand scrape (poll interval) and the engines' load
        (:data:`ENGINE_SCRAPE_S`)."""
        def on_error(name: str) -> None:
            self.metrics.loop_errors.labels(name).inc()

        self._stop = stop
        pace = self.budget.observe_pace if self.budget is not None else None
        # the nudge and the wake watcher run whenever the gateway can ask for wakes, not only
        # when models scale to zero at start: a SIGHUP reload may turn scale to zero on, and
        # its wakes must then be seen within half a second, not at the next cycle
        loops = [Loop("reconcile", self.settings.poll_interval_s, self.reconcile_once, stop,
                      on_error, pace=pace, monotonic=monotonic,
                      nudge=self.nudge if self.idle.tracked or self.wake_folder else None)]
        if self.wake_folder is not None:
            # the gateway's wake requests: looked for twice a second, a plan at once
            loops.append(Loop("wakes", 0.5, self._look_for_wakes, stop, on_error,
                              monotonic=monotonic))
        if self.demand_source is not None:
            loops.append(Loop("scrape", self.settings.poll_interval_s,
                              lambda: self.scrape_once() and None, stop, on_error,
                              monotonic=monotonic))
        # engine load is for people and dashboards: every few seconds is fresh enough
        loops.append(Loop("engines", max(self.settings.poll_interval_s, ENGINE_SCRAPE_S),
                          lambda: self.scrape_engines_once() and None, stop, on_error,
                          monotonic=monotonic))
        return loops
