"""Scale to zero in the loop that acts: the daemon on a fake Slurm (tests/fakes) over the
recorded local cluster, a real store and a virtual clock. A model idle for ``idle_after``
drains through the normal path (out of the routing table, then cancelled); a wake asked for by
the gateway is planned in the same cycle, once for many requests; a model no partition can run
is refused at once; a restart during a wake goes on with it."""

from __future__ import annotations

from coral_hpc.config import load_deployment
from coral_hpc.daemon.core import Daemon
from coral_hpc.gateway.table import read_routing_table
from coral_hpc.gateway.wake import WakeSignal, pending_wakes, wake_dir
from coral_hpc.plan.capacity import Shortfall
from coral_hpc.plan.planner import InfeasiblePlan, PlanOutcome, PlanRequest
from coral_hpc.reconcile.act import Actor
from coral_hpc.reconcile.observe import Observer
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.store import DemandInterval, open_store
from tests.fakes.slurm import FakeSlurm, recorded_snapshot
from tests.unit.test_reconcile_loop import EXAMPLE, Loop, ScriptedPlanner, slot, ticking_clock

IDLE = 1200.0
MODEL = "qwen3-8b"


class DemandPlanner(ScriptedPlanner):
    """The scripted slots, but only for models with demand or a floor: what the real planner
    does with a model at zero demand and min_replicas 0."""

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        wanted = {m.name for m in request.deployment.models
                  if m.min_replicas > 0 or request.demand[m.name].planned_rps > 0}
        if self.error is not None:
            self.requests.append(request)
            raise self.error
        outcome = super().__call__(request)
        slots = tuple(s for s in outcome.desired.slots if s.model in wanted)
        return PlanOutcome(type(outcome.desired)(0.0, slots), 0.0, 0.0, "optimal")


class ScaledLoop(Loop):
    """tests.unit.test_reconcile_loop's daemon, every model scaled to zero after IDLE s."""

    def __init__(self, tmp_path, planner, clock=None, db="daemon.db"):
        self.tmp = tmp_path
        base = load_deployment(EXAMPLE)
        policy = base.policy.model_copy(update={"idle_after": IDLE, "wake_timeout": 300.0})
        models = tuple(m.model_copy(update={"demand": "auto"}) for m in base.models)
        self.deployment = base.model_copy(update={"state_dir": tmp_path / "shared",
                                                  "policy": policy, "models": models})
        self.clock = clock or ticking_clock()
        self.slurm = FakeSlurm(recorded_snapshot(), self.clock)
        self.store = open_store(tmp_path / db)
        self.planner = planner
        self.healthy: set[str] = set()
        self.settings = settings = ReconcileSettings.from_policy(self.deployment.policy)
        observer = Observer(self.deployment, self.store, self.slurm, settings, self.clock,
                            probe=lambda url: url in self.healthy)
        self.actor = Actor(self.deployment, self.store, self.slurm, settings, self.clock, None,
                           submit=self.slurm.submit_spec)
        self.wakes = wake_dir(self.deployment.state_path)
        self.daemon = Daemon(self.deployment, self.store, self.slurm, planner,
                             api_key_file=None, table_path=tmp_path / "routes.json",
                             clock=self.clock, observer=observer, actor=self.actor,
                             wake_folder=self.wakes)

    def table(self):
        return read_routing_table(self.tmp / "routes.json")


def _planner():
    return DemandPlanner(slot(), slot(model="phi-4"), slot(model="llama-70b"))


def _events(loop, kind):
    return [e.message for e in loop.store.events(limit=200, kind=kind)]


def test_models_without_requests_start_cold_and_nothing_is_submitted(tmp_path):
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    assert loop.daemon.idle.cold() == {"qwen3-8b", "phi-4", "llama-70b"}
    assert loop.live() == [] and not loop.slurm.submitted
    wake = loop.table().wake
    assert wake[MODEL].state == "cold" and wake[MODEL].startup_s > 0


def test_a_wake_is_planned_in_the_same_cycle_once_for_many_requests(tmp_path):
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    plans_before = len(loop.planner.requests)
    signal = WakeSignal(loop.wakes)
    asked = [signal.ask(MODEL) for _ in range(50)]  # fifty requests during one wake
    assert asked.count(True) == 1 and MODEL in pending_wakes(loop.wakes)
    loop.cycle(1)  # well within the re-plan interval: the wake re-plans by itself
    assert len(loop.planner.requests) == plans_before + 1
    request = loop.planner.requests[-1]
    assert request.deployment.model(MODEL).min_replicas == 1
    assert request.deployment.model("phi-4").min_replicas == 0  # still cold
    (record,) = loop.live()
    assert record.model == MODEL and not pending_wakes(loop.wakes)
    assert loop.table().wake[MODEL].state == "waking"
    assert any("woken" in m or "waking" in m for m in _events(loop, "scale_waking"))
    signal.clock = lambda: 1e12  # later requests during the same wake: no second replica
    signal.ask(MODEL)
    loop.cycle(1)
    loop.cycle(1)
    assert len(loop.slurm.submitted) == 1


def test_woken_model_is_routed_then_drains_after_idle_after(tmp_path):
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    (record,) = loop.live()
    url = loop.serve(record.id)
    loop.cycle(2)
    table = loop.table()
    assert [r.url for r in table.models[MODEL]] == [url] and MODEL not in table.wake
    # idle: warm for IDLE seconds after it became READY, then the normal drain path
    for _ in range(int(IDLE // 60) - 1):
        loop.cycle(60)
    assert loop.store.replica(record.id).drain_requested_at is None
    loop.cycle(120)
    assert MODEL in loop.daemon.idle.cold()
    assert loop.store.replica(record.id).drain_requested_at is not None
    assert loop.table().models[MODEL] == ()
    loop.cycle(loop.settings.drain_grace_s + 1)
    assert record.job_id in [c[0] for c in loop.slurm.cancelled]
    assert any("no request for" in m for m in _events(loop, "scale_cold"))


def test_requests_keep_a_model_warm(tmp_path):
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    (record,) = loop.live()
    loop.serve(record.id)
    loop.cycle(2)
    for _ in range(60):  # an hour, a request every 5 minutes, as the scrape stores it
        loop.clock.advance(60)
        now = loop.clock.now
        if int(now) % 300 < 60:
            loop.store.add_demand([DemandInterval(now - 60, now, MODEL, 1, 100, 10, 0)])
            loop.daemon.idle.requests_seen(MODEL, now)
        loop.cycle()
    assert loop.store.replica(record.id).drain_requested_at is None
    assert MODEL not in loop.daemon.idle.cold()


def test_a_wake_no_partition_can_run_is_refused_at_once_and_the_rest_planned(tmp_path):
    planner = _planner()
    loop = ScaledLoop(tmp_path, planner)
    loop.cycle()
    index = [m.name for m in loop.deployment.models].index("llama-70b")
    real = DemandPlanner.__call__

    def infeasible_for_llama(self, request):
        if request.deployment.model("llama-70b").min_replicas > 0:
            self.requests.append(request)
            raise InfeasiblePlan("llama-70b needs 2 GPUs of 80 GB, no partition has them",
                                 (Shortfall((index,), {index: 0}, 8, ("a100",)),))
        return real(self, request)

    planner.__class__ = type("Infeasible", (DemandPlanner,), {"__call__": infeasible_for_llama})
    WakeSignal(loop.wakes).ask("llama-70b")
    loop.cycle(1)
    assert loop.daemon.fatal is None
    info = loop.table().wake["llama-70b"]
    assert info.state == "cold" and "no partition can ever run it" in info.impossible
    assert loop.live() == []
    assert _events(loop, "scale_impossible")


def test_a_restart_during_a_wake_goes_on_with_it(tmp_path):
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    WakeSignal(loop.wakes).ask(MODEL)
    loop.store.add_demand([DemandInterval(loop.clock.now - 5, loop.clock.now, MODEL, 1, 0, 0, 0)])
    loop.cycle(1)
    (record,) = loop.live()
    loop.daemon.observer.close()
    loop.store.close()
    again = ScaledLoop(tmp_path, _planner(), clock=loop.clock)
    again.cycle(30)  # the stored request keeps it warm: the pending replica is kept
    assert [r.id for r in again.live()] == [record.id]
    assert MODEL not in again.daemon.idle.cold() and "phi-4" in again.daemon.idle.cold()
    assert not again.slurm.cancelled
    assert again.table().wake[MODEL].state == "waking"
    again.close()


def _scale(loop):
    from coral_hpc.daemon.status_file import status_data
    data = status_data(loop.deployment, loop.store, loop.clock.now)
    return {m["name"]: m["scale"] for m in data["models"]}


def test_status_shows_cold_waking_with_slurms_estimate_then_warm_and_cold_again(tmp_path):
    from coral_hpc.cli.status import scale_words

    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    assert _scale(loop)[MODEL]["state"] == "cold"
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    (record,) = loop.live()
    start = loop.clock.now + 600  # a busy cluster: Slurm expects to start it in 10 minutes
    loop.store.update_replica(record.id, expected_start=start)
    scale = _scale(loop)[MODEL]
    assert scale["state"] == "waking" and scale["expected_start"] == start
    assert scale["ready_by"] == start + loop.deployment.policy.startup_time_s
    words = scale_words(scale, loop.clock.now)
    assert words.startswith("waking (Slurm starts it") and "READY ~" in words
    assert _scale(loop)["phi-4"]["state"] == "cold"
    loop.serve(record.id)
    loop.cycle(2)
    assert _scale(loop)[MODEL]["state"] == "warm"
    loop.cycle(IDLE + 10)
    loop.cycle(loop.settings.drain_grace_s + 1)
    assert _scale(loop)[MODEL]["state"] == "cold"
    counted = {(s.labels["model"], s.labels["to"]): s.value
               for metric in loop.daemon.metrics.registry.collect()
               if metric.name == "coral_scale_to_zero_transitions"
               for s in metric.samples if s.name.endswith("_total")}
    assert counted[(MODEL, "waking")] == 1 and counted[(MODEL, "warm")] == 1
    assert counted[(MODEL, "cold")] == 2  # at the start, and after idling


def test_a_wake_racing_the_drain_of_its_last_replica_gets_a_new_one(tmp_path):
    """The model went cold and its replica is draining when a request comes: the drain goes
    on (requests in flight finish on it), and the wake submits a successor at once."""
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    (first,) = loop.live()
    loop.serve(first.id)
    loop.cycle(2)
    loop.cycle(IDLE + 10)
    assert loop.store.replica(first.id).drain_requested_at is not None
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    live = {r.id: r for r in loop.live()}
    assert first.id in live and len(live) == 2  # the draining one and its successor
    loop.cycle(loop.settings.drain_grace_s + 1)
    assert first.job_id in [c[0] for c in loop.slurm.cancelled]
    (second,) = [r for r in loop.live() if r.id != first.id]
    assert second.drain_requested_at is None
    assert loop.table().wake[MODEL].state == "waking"


def test_a_wake_between_two_plans_does_not_wait_for_the_interval_and_reload_keeps_state(tmp_path):
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    loop.cycle(loop.settings.replan_interval_s - 5)  # a plan is due in 5 s
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    assert [r.model for r in loop.live()] == [MODEL]
    loop.daemon.reload(loop.deployment)  # SIGHUP with the same file: the wake goes on
    loop.cycle(1)
    assert [r.model for r in loop.live()] == [MODEL] and MODEL not in loop.daemon.idle.cold()


def test_a_nudge_cuts_the_reconcile_wait_short_but_not_the_slurm_budget():
    import threading
    import time as real_time

    from coral_hpc.daemon.loop import Loop as DaemonLoop

    stop, nudge = threading.Event(), threading.Event()
    ran: list[float] = []

    def step():
        ran.append(real_time.monotonic())
        if len(ran) >= 2:
            stop.set()

    loop = DaemonLoop("reconcile", 60.0, step, stop, nudge=nudge)
    thread = loop.start()
    real_time.sleep(0.3)
    nudge.set()  # a wake: the next cycle runs now, not in a minute
    thread.join(timeout=5)
    assert not thread.is_alive() and len(ran) == 2 and ran[1] - ran[0] < 5
    # the call budget's pace still holds: a nudge never makes a cycle come sooner than it
    stop.clear()
    ran.clear()
    paced = DaemonLoop("reconcile", 60.0, step, stop, pace=lambda elapsed: 1.0, nudge=nudge)
    nudge.set()
    thread = paced.start()
    thread.join(timeout=10)
    assert len(ran) == 2 and ran[1] - ran[0] >= 0.95


def test_requests_the_scrape_finds_for_a_cold_model_wake_it_without_a_signal(tmp_path):
    """A wake file lost (or a gateway from before wakes) does not leave the model cold: the
    demand scrape sees its requests and the next cycle plans for it."""
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    plans = len(loop.planner.requests)
    snapshot = {"models": {MODEL: {"requests_total": 0}}}
    loop.daemon.demand_source = lambda: snapshot
    loop.daemon.scrape_once()  # the baseline
    # one request in 25 s: 0.04 req/s, below the demand trigger's floor (0.05 req/s), within
    # the example's 30 s re-plan interval: only the wake can re-plan now
    snapshot = {"models": {MODEL: {"requests_total": 1}}}
    loop.clock.advance(25)
    loop.daemon.scrape_once()
    assert loop.daemon.nudge.is_set()
    loop.cycle(1)
    assert len(loop.planner.requests) == plans + 1
    assert [r.model for r in loop.live()] == [MODEL]


def test_a_reload_that_turns_scale_to_zero_on_has_its_wakes_seen_at_once(tmp_path):
    """A daemon started without scale to zero, then reloaded (SIGHUP) with it: a wake is seen
    by the half-second watcher and nudges the reconcile loop, as after a start with it."""
    import threading

    scaled = ScaledLoop(tmp_path, _planner())
    plain = scaled.deployment.model_copy(update={"policy": scaled.deployment.policy.model_copy(
        update={"idle_after": None})})
    daemon = Daemon(plain, scaled.store, scaled.slurm, scaled.planner, api_key_file=None,
                    table_path=tmp_path / "routes2.json", clock=scaled.clock,
                    wake_folder=scaled.wakes)
    assert not daemon.idle.tracked
    loops = {loop.name: loop for loop in daemon.loops(threading.Event())}
    assert "wakes" in loops and loops["reconcile"].nudge is daemon.nudge
    WakeSignal(scaled.wakes).ask(MODEL)
    loops["wakes"].step()
    assert not daemon.nudge.is_set()  # not scaled to zero yet: nothing to wake
    daemon.reload(scaled.deployment)  # SIGHUP: now every model scales to zero
    loops["wakes"].step()
    assert daemon.nudge.is_set()


def test_the_plan_for_a_wake_names_the_model_woken_from_zero_and_its_layouts_start_ups(tmp_path):
    """The planner is told which models wake from zero (their replica goes on the layout READY
    soonest) and the start-up of each layout this deployment's replicas have shown."""
    loop = ScaledLoop(tmp_path, _planner())
    loop.cycle()
    assert loop.planner.requests == [] or not loop.planner.requests[-1].waking
    first = _serve_once(loop)
    loop.cycle(IDLE + 10)
    loop.cycle(loop.settings.drain_grace_s + 1)
    assert MODEL in loop.daemon.idle.cold()
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    request = loop.planner.requests[-1]
    assert request.waking == frozenset({MODEL})
    seen = request.layout_startups[first.template_id]
    assert seen.seconds == first.ready_at - first.started_at
    assert "replicas of" in seen.source


def _serve_once(loop):
    """Wake MODEL, bring its replica up and READY; the stored record."""
    WakeSignal(loop.wakes).ask(MODEL)
    loop.cycle(1)
    (replica,) = [r for r in loop.live() if r.model == MODEL]
    loop.serve(replica.id)
    loop.cycle(2)
    return loop.store.replica(replica.id)
