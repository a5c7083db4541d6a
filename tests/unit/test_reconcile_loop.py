"""The loop that acts — Observer, Actor, Daemon.reconcile_once and its planning step — on a fake
Slurm (tests/fakes) over the recorded local cluster, a real SQLite store and a fake clock.

Covered: a plan submitted, started and served; a restart (database kept, or lost) adopting the
running job instead of submitting it again; a daemon killed between recording and sbatch; stale
and partial observations (nothing destructive, nothing submitted); refused, failed and timed-out
submissions; a cancel Slurm did not carry out; a planner that fails.
"""

from __future__ import annotations

import threading

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.core import Daemon
from coral_hpc.gateway.table import read_routing_table
from coral_hpc.launch.endpoint import Endpoint, write_endpoint
from coral_hpc.launch.stop import DRAIN_SIGNAL
from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.plan.planner import InfeasiblePlan, PlanOutcome, PlanRequest
from coral_hpc.reconcile.act import Actor
from coral_hpc.reconcile.observe import Observer
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.slurm.errors import SlurmRejected, SlurmTimeout, SlurmUnavailable
from coral_hpc.store import StartupObservation, open_store
from coral_hpc.types import (
    ExclusionKind,
    ReplicaLayout,
    ShapeExclusion,
    StageLayout,
    TemplateExclusion,
)
from tests.conftest import REPO
from tests.fakes.slurm import FakeSlurm, recorded_22_05_snapshot, recorded_snapshot
from tests.support.virtual_time import VirtualClock

EXAMPLE = REPO / "examples" / "models.yaml"
START = 50_000.0


def slot(partition: str = "a100", gpu: str | None = None, model: str = "qwen3-8b",
         count: int = 1, cost: float = 1.0) -> Slot:
    gpu = gpu or partition
    layout = ReplicaLayout(1, (StageLayout(partition, gpu, 36),), "auto" if gpu != "v100"
                           else "half")
    return Slot(model, f"{model}.tp1.{gpu}-36", count, 2.0, cost, layout)


def ticking_clock(now: float = START) -> VirtualClock:
    """A clock that moves a millisecond per reading (the act step reads it after the planning
    step, as the real clock would), and by whole seconds when told (``advance``)."""
    return VirtualClock(now, tick_s=0.001)


class ScriptedPlanner:
    """Per model, the first slot whose template and shape are not excluded; raises when told."""

    def __init__(self, *slots: Slot):
        self.slots = list(slots)
        self.requests: list[PlanRequest] = []
        self.error: Exception | None = None

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        chosen: dict[str, Slot] = {}
        for s in self.slots:
            if s.model in chosen or s.template_id in request.excluded_templates:
                continue
            if (s.template_id, s.partitions) in request.excluded_shapes:
                continue
            chosen[s.model] = s
        desired = DesiredPlan(0.0, tuple(chosen.values()))
        return PlanOutcome(desired, sum(s.cost_per_hour * s.count for s in desired.slots), 0.0,
                           "optimal")


class Loop:
    """One deployment's daemon wired to the fake Slurm, a real store and the fake clock."""

    def __init__(self, tmp_path, planner, slurm=None, clock=None, db="daemon.db"):
        self.tmp = tmp_path
        self.deployment = load_deployment(EXAMPLE).model_copy(
            update={"state_dir": tmp_path / "shared"})
        self.clock = clock or ticking_clock()
        self.slurm = slurm or FakeSlurm(recorded_snapshot(), self.clock)
        self.store = open_store(tmp_path / db)
        self.planner = planner
        self.healthy: set[str] = set()  # endpoint URLs that answer /health
        settings = ReconcileSettings.from_policy(self.deployment.policy)
        self.settings = settings
        observer = Observer(self.deployment, self.store, self.slurm, settings, self.clock,
                            probe=lambda url: url in self.healthy)
        self.actor = Actor(self.deployment, self.store, self.slurm, settings, self.clock, None,
                           submit=self.slurm.submit_spec)
        self.daemon = Daemon(self.deployment, self.store, self.slurm, planner,
                             api_key_file=None, table_path=tmp_path / "routes.json",
                             clock=self.clock, observer=observer, actor=self.actor)

    def cycle(self, after_s: float = 0.0) -> bool:
        self.clock.advance(after_s)
        return self.daemon.reconcile_once()

    def live(self):
        return self.store.replicas(live_only=True)

    def serve(self, replica_id: str, node: str = "a100-01") -> str:
        """The scheduler starts the replica's job and its engine publishes its endpoint."""
        record = self.store.replica(replica_id)
        assert record is not None and record.job_id is not None
        self.slurm.start(record.job_id, [node])
        url = f"http://{node}:{8000 + len(self.healthy)}"
        now = self.clock.now
        write_endpoint(self.deployment.state_path / "endpoints" / f"{replica_id}.json",
                       Endpoint(replica_id, record.job_id, url, node, 8000, record.model, 1,
                                now, now, node))
        self.healthy.add(url)
        return url

    def close(self):
        self.daemon.observer.close()
        self.store.close()


@pytest.fixture
def make(tmp_path):
    loops = []

    def build(*args, **kw):
        loop = Loop(tmp_path, *args, **kw)
        loops.append(loop)
        return loop

    yield build
    for loop in loops:
        loop.close()


def events(loop, kind):
    return [e.message for e in loop.store.events(limit=200, kind=kind)]


# --------------------------------------------------------------------------- the happy path


@pytest.mark.parametrize("recording", ["devcluster", "slurm-22.05"])
def test_a_planned_replica_is_submitted_once_then_routed_when_ready(make, recording):
    clock = ticking_clock()
    base = recorded_snapshot() if recording == "devcluster" else recorded_22_05_snapshot()
    loop = make(ScriptedPlanner(slot()), slurm=FakeSlurm(base, clock), clock=clock)
    loop.cycle()
    (record,) = loop.live()
    assert (record.template_id, record.layout) == (slot().template_id, slot().layout)
    assert record.job_id in loop.slurm.queue and loop.slurm.submitted[0].replica_id == record.id
    assert loop.slurm.submitted[0].layout == slot().layout  # the plan row's layout, unchanged
    loop.cycle(2)  # pending: nothing more to do
    assert len(loop.slurm.submitted) == 1
    url = loop.serve(record.id)
    loop.cycle(2)
    assert loop.store.replica(record.id).ready_at is not None
    routes = read_routing_table(loop.tmp / "routes.json").models
    assert [r.url for r in routes["qwen3-8b"]] == [url]
    assert len(loop.slurm.submitted) == 1 and not loop.slurm.cancelled


def test_a_ready_replica_is_routed_before_the_same_cycle_plans_and_acts(make):
    # planning (a HiGHS solve) and acting (sbatch) take seconds; a replica `status` already
    # calls READY must not wait for them to get traffic (CI saw a 503 in that window)
    seen: list[dict | None] = []

    class Watching(ScriptedPlanner):
        def __call__(self, request: PlanRequest) -> PlanOutcome:
            path = loop.tmp / "routes.json"
            seen.append(read_routing_table(path).models if path.exists() else None)
            return super().__call__(request)

    loop = make(Watching(slot()))
    loop.cycle()
    (record,) = loop.live()
    url = loop.serve(record.id)
    loop.cycle(loop.deployment.policy.replan_interval_s + 1)  # READY now, and a plan is due
    assert len(seen) == 2, "the second cycle did not re-plan"
    assert [r.url for r in seen[1]["qwen3-8b"]] == [url]


# --------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("database", ["kept", "lost"])
def test_a_restarted_daemon_adopts_its_running_job_and_submits_no_duplicate(make, database):
    first = make(ScriptedPlanner(slot()))
    first.cycle()
    (record,) = first.live()
    url = first.serve(record.id)
    first.cycle(2)
    first.close()

    db = "daemon.db" if database == "kept" else "new.db"
    again = make(ScriptedPlanner(slot()), slurm=first.slurm, clock=first.clock, db=db)
    again.healthy = first.healthy
    again.cycle(5)
    (adopted,) = again.live()
    assert (adopted.id, adopted.job_id) == (record.id, record.job_id)
    # a lost database is rebuilt from the job's tag and its spec.json: the same typed layout
    assert adopted.layout == slot().layout and adopted.partitions == ("a100",)
    assert len(again.slurm.submitted) == 1 and not again.slurm.cancelled
    again.cycle(2)
    assert [r.url for r in read_routing_table(again.tmp / "routes.json").models["qwen3-8b"]] == [
        url]
    if database == "lost":
        assert any("adopted running job" in m for m in events(again, "adopt"))


def test_a_job_submitted_just_before_a_timeout_is_adopted_not_resubmitted(make):
    """sbatch timed out (TransientError) but the job was queued: the tag finds it."""
    loop = make(ScriptedPlanner(slot()))

    def queue_then_time_out(spec, client=None):
        loop.slurm.submit_spec(spec)
        raise SlurmTimeout("sbatch timed out after 30s")

    loop.actor.submit = queue_then_time_out
    loop.cycle()
    (record,) = loop.live()
    assert record.job_id is None  # recorded before sbatch, no job id came back
    loop.cycle(3)
    (record,) = loop.live()
    assert record.job_id == next(iter(loop.slurm.queue))
    assert len(loop.slurm.submitted) == 1
    assert any("found for replica" in m for m in events(loop, "adopt"))


def test_a_submission_that_never_reached_slurm_is_forgotten_then_retried(make):
    loop = make(ScriptedPlanner(slot()))
    loop.slurm.fail_next("submit", SlurmUnavailable("slurmctld not responding"))
    loop.cycle()
    (lost,) = loop.live()
    assert lost.job_id is None and not loop.slurm.queue
    assert events(loop, "slurm_error")
    loop.cycle(loop.settings.submit_lost_s + 1)  # forgotten, and a new one submitted
    assert loop.store.replica(lost.id).end_state == "LOST"
    (retry,) = loop.live()
    assert retry.id != lost.id and retry.job_id in loop.slurm.queue


# --------------------------------------------------------------------------- stale observations


def test_a_failed_observation_submits_drains_and_cancels_nothing(make):
    planner = ScriptedPlanner(slot())
    loop = make(planner)
    loop.cycle()
    (record,) = loop.live()
    loop.serve(record.id)
    loop.cycle(2)
    planner.slots = [slot("v100")]  # a new plan would move the replica
    loop.slurm.fail_next("snapshot", SlurmUnavailable("slurmctld not responding"))
    asked = len(planner.requests)
    loop.cycle(loop.deployment.policy.replan_interval_s)
    assert len(planner.requests) == asked  # no plan made on no observation
    assert loop.daemon.last_observed.error and loop.daemon.last_decision.held_back
    assert len(loop.slurm.submitted) == 1 and not loop.slurm.cancelled
    assert loop.store.replica(record.id).drain_requested_at is None


def test_a_stale_observation_submits_drains_and_cancels_nothing(make):
    planner = ScriptedPlanner(slot())
    loop = make(planner)
    loop.cycle()
    (record,) = loop.live()
    loop.serve(record.id)
    loop.cycle(2)
    # a new plan that moves the replica at once: half the cost (hysteresis keeps a READY
    # replica in place for a move that saves less than settings.replace_margin)
    planner.slots = [slot("v100", cost=0.5)]
    loop.slurm.lag_s = loop.settings.stale_after_s + 1  # the answer describes the past
    loop.cycle(loop.deployment.policy.replan_interval_s)
    assert "not observed recently" in loop.daemon.last_decision.held_back
    assert len(loop.slurm.submitted) == 1 and not loop.slurm.cancelled
    assert loop.store.replica(record.id).drain_requested_at is None
    loop.slurm.lag_s = 0.0  # fresh again: the new plan is carried out, make-before-break
    loop.cycle(2)
    assert loop.slurm.submitted[-1].layout == slot("v100").layout
    assert loop.store.replica(record.id).drain_requested_at is None  # successor not READY yet


def test_a_job_that_left_the_queue_with_sacct_failing_is_not_ended_or_replaced(make):
    loop = make(ScriptedPlanner(slot()))
    loop.cycle()
    (record,) = loop.live()
    loop.serve(record.id)
    loop.cycle(2)
    loop.slurm.queue.pop(record.job_id)  # squeue no longer holds it...
    loop.slurm.fail_next("job_states", SlurmUnavailable("sacct: slurmdbd not responding"))
    loop.cycle(2)  # ...and sacct cannot say how it ended: the observation is partial
    assert not loop.daemon.last_observed.observation.complete
    assert loop.store.replica(record.id).ended_at is None
    assert len(loop.slurm.submitted) == 1 and not loop.slurm.cancelled
    loop.slurm.finished[record.job_id] = "NODE_FAIL"  # sacct answers next time
    loop.cycle(2)
    assert loop.store.replica(record.id).end_state == "NODE_FAIL"
    assert len(loop.slurm.submitted) == 2  # now replaced


# --------------------------------------------------------------------------- partial failures


def test_a_refused_shape_is_excluded_and_the_next_plan_goes_elsewhere(make):
    planner = ScriptedPlanner(slot("a100"), slot("v100"))
    loop = make(planner)
    loop.slurm.fail_next("submit", SlurmRejected("Invalid generic resource (gres) specification"))
    assert loop.cycle() is True  # an exclusion asks for a new plan at once
    (refused,) = loop.store.replicas(live_only=False)
    assert refused.end_state == "SUBMIT_FAILED"
    (exclusion,) = loop.store.exclusions(loop.clock.now)
    assert (exclusion.target, exclusion.kind) == (
        ShapeExclusion(slot("a100").template_id, ("a100",)), ExclusionKind.SUBMIT_REFUSED)
    loop.cycle()
    assert planner.requests[-1].excluded_shapes == {(slot("a100").template_id, ("a100",))}
    (moved,) = loop.live()
    assert moved.partitions == ("v100",) and moved.layout.dtype == "half"
    assert loop.slurm.submitted[-1].layout == slot("v100").layout


def test_a_crash_cooldown_reaches_the_planner_as_an_excluded_template(make):
    planner = ScriptedPlanner(slot("a100"), slot("v100"))
    loop = make(planner)
    for _ in range(loop.settings.crash_limit):
        loop.cycle(2)
        (record,) = loop.live()
        loop.serve(record.id)  # READY, then it crashes: not a failed start
        loop.cycle(2)
        loop.slurm.end(record.job_id, "FAILED")
        loop.cycle(2)
    (exclusion,) = loop.store.exclusions(loop.clock.now)
    assert exclusion.target == TemplateExclusion(slot("a100").template_id)
    assert exclusion.kind is ExclusionKind.CRASH_COOLDOWN
    loop.cycle(2)
    assert slot("a100").template_id in planner.requests[-1].excluded_templates
    assert loop.live()[-1].partitions == ("v100",)


KV_REFUSAL = (REPO / "tests/data/vllm/engine-kv-refusal-0.32.0-cpu.log").read_text()


def test_a_layout_that_fails_at_start_backs_off_naming_why(make):
    """issue 27: a layout whose KV cache could not hold max_model_len crashed at start and was
    resubmitted in a loop. Now its reason is read from the job's engine log, the template is
    kept out of plans at once, and again, twice as long, when it fails after that."""
    planner = ScriptedPlanner(slot("a100"), slot("v100"))
    loop = make(planner)
    loop.cycle(2)
    (record,) = loop.live()
    loop.slurm.start(record.job_id, ["a100-01"])
    loop.cycle(2)
    logs = loop.deployment.state_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{record.id}.{record.job_id}.rank0.engine.log").write_text(KV_REFUSAL)
    loop.slurm.end(record.job_id, "FAILED")
    loop.cycle(2)
    loop.cycle(2)
    # not resubmitted where it failed: the next plan goes elsewhere
    assert [r.partitions for r in loop.live()] == [("v100",)]
    failed = loop.store.replica(record.id)
    assert failed is not None and "1.14 GiB KV cache is needed" in (failed.failure or "")
    (exclusion,) = loop.store.exclusions(loop.clock.now)
    assert exclusion.target == TemplateExclusion(slot("a100").template_id)
    assert exclusion.kind is ExclusionKind.START_FAILED
    assert exclusion.until - exclusion.since == pytest.approx(loop.settings.start_backoff_s,
                                                              abs=0.1)
    assert "1.14 GiB KV cache is needed" in exclusion.reason
    assert any("1.14 GiB KV cache" in m for m in events(loop, "failed"))
    # the other layout fails at start too; once a100's back-off is over it is tried again,
    # and failing again it waits twice as long
    moved = loop.live()[0]
    loop.slurm.start(moved.job_id, ["v100-01"])
    loop.cycle(2)
    loop.slurm.end(moved.job_id, "FAILED")
    loop.cycle(2)
    assert loop.live() == []
    loop.cycle(loop.settings.start_backoff_s - 6)
    loop.cycle(2)
    retry = [r for r in loop.live() if r.partitions == ("a100",)]
    assert len(retry) == 1
    loop.slurm.start(retry[0].job_id, ["a100-01"])
    loop.cycle(2)
    loop.slurm.end(retry[0].job_id, "FAILED")
    loop.cycle(2)
    (again,) = [e for e in loop.store.exclusions(loop.clock.now)
                if e.target == TemplateExclusion(slot("a100").template_id)]
    assert again.until - again.since == pytest.approx(2 * loop.settings.start_backoff_s,
                                                      abs=0.1)


def test_a_cancel_slurm_did_not_carry_out_is_sent_again(make):
    planner = ScriptedPlanner(slot(count=2))
    loop = make(planner)
    loop.cycle()
    first, second = loop.live()
    loop.serve(first.id)
    loop.serve(second.id, node="a100-02")
    loop.cycle(2)
    # scale to one: drain one (the other stays READY: never the last one), cancel after the grace
    planner.slots = [slot(count=1)]
    loop.cycle(loop.deployment.policy.replan_interval_s)
    (record,) = [r for r in loop.live() if r.drain_requested_at is not None]
    loop.slurm.fail_next("cancel", SlurmUnavailable("scancel: slurmctld not responding"))
    loop.cycle(loop.settings.drain_grace_s + 1)
    assert loop.store.replica(record.id).cancelled_at is None  # not recorded as cancelled
    assert not loop.slurm.cancelled
    loop.cycle(loop.settings.poll_interval_s + 1)  # after the backoff: sent again
    # grace: the drain signal first
    assert loop.slurm.cancelled == [(record.job_id, DRAIN_SIGNAL, False)]
    assert loop.store.replica(record.id).cancelled_at is not None


# --------------------------------------------------------------------------- the planning step


def test_a_failing_planner_keeps_the_plan_and_backs_off(make):
    planner = ScriptedPlanner(slot())
    loop = make(planner)
    loop.cycle()
    plan = loop.daemon.plan
    # after the first plan, even an infeasible one (the cluster shrank) keeps the current plan
    planner.error = InfeasiblePlan("Stage 2 found no plan (infeasible): min_replicas")
    loop.cycle(loop.deployment.policy.replan_interval_s)
    assert loop.daemon.plan is plan and events(loop, "plan_error")
    assert loop.daemon.fatal is None
    asked = len(planner.requests)
    loop.cycle(0.5)  # within the backoff: not asked again
    assert len(planner.requests) == asked
    planner.error = None
    loop.cycle(loop.settings.poll_interval_s * 2)
    assert len(planner.requests) == asked + 1 and loop.daemon.plan is not plan
    assert len(loop.slurm.submitted) == 1  # the same slot: nothing resubmitted


def test_an_infeasible_first_plan_stops_serve_naming_the_field_before_any_submission(make):
    """Issue 17: serve with an infeasible min_replicas exited 1 in the planner or retried for
    ever; now its first plan being infeasible is a ConfigError (serve exits 2 with its lines)
    and nothing is decided or submitted."""
    planner = ScriptedPlanner(slot())
    planner.error = InfeasiblePlan("Stage 2 found no plan (infeasible)")
    loop = make(planner)
    loop.deployment = loop.daemon.deployment = loop.deployment.model_copy(update={
        "models": [loop.deployment.models[0].model_copy(update={"min_replicas": 40}),
                   *loop.deployment.models[1:]]})
    stop = threading.Event()
    loop.daemon.loops(stop)
    loop.cycle()
    fatal = loop.daemon.fatal
    assert fatal is not None and stop.is_set()
    assert "models[0].min_replicas: 40 replica(s) of" in fatal.problems[0]
    assert fatal.problems[-1].endswith("nothing was submitted; serve stops")
    assert loop.slurm.submitted == [] and loop.daemon.last_decision is None


def test_the_planner_is_asked_with_what_goes_on_serving(make):
    planner = ScriptedPlanner(slot())
    loop = make(planner)
    loop.cycle()
    (record,) = loop.live()
    loop.cycle(loop.deployment.policy.replan_interval_s)
    request = planner.requests[-1]
    assert request.running == ((slot().template_id, ("a100",)),)  # pending: goes on serving
    assert request.startup_s == loop.deployment.policy.startup_time_s  # nothing learnt yet
    loop.serve(record.id)
    loop.cycle(2)
    (observed,) = loop.store.startups()  # submit → READY, towards the learnt start-up time
    assert observed.replica_id == record.id and observed.seconds == pytest.approx(
        loop.clock.now - record.submitted_at, abs=0.1)
    loop.cycle(loop.deployment.policy.replan_interval_s)
    assert planner.requests[-1].running == request.running  # READY now: still goes on serving


def test_walltime_successors_get_the_slowest_recent_start_up_and_a_short_limit_is_named(make):
    loop = make(ScriptedPlanner(slot()))
    limit = loop.deployment.cluster.time_limit_s
    for i, seconds in enumerate([0.10 * limit, 0.30 * limit, 0.12 * limit]):
        loop.store.add_startup(StartupObservation(float(i), f"r{i}", "t1", "a100", seconds))
    loop.cycle()
    assert loop.daemon.settings.startup_s == pytest.approx(0.30 * limit)  # not the median
    assert loop.actor.settings.startup_s == loop.daemon.settings.startup_s
    assert not events(loop, "warning")
    # a start-up beyond half the usable time: no lead can cover it, and serve says what fits
    loop.store.add_startup(StartupObservation(10.0, "r9", "t1", "a100", 0.6 * limit))
    loop.cycle(2)
    (warning,) = events(loop, "warning")
    assert "cluster.time_limit of at least" in warning
    assert str(loop.deployment.cluster.time_limit) in warning
