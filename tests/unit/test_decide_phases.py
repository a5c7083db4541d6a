"""Each rule of the decide step on its own: the phase functions decide() calls, fed statuses
built by hand so that one rule is exercised without the others (issue 25)."""

from __future__ import annotations

from dataclasses import replace

from coral_hpc.reconcile.actions import Cancel, Drain, Forget, Observation, Submit
from coral_hpc.reconcile.decide import (
    bounded,
    crash_cooldowns,
    drained_cancels,
    hold_destructive,
    hold_everything,
    lost_submissions,
    pending_too_long,
    replica_statuses,
)
from coral_hpc.reconcile.hysteresis import PlanHistory
from coral_hpc.reconcile.match import (
    fill_slot,
    in_flight,
    match_plan,
    standing_in,
    stands_in,
    take_predecessor,
)
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaState, ReplicaStatus
from coral_hpc.reconcile.surplus import (
    ReadyTally,
    ready_tally,
    settle_ready,
    settle_surplus,
    settle_unready,
    surplus_order,
)
from coral_hpc.types import ExclusionKind, ShapeExclusion, TemplateExclusion
from tests.unit.reconcile_facts import facts, plan, rec, slot

S = ReconcileSettings(
    poll_interval_s=2, pending_timeout_s=60, pending_exclusion_s=600, walltime_lead_s=300,
    crash_limit=3, crash_cooldown_s=1000, drain_grace_s=5, cancel_retry_s=60, submit_lost_s=20,
    unhealthy_grace_s=30, max_submits_per_cycle=2, max_cancels_per_cycle=2,
    replace_after_plans=3, replace_margin=0.1, max_queue_wait_s=300,
)
NOW = 100.0
READY, STARTING, PENDING = ReplicaState.READY, ReplicaState.STARTING, ReplicaState.PENDING


def st(rid: str, state: ReplicaState = READY, **conditions) -> ReplicaStatus:
    """A hand-made status, so a phase is tested without replica_status's own rules."""
    return ReplicaStatus(rid, state, **conditions)


def statuses(*pairs: ReplicaStatus) -> dict[str, ReplicaStatus]:
    return {s.replica_id: s for s in pairs}


# --------------------------------------------------------------------------- statuses


def test_a_pending_replica_slurm_starts_within_the_horizon_is_not_pending_too_long():
    soon = rec("a", "pending", submitted_at=0.0, expected_start=NOW + 100)
    late = rec("b", "pending", submitted_at=0.0, expected_start=NOW + 1000)
    out = replica_statuses(plan(slot("t1", 1)), facts(soon, late), NOW, S)
    assert not out["a"].pending_too_long
    assert out["b"].pending_too_long


def test_a_pending_replica_the_plan_queues_on_its_shape_is_not_pending_too_long():
    queued = replace(slot("t1", 1), queued=True)
    record = rec("a", "pending", submitted_at=0.0)
    assert not replica_statuses(plan(queued), facts(record), NOW, S)["a"].pending_too_long
    # without a plan nothing is worth waiting for
    assert replica_statuses(None, facts(record), NOW, S)["a"].pending_too_long


# --------------------------------------------------------------------------- rule 1


def _crashed(rid: str, ended_at: float, template: str = "t1"):
    return rec(rid, ready_at=None, ended_at=ended_at, end_state="FAILED", template=template)


def test_crash_cooldown_excludes_a_template_at_its_crash_limit_only():
    records = [_crashed("c1", 40.0), _crashed("c2", 60.0), _crashed("c3", 90.0),
               _crashed("x1", 90.0, template="t2")]
    fs = facts(*records)
    sts = statuses(*(st(r.id, ReplicaState.FAILED, crashed=True) for r in records))
    (exclude,) = crash_cooldowns(fs, sts, NOW, S, set())
    assert exclude.target == TemplateExclusion("t1")
    assert exclude.kind == ExclusionKind.CRASH_COOLDOWN
    assert exclude.until == NOW + S.crash_cooldown_s
    assert "crashed 3 times" in exclude.reason and "last: c3" in exclude.reason
    # already excluded: no second exclusion
    assert crash_cooldowns(fs, sts, NOW, S, {TemplateExclusion("t1")}) == []


def test_crash_cooldown_counts_only_crashes():
    records = [_crashed("c1", 40.0), _crashed("c2", 60.0), _crashed("n", 90.0)]
    sts = statuses(st("c1", ReplicaState.FAILED, crashed=True),
                   st("c2", ReplicaState.FAILED, crashed=True),
                   st("n", ReplicaState.FAILED))  # a node failure or preemption: not a crash
    assert crash_cooldowns(facts(*records), sts, NOW, S, set()) == []


# --------------------------------------------------------------------------- rule 2


def test_stale_jobs_hold_everything_even_with_a_plan():
    stale = Observation(jobs_at=NOW - 100, cluster_at=NOW)
    reason, why = hold_everything(plan(), stale, NOW, S)
    assert "own jobs not observed recently" in reason and why == ()
    assert hold_everything(plan(), Observation(NOW, NOW, complete=False), NOW, S) is not None


def test_no_plan_holds_everything_and_asks_for_one():
    assert hold_everything(None, Observation(NOW, NOW), NOW, S) == (
        "no plan yet: nothing submitted, drained or cancelled", ("no plan yet",))
    assert hold_everything(plan(), Observation(NOW, NOW), NOW, S) is None


def test_a_stale_cluster_snapshot_holds_only_destructive_actions():
    assert hold_destructive(Observation(NOW, NOW), NOW, S) is None
    held = hold_destructive(Observation(jobs_at=NOW, cluster_at=NOW - 100), NOW, S)
    assert held is not None and "nothing drained or cancelled" in held


def test_lost_submissions_are_forgotten_and_others_are_not():
    live = [rec("a", "submitting"), rec("b", "submitting")]
    sts = statuses(st("a", ReplicaState.SUBMITTING, submit_lost=True),
                   st("b", ReplicaState.SUBMITTING))
    assert lost_submissions(live, sts) == [Forget("a", "submission never reached Slurm")]


# --------------------------------------------------------------------------- rule 3


def test_pending_too_long_cancels_each_and_excludes_its_shape_once():
    live = [rec("a", "pending"), rec("b", "pending"), rec("c", "pending")]
    sts = statuses(st("a", PENDING, pending_too_long=True, pending_for_s=70.0),
                   st("b", PENDING, pending_too_long=True, pending_for_s=80.0),
                   st("c", PENDING, pending_for_s=10.0))
    out = pending_too_long(live, sts, NOW, S, set())
    assert [c.replica_id for c in out.cancels] == ["a", "b"]
    (exclude,) = out.excludes
    assert exclude.target == ShapeExclusion("t1", ("a100",))
    assert exclude.until == NOW + S.pending_exclusion_s and exclude.model == "m"
    assert "pending 70s (> 60s)" in exclude.reason
    # a shape already excluded is not excluded again, its replicas still cancelled
    again = pending_too_long(live, sts, NOW, S, {ShapeExclusion("t1", ("a100",))})
    assert again.excludes == () and len(again.cancels) == 2


# --------------------------------------------------------------------------- rule 4


def test_match_keeps_ready_first_then_submits_the_rest_as_successors():
    live = [rec("p", "pending"), rec("r"), rec("w")]
    sts = statuses(st("p", PENDING), st("r"), st("w", near_walltime=True))
    out = match_plan(plan(slot("t1", 3)), live, sts, S, set(), None)
    assert out.kept == {"p", "r"}
    assert [(s.reason, s.replaces) for s in out.submits] == [("successor of w", "w")]
    assert out.replan == ()


def test_match_submits_nothing_for_an_excluded_slot_and_says_why():
    out = match_plan(plan(slot("t1", 2)), [], {}, S, {TemplateExclusion("t1")}, None)
    assert out.submits == ()
    assert out.replan == ("plan wants 2 more of t1 on a100, which is excluded",)


def test_fill_slot_takes_own_then_ready_stand_in_then_work_in_flight():
    s = slot("t1", 3)
    sts = statuses(st("own"), st("stand"), st("fly", STARTING), st("spare", STARTING))
    standing = {("m", "both"): [rec("stand", template="t0")]}
    flight = {("m", "both"): [rec("fly", "starting", template="t9"),
                              rec("spare", "starting", template="t9")]}
    assert fill_slot(s, [rec("own")], sts, S, standing, flight) == ["own", "stand", "fly"]
    # consumed: a replica never fills two slots
    assert standing[("m", "both")] == [] and [r.id for r in flight[("m", "both")]] == ["spare"]


def test_a_full_slot_takes_no_stand_in_nor_work_in_flight():
    standing = {("m", "both"): [rec("stand", template="t0")]}
    flight = {("m", "both"): [rec("fly", "starting", template="t9")]}
    sts = statuses(st("own"), st("stand"), st("fly", STARTING))
    assert fill_slot(slot("t1", 1), [rec("own")], sts, S, standing, flight) == ["own"]
    assert len(standing[("m", "both")]) == 1 and len(flight[("m", "both")]) == 1


def test_fill_slot_prefers_ready_then_the_most_time_left():
    sts = statuses(st("s", STARTING), st("short", time_left_s=100.0),
                   st("long", time_left_s=1000.0))
    same = [rec("s", "starting"), rec("short"), rec("long")]
    assert fill_slot(slot("t1", 2), same, sts, S, {}, {}) == ["long", "short"]


def test_in_flight_holds_pending_and_starting_replicas_of_slots_the_plan_dropped():
    live = [rec("p", "pending", template="t9", created_at=5.0), rec("r", template="t9"),
            rec("s", "starting", template="t9", created_at=1.0), rec("kept", "pending")]
    sts = statuses(st("p", PENDING), st("r"), st("s", STARTING), st("kept", PENDING))
    pool = in_flight(live, sts, {("t1", ("a100",))})
    assert {k: [r.id for r in v] for k, v in pool.items()} == {("m", "both"): ["s", "p"]}


def test_standing_in_needs_a_history_and_a_slot_dropped_recently():
    live = [rec("r", template="t9")]
    sts = statuses(st("r"))
    keys = {("t1", ("a100",))}
    assert standing_in(live, sts, keys, S, None) == {}
    history = PlanHistory()
    history.observe(plan(slot("t9", 1)))
    history.observe(plan(slot("t1", 1)))
    assert [r.id for r in standing_in(live, sts, keys, S, history)[("m", "both")]] == ["r"]
    for _ in range(S.replace_after_plans):
        history.observe(plan(slot("t1", 1)))
    assert standing_in(live, sts, keys, S, history) == {}


def test_a_ready_replica_stands_in_unless_slower_or_dearer_by_the_margin():
    s = slot("t1", 1, throughput=2.0, cost=4.0)
    assert stands_in(rec("a", throughput=2.0, cost=4.0), s, S)
    assert not stands_in(rec("a", throughput=1.0, cost=1.0), s, S)  # cannot carry the load
    assert not stands_in(rec("a", throughput=2.0, cost=5.0), s, S)  # slot cheaper by > 10 %


def test_take_predecessor_prefers_the_same_slot_and_consumes_it():
    needed = {"m": ["x", "y"]}
    assert take_predecessor(needed, "m", [rec("y")]) == "y"
    assert take_predecessor(needed, "m", []) == "x"
    assert take_predecessor(needed, "m", []) is None
    assert take_predecessor({}, "other", []) is None


# --------------------------------------------------------------------------- rule 5


def test_settle_surplus_drains_ready_cancels_unready_and_keeps_the_last():
    live = [rec("keep"), rec("extra"), rec("pend", "pending"), rec("sub", "submitting")]
    sts = statuses(st("keep"), st("extra"), st("pend", PENDING),
                   st("sub", ReplicaState.SUBMITTING))
    out = settle_surplus(plan(slot("t1", 1)), live, sts, {"keep"}, set(), S, None)
    assert [d.replica_id for d in out.drains] == ["extra"]
    assert [c.replica_id for c in out.cancels] == ["pend"]
    assert out.kept_last == ()
    # nothing planned: the last READY replica is kept, saying why
    last = settle_surplus(plan(), [rec("a")], statuses(st("a")), set(), set(), S, None)
    assert last.drains == () and "the last READY replica of m" in last.kept_last[0]
    # ... unless its model is no longer configured
    gone = settle_surplus(plan(), [rec("a")], statuses(st("a")), set(), set(), S, frozenset())
    assert [d.replica_id for d in gone.drains] == ["a"]


def test_settle_surplus_does_not_cancel_twice():
    live = [rec("p", "pending")]
    out = settle_surplus(plan(), live, statuses(st("p", PENDING)), set(), {"p"}, S, None)
    assert out.cancels == ()


def test_ready_tally_counts_only_replicas_that_go_on_serving_as_successors():
    live = [rec("a", throughput=2.0), rec("w", throughput=3.0), rec("s", "starting")]
    tally = ready_tally(live, statuses(st("a"), st("w", near_walltime=True), st("s", STARTING)))
    assert tally.capacity[("m", "both")] == 5.0
    assert tally.count[("m", "both")] == 1 and tally.stable[("m", "both")] == 2.0


def test_surplus_order_puts_replicas_that_stop_anyway_first_then_the_dearest():
    live = [rec("cheap", cost=1.0), rec("dear", cost=9.0), rec("ending", cost=1.0),
            rec("kept"), rec("draining", drain_requested_at=0.0)]
    sts = statuses(st("cheap"), st("dear"), st("ending", must_move=True), st("kept"),
                   st("draining", ReplicaState.DRAINING))
    assert [r.id for r in surplus_order(live, sts, {"kept"})] == ["ending", "dear", "cheap"]


def _tally(count: int = 0, stable: float = 0.0, capacity: float = 0.0) -> ReadyTally:
    tally = ReadyTally()
    tally.count[("m", "both")], tally.stable[("m", "both")] = count, stable
    tally.capacity[("m", "both")] = capacity
    return tally


def test_settle_unready_keeps_an_unhealthy_replica_in_grace_only_with_no_ready_successor():
    record = rec("u", health_failures=3)
    unhealthy = st("u", ReplicaState.UNHEALTHY)
    kept = settle_unready(record, unhealthy, _tally(), {}, S, None)
    assert isinstance(kept, str) and "unhealthy for less than 30s" in kept
    assert isinstance(settle_unready(record, unhealthy, _tally(count=1), {}, S, None), Cancel)
    too_long = st("u", ReplicaState.UNHEALTHY, unhealthy_too_long=True)
    assert isinstance(settle_unready(record, too_long, _tally(), {}, S, None), Cancel)


def test_settle_unready_keeps_a_starting_replica_past_its_lead_while_capacity_is_short():
    record = rec("s", "starting")
    past_lead = st("s", STARTING, near_walltime=True, time_left_s=S.walltime_signal_s + 100)
    planned = {("m", "both"): 2.0}
    kept = settle_unready(record, past_lead, _tally(), planned, S, None)
    assert isinstance(kept, str) and "walltime successor fell due" in kept
    assert isinstance(settle_unready(record, past_lead, _tally(stable=2.0), planned, S, None),
                      Cancel)
    signalled = replace(past_lead, time_left_s=S.walltime_signal_s - 1)
    assert isinstance(settle_unready(record, signalled, _tally(), planned, S, None), Cancel)


def test_settle_ready_drains_only_while_the_rest_reaches_the_plan_and_updates_the_tally():
    tally = _tally(count=2, capacity=4.0)
    planned = {("m", "both"): 2.0}
    drain = settle_ready(rec("a"), st("a"), tally, planned, None)
    assert isinstance(drain, Drain) and "1 other READY replica(s) of m serving" in drain.reason
    assert tally.capacity[("m", "both")] == 2.0 and tally.count[("m", "both")] == 1
    # the next one would leave the model short of the plan: left alone
    assert settle_ready(rec("b"), st("b"), _tally(count=2, capacity=2.0), planned, None) is None


# --------------------------------------------------------------------------- rules 6 and 7


def test_drained_cancels_after_the_grace_and_resends_after_the_retry():
    live = [rec("early", drain_requested_at=97.0), rec("due", drain_requested_at=95.0),
            rec("sent", drain_requested_at=0.0, cancelled_at=50.0),
            rec("resend", drain_requested_at=0.0, cancelled_at=30.0), rec("ready")]
    sts = statuses(*(st(r.id, ReplicaState.DRAINING) for r in live[:4]), st("ready"))
    assert drained_cancels(live, sts, NOW, S) == [
        Cancel("due", "drained"),
        Cancel("resend", "cancel not yet carried out; sending again"),
    ]


def test_bounded_caps_calls_puts_replacements_first_and_withholds_destruction():
    s = slot("t1", 1)
    submits = [Submit(s, "scale up"), Submit(s, "scale up"), Submit(s, "successor of w", "w")]
    drains = [Drain("d", "surplus")]
    cancels = [Cancel("a", "x"), Cancel("b", "x"), Cancel("c", "x")]
    out = bounded(drains, cancels, submits, True, S)
    assert out == [drains[0], cancels[0], cancels[1], submits[2], submits[0]]
    assert bounded(drains, cancels, submits, False, S) == [submits[2], submits[0]]

