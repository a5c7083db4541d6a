"""decide(): pure, on tables of facts with a fake clock — no Slurm, no sleeps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coral_hpc.reconcile import (
    Cancel,
    Drain,
    Exclude,
    Forget,
    Keep,
    Observation,
    ReconcileSettings,
    Submit,
    decide,
)
from coral_hpc.store import Exclusion
from coral_hpc.types import ExclusionKind, ShapeExclusion, TemplateExclusion
from tests.support.virtual_time import VirtualClock
from tests.unit.reconcile_facts import facts, plan, rec, slot

S = ReconcileSettings(
    poll_interval_s=2, pending_timeout_s=60, pending_exclusion_s=600, walltime_lead_s=300,
    crash_limit=3, crash_cooldown_s=1000, drain_grace_s=5, cancel_retry_s=60, submit_lost_s=20,
    unhealthy_grace_s=30, max_submits_per_cycle=8, max_cancels_per_cycle=8,
)
NOW = 100.0


def run(desired, *records, now=NOW, unavailable=frozenset(), exclusions=(), observation=None,
        settings=S):
    return decide(desired, facts(*records, unavailable=unavailable), now, settings,
                  exclusions=exclusions, observation=observation)


def summary(decision):
    """Actions as short comparable tuples, Keep left out."""
    out = []
    for a in decision.actions:
        if isinstance(a, Submit):
            out.append(("submit", a.slot.template_id, a.replaces))
        elif isinstance(a, Drain):
            out.append(("drain", a.replica_id))
        elif isinstance(a, Cancel):
            out.append(("cancel", a.replica_id))
        elif isinstance(a, Forget):
            out.append(("forget", a.replica_id))
        elif isinstance(a, Exclude):
            out.append(("exclude", a.target))
    return sorted(out, key=repr)


# --------------------------------------------------------------------------- the table

CASES = [
    # (name, plan, records, unavailable, expected actions)
    ("empty cluster: submit the plan",
     plan(slot("t1", 2)), [], set(),
     [("submit", "t1", None), ("submit", "t1", None)]),
    ("plan met: nothing to do",
     plan(slot("t1", 2)), [rec("a"), rec("b")], set(), []),
    ("plan met by replicas still starting or pending: no duplicates",
     plan(slot("t1", 3)),
     [rec("a"), rec("b", "starting"), rec("c", "pending", submitted_at=90.0)], set(), []),
    ("a replica recorded but not yet in Slurm counts: no duplicate",
     plan(slot("t1", 1)), [rec("a", "submitting", created_at=95.0)], set(), []),
    ("scale down: drain READY surplus while the plan's capacity stays READY",
     plan(slot("t1", 1)), [rec("a"), rec("b"), rec("c")], set(),
     [("drain", "b"), ("drain", "c")]),
    ("scale down: surplus serving nothing is cancelled at once",
     plan(slot("t1", 1)),
     [rec("a"), rec("b", "pending", submitted_at=90.0), rec("c", "starting")], set(),
     [("cancel", "b"), ("cancel", "c")]),
    ("scale to zero: drain all but the last READY (issue 16: never the last one)",
     plan(), [rec("a"), rec("b")], set(), [("drain", "a")]),
    ("move to another template: the old one keeps serving until the new one is READY",
     plan(slot("t2", 1, partitions=("v100",))), [rec("a")], set(), [("submit", "t2", None)]),
    ("move: new one starting, old still serving",
     plan(slot("t2", 1, partitions=("v100",))),
     [rec("a"), rec("n", "starting", template="t2", partitions=("v100",))], set(), []),
    ("move: new one READY, old one drains",
     plan(slot("t2", 1, partitions=("v100",))),
     [rec("a"), rec("n", template="t2", partitions=("v100",))], set(), [("drain", "a")]),
    ("move to a template with less throughput each: old drains only when capacity is met",
     plan(slot("t2", 2, partitions=("v100",), throughput=1.0)),
     [rec("a"), rec("n", template="t2", partitions=("v100",), throughput=1.0),
      rec("o", "starting", template="t2", partitions=("v100",), throughput=1.0)], set(), []),
    ("walltime near: successor submitted ahead, old keeps serving",
     plan(slot("t1", 1)), [rec("a", started_at=-500.0, time_limit_s=800.0)], set(),
     [("submit", "t1", "a")]),
    ("walltime near, successor READY: old one drains",
     plan(slot("t1", 1)),
     [rec("a", started_at=-500.0, time_limit_s=800.0), rec("b", started_at=60.0)], set(),
     [("drain", "a")]),
    # seen on the real engine: beside other engines loading, a successor's start-up outran its
    # own walltime lead; cancelling it then left the model with no replica at all
    ("walltime due while still starting, nothing else serving: kept, successor submitted",
     plan(slot("t1", 1)), [rec("a", "starting", started_at=-500.0, time_limit_s=800.0)], set(),
     [("submit", "t1", "a")]),
    ("walltime due while still starting, a successor READY: cancelled",
     plan(slot("t1", 1)),
     [rec("a", "starting", started_at=-500.0, time_limit_s=800.0), rec("b", started_at=60.0)],
     set(), [("cancel", "a")]),
    ("still starting past its walltime warning: it can no longer serve, cancelled",
     plan(slot("t1", 1)), [rec("a", "starting", started_at=-650.0, time_limit_s=800.0)], set(),
     [("cancel", "a"), ("submit", "t1", "a")]),
    ("node draining: successor submitted, old keeps serving",
     plan(slot("t1", 1)), [rec("a")], {"a"}, [("submit", "t1", "a")]),
    ("node draining, successor READY: old one drains",
     plan(slot("t1", 1)), [rec("a"), rec("b")], {"a"}, [("drain", "a")]),
    ("node draining under a replica still starting: cancel and replace",
     plan(slot("t1", 1)), [rec("a", "starting")], {"a"}, [("cancel", "a"), ("submit", "t1", "a")]),
    ("replica failed (scancel): resubmitted",
     plan(slot("t1", 2)),
     [rec("a"), rec("b", ended_at=90.0, end_state="CANCELLED")], set(), [("submit", "t1", None)]),
    ("unhealthy within grace: kept, no successor yet",
     plan(slot("t1", 1)), [rec("a", health_failures=3, health_ok_at=80.0)], set(), []),
    # seen on the real engine: near walltime, its successor still starting, the host loaded so
    # /health answers late: cancelling it left the model with no replica at all
    ("unhealthy within grace near walltime, successor starting: kept, its model's last server",
     plan(slot("t1", 1)),
     [rec("a", started_at=-500.0, time_limit_s=800.0, health_failures=3, health_ok_at=80.0),
      rec("b", "starting", started_at=60.0)], set(), []),
    ("unhealthy near walltime, successor READY: cancelled",
     plan(slot("t1", 1)),
     [rec("a", started_at=-500.0, time_limit_s=800.0, health_failures=3, health_ok_at=80.0),
      rec("b", started_at=60.0)], set(), [("cancel", "a")]),
    ("unhealthy too long: cancelled and replaced",
     plan(slot("t1", 1)), [rec("a", health_failures=3, health_ok_at=60.0)], set(),
     [("cancel", "a"), ("submit", "t1", "a")]),
    ("draining before its grace: wait",
     plan(), [rec("a", drain_requested_at=97.0)], set(), []),
    ("draining past its grace: cancel",
     plan(), [rec("a", drain_requested_at=95.0)], set(), [("cancel", "a")]),
    ("cancel sent recently, job still there: wait",
     plan(), [rec("a", drain_requested_at=10.0, cancelled_at=50.0)], set(), []),
    ("cancel sent long ago, job still there: send again",
     plan(), [rec("a", drain_requested_at=10.0, cancelled_at=30.0)], set(), [("cancel", "a")]),
    ("lost submission: forgotten and submitted anew",
     plan(slot("t1", 1)), [rec("a", "submitting", created_at=50.0)], set(),
     [("forget", "a"), ("submit", "t1", None)]),
    ("two models are independent",
     plan(slot("t1", 1), slot("u1", 1, model="n")), [rec("a"), rec("x", model="n", template="u0")],
     set(), [("submit", "u1", None)]),
]


@pytest.mark.parametrize(("name", "desired", "records", "unavailable", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_decide_table(name, desired, records, unavailable, expected):
    decision = run(desired, *records, unavailable=frozenset(unavailable))
    assert summary(decision) == sorted(expected, key=repr)


# --------------------------------------------------------------------------- rules in detail


def test_kept_replicas_are_reported():
    decision = run(plan(slot("t1", 1)), rec("a"), rec("b"))
    assert [a.replica_id for a in decision.of(Keep)] == ["a"]


def test_scale_down_drains_the_dearest_per_request_first():
    desired = plan(slot("t1", 1), slot("t2", 1, partitions=("v100",)))
    records = [rec("a"), rec("a2"), rec("b", template="t2", partitions=("v100",)),
               rec("b2", template="t2", partitions=("v100",), cost=9.0)]
    decision = run(desired, *records)
    assert sorted(d.replica_id for d in decision.of(Drain)) == ["a2", "b2"]
    # b2 is dear: the plan keeps the cheaper b of the same slot
    assert "b" in {k.replica_id for k in decision.of(Keep)}


def test_keep_prefers_ready_then_most_time_left():
    desired = plan(slot("t1", 1))
    records = [rec("old", started_at=0.0, time_limit_s=3600.0),
               rec("young", started_at=50.0, time_limit_s=3600.0), rec("s", "starting")]
    decision = run(desired, *records)
    assert [k.replica_id for k in decision.of(Keep)] == ["young"]


def test_pending_past_timeout_is_cancelled_its_shape_excluded_and_not_resubmitted():
    decision = run(plan(slot("t1", 1)), rec("a", "pending", submitted_at=30.0))
    assert summary(decision) == [("cancel", "a"), ("exclude", ShapeExclusion("t1", ("a100",)))]
    (exclude,) = decision.of(Exclude)
    assert exclude.until == NOW + S.pending_exclusion_s
    assert exclude.kind == "pending_timeout"
    assert any("pending" in r for r in decision.replan)
    assert any("excluded" in r for r in decision.replan)


def test_a_shape_already_excluded_is_not_submitted_and_asks_for_a_replan():
    exclusion = Exclusion(ShapeExclusion("t1", ("a100",)), ExclusionKind.PENDING_TIMEOUT,
                          50.0, 500.0, "pending")
    decision = run(plan(slot("t1", 1)), exclusions=[exclusion])
    assert decision.of(Submit) == []
    assert decision.replan


def test_an_expired_exclusion_no_longer_blocks():
    exclusion = Exclusion(ShapeExclusion("t1", ("a100",)), ExclusionKind.PENDING_TIMEOUT,
                          0.0, 90.0, "pending")
    decision = run(plan(slot("t1", 1)), exclusions=[exclusion])
    assert len(decision.of(Submit)) == 1


def _crashed(rid, ended_at, template="t1"):
    """A replica that served (READY at 20) and then crashed: the crash_limit rule's case (one
    that failed before READY backs off at once, test_reconcile_start_backoff.py)."""
    return rec(rid, ended_at=ended_at, end_state="FAILED", template=template)


def test_a_template_that_keeps_crashing_cools_down_with_a_clear_event():
    decision = run(plan(slot("t1", 1)), _crashed("c1", 40.0), _crashed("c2", 60.0),
                   _crashed("c3", 90.0))
    (exclude,) = decision.of(Exclude)
    assert exclude.target == TemplateExclusion("t1")
    assert exclude.kind == "crash_cooldown"
    assert exclude.until == NOW + S.crash_cooldown_s
    assert "crashed 3 times" in exclude.reason and "c3" in exclude.reason
    assert decision.of(Submit) == []
    assert exclude.reason in decision.replan


def test_fewer_crashes_than_the_limit_resubmit():
    decision = run(plan(slot("t1", 1)), _crashed("c1", 60.0), _crashed("c2", 90.0))
    assert decision.of(Exclude) == []
    assert len(decision.of(Submit)) == 1


def test_old_crashes_and_other_failures_do_not_count():
    records = [_crashed("c1", -1000.0), _crashed("c2", 60.0), _crashed("c3", 90.0),
               rec("n", ended_at=95.0, end_state="NODE_FAIL")]
    decision = run(plan(slot("t1", 1)), *records)
    assert decision.of(Exclude) == []


def test_crashes_are_counted_per_template():
    records = [_crashed("c1", 60.0), _crashed("c2", 90.0), _crashed("x", 95.0, template="t2")]
    assert run(plan(slot("t1", 1)), *records).of(Exclude) == []


def test_a_template_already_cooling_down_is_not_excluded_again():
    exclusion = Exclusion(TemplateExclusion("t1"), ExclusionKind.CRASH_COOLDOWN, 95.0, 1095.0,
                          "crashed")
    records = [_crashed("c1", 40.0), _crashed("c2", 60.0), _crashed("c3", 90.0)]
    decision = run(plan(slot("t1", 1)), *records, exclusions=[exclusion])
    assert decision.of(Exclude) == [] and decision.of(Submit) == []


def test_stale_job_observation_does_nothing_at_all():
    stale = Observation(jobs_at=NOW - 3 * S.poll_interval_s - 1, cluster_at=NOW)
    decision = run(plan(slot("t1", 1)), rec("a", ended_at=90.0, end_state="FAILED"), rec("b"),
                   rec("c"), observation=stale)
    assert summary(decision) == []
    assert "no submission, drain or cancel" in decision.held_back


def test_a_failed_or_partial_slurm_call_does_nothing_at_all():
    partial = Observation(jobs_at=NOW, cluster_at=NOW, complete=False)
    decision = run(plan(), rec("a"), observation=partial)
    assert summary(decision) == []
    assert decision.held_back


def test_stale_cluster_snapshot_submits_but_destroys_nothing():
    stale = Observation(jobs_at=NOW, cluster_at=NOW - 60)
    decision = run(plan(slot("t2", 1)), rec("a"), rec("b", drain_requested_at=0.0),
                   observation=stale)
    assert summary(decision) == [("submit", "t2", None)]
    assert "nothing drained or cancelled" in decision.held_back


def test_crash_cooldown_is_recorded_even_on_stale_observations():
    stale = Observation(jobs_at=None, cluster_at=None)
    records = [_crashed("c1", 40.0), _crashed("c2", 60.0), _crashed("c3", 90.0)]
    decision = run(plan(slot("t1", 1)), *records, observation=stale)
    assert [a.target for a in decision.of(Exclude)] == [TemplateExclusion("t1")]
    assert decision.of(Submit) == []


def test_no_plan_yet_touches_nothing():
    decision = run(None, rec("a"), rec("b", "pending"))
    assert summary(decision) == []
    assert "no plan yet" in decision.replan


def test_submissions_and_cancellations_are_bounded_per_cycle_replacements_first():
    settings = replace(S, max_submits_per_cycle=3, max_cancels_per_cycle=2)
    records = [rec("w", started_at=-500.0, time_limit_s=800.0)]
    # pending replicas of a model the plan dropped: surplus to cancel (a model the plan still
    # serves would keep them in flight for its missing slots: see test_reliability_drains)
    records += [rec(f"p{i}", "pending", model="gone", template="old", submitted_at=90.0)
                for i in range(5)]
    decision = run(plan(slot("t1", 10)), *records, settings=settings)
    submits = decision.of(Submit)
    assert len(submits) == 3
    assert submits[0].replaces == "w"
    assert len(decision.of(Cancel)) == 2


# --------------------------------------------------------------------------- a whole rotation


class World:
    """A tiny fake cluster on a :class:`VirtualClock`: jobs pend one tick, start, become READY
    after ``startup`` seconds, end at walltime or a tick after a cancel. Applies decide()'s
    actions."""

    def __init__(self, time_limit_s: float, startup_s: float):
        self.clock = VirtualClock(0.0)
        self.time_limit_s = time_limit_s
        self.startup_s = startup_s
        self.records = {}
        self.serial = 0
        self.unavailable = set()

    @property
    def now(self) -> float:
        return self.clock.now

    def tick(self, dt: float) -> None:
        self.clock.advance(dt)
        for rid, r in list(self.records.items()):
            if r.ended_at is not None:
                continue
            if r.cancelled_at is not None and self.now - r.cancelled_at >= 1.0:
                r = replace(r, ended_at=self.now, end_state="CANCELLED", slurm_state="CANCELLED")
            elif r.slurm_state == "PENDING":
                r = replace(r, slurm_state="RUNNING", started_at=self.now)
            elif r.started_at is not None and self.now >= r.started_at + r.time_limit_s:
                r = replace(r, ended_at=self.now, end_state="TIMEOUT", slurm_state="TIMEOUT")
            elif r.ready_at is None and self.now - r.started_at >= self.startup_s:
                r = replace(r, ready_at=self.now, health_ok_at=self.now)
            self.records[rid] = r

    def apply(self, decision) -> None:
        for action in decision.actions:
            if isinstance(action, Submit):
                self.serial += 1
                rid = f"r{self.serial}"
                self.records[rid] = rec(
                    rid, "pending", template=action.slot.template_id,
                    partitions=action.slot.partitions, created_at=self.now,
                    submitted_at=self.now, time_limit_s=self.time_limit_s,
                )
            elif isinstance(action, Drain):
                self.records[action.replica_id] = replace(
                    self.records[action.replica_id], drain_requested_at=self.now)
            elif isinstance(action, Cancel):
                self.records[action.replica_id] = replace(
                    self.records[action.replica_id], cancelled_at=self.now)

    def ready(self) -> int:
        decision = decide(None, facts(*self.records.values()), self.now, S)
        return sum(1 for s in decision.statuses.values() if s.state.value == "READY")

    def step(self, desired) -> None:
        self.apply(decide(desired, facts(*self.records.values(),
                                         unavailable=frozenset(self.unavailable)), self.now, S))


def test_rotation_before_walltime_never_leaves_a_gap_in_ready_replicas():
    world = World(time_limit_s=400.0, startup_s=20.0)
    desired = plan(slot("t1", 2))
    readiness = []
    for _ in range(600):  # 1200 s of fake time: three generations of replicas
        world.step(desired)
        world.tick(2.0)
        readiness.append(world.ready())
    first_full = readiness.index(2)
    assert min(readiness[first_full:]) >= 2
    ended = [r for r in world.records.values() if r.ended_at is not None]
    assert ended and all(r.end_state == "CANCELLED" for r in ended)  # none reached TIMEOUT
    assert max(readiness) <= 4  # successors overlap, but never more than one each


def test_a_start_up_longer_than_the_lead_still_serves_between_rotations():
    # the lead is capped at half the usable time (155 s of 310 s: a 460 s limit less Slurm's
    # 150 s earliest warning): each replica's successor falls due before it is READY itself.
    # Cancelling a replica still starting at that point (the old rule) meant no replica of the
    # model was ever READY.
    world = World(time_limit_s=460.0, startup_s=170.0)
    desired = plan(slot("t1", 1))
    readiness, live = [], []
    for _ in range(600):  # 1200 s of fake time
        world.step(desired)
        world.tick(2.0)
        readiness.append(world.ready())
        live.append(sum(1 for r in world.records.values() if r.ended_at is None))
    first = readiness.index(1)
    assert first * 2.0 <= 200 and min(readiness[first:]) >= 1
    # successors overlap, bounded: one new replica per 155 s lead, each living 400 s
    assert max(live) <= 3


def test_node_drain_moves_replicas_without_a_gap():
    world = World(time_limit_s=1e6, startup_s=20.0)
    desired = plan(slot("t1", 2))
    for _ in range(30):
        world.step(desired)
        world.tick(2.0)
    assert world.ready() == 2
    world.unavailable = {r for r, rr in world.records.items() if rr.ended_at is None}
    before = set(world.unavailable)
    readiness = []
    for _ in range(60):
        world.step(desired)
        world.tick(2.0)
        readiness.append(world.ready())
    assert min(readiness) >= 2
    assert all(world.records[r].ended_at is not None for r in before)
    live = [r for r in world.records.values() if r.ended_at is None]
    assert len(live) == 2 and not {r.id for r in live} & before
