"""Issue 16, Why-4: a model's last READY replica is never drained while no successor is READY.

Before: a re-plan that dropped a model (too few free GPUs: a maintenance drain of every node, one
node drained, walltime rotation) drained its last READY replica, logging "successor serving" when
there was none — 87 of 87 requests failed during a maintenance drain.
"""

from __future__ import annotations

from coral_hpc.reconcile import Cancel, Drain, PlanHistory, Submit, decide
from tests.unit.reconcile_facts import facts, plan, rec, slot
from tests.unit.test_reconcile_decide import NOW, S, World, summary


def _drains(decision) -> list[str]:
    return [a.replica_id for a in decision.actions if isinstance(a, Drain)]


def test_a_replan_that_drops_a_model_keeps_its_last_ready_replica():
    decision = decide(plan(slot("u1", 1, model="other")), facts(rec("a")), NOW, S,
                      configured=frozenset({"m", "other"}))
    assert _drains(decision) == []
    assert "a" in decision.held_back and "last READY replica of m" in decision.held_back


def test_a_model_removed_from_models_yaml_may_lose_its_last_replica():
    decision = decide(plan(), facts(rec("a")), NOW, S, configured=frozenset({"other"}))
    assert _drains(decision) == ["a"]


def test_a_drain_of_every_node_stops_nothing_while_no_capacity_exists():
    """Maintenance (`state=drain`: running jobs may finish): the plan finds no GPUs, every
    replica sits on a draining node: all keep serving until their jobs end."""
    records = [rec("a"), rec("b"), rec("c", model="n", template="u1")]
    decision = decide(plan(), facts(*records, unavailable=frozenset({"a", "b", "c"})), NOW, S,
                      configured=frozenset({"m", "n"}))
    assert _drains(decision) == [] and summary(decision) == []


def test_one_node_drained_keeps_a_healthy_replica_elsewhere():
    """One node drained: the re-plan has no room for model n any more; its healthy replica on
    another node is not drained (22 failures before), m's replica on the drained node keeps
    serving until its successor is READY."""
    records = [rec("a"), rec("x", model="n", template="u1", partitions=("v100",))]
    decision = decide(plan(slot("t2", 1, partitions=("v100",))),
                      facts(*records, unavailable=frozenset({"a"})), NOW, S,
                      configured=frozenset({"m", "n"}))
    assert _drains(decision) == []
    assert [(a.slot.template_id, a.replaces) for a in decision.actions
            if isinstance(a, Submit)] == [("t2", "a")]


def test_the_drain_message_says_what_serves_afterwards():
    records = [rec("a", started_at=-500.0, time_limit_s=800.0), rec("b", started_at=60.0)]
    decision = decide(plan(slot("t1", 1)), facts(*records), NOW, S)
    (drain,) = [a for a in decision.actions if isinstance(a, Drain)]
    assert drain.replica_id == "a"
    assert "1 other READY replica(s) of m serving" in drain.reason


def test_node_fail_is_replaced_at_once():
    records = [rec("a", ended_at=95.0, end_state="NODE_FAIL")]
    decision = decide(plan(slot("t1", 1)), facts(*records), NOW, S)
    assert summary(decision) == [("submit", "t1", None)]


def test_walltime_rotation_with_no_capacity_for_a_successor_keeps_serving_to_the_end():
    """Walltime near, the plan has nowhere to put a successor (its slot excluded): the replica
    is not drained early; it serves until its job ends."""
    world = World(time_limit_s=400.0, startup_s=20.0)
    for _ in range(30):
        world.step(plan(slot("t1", 1)))
        world.tick(2.0)
    assert world.ready() == 1
    readiness = []
    for _ in range(120):  # past the walltime lead, with a plan that places nothing
        world.step(plan())
        world.tick(2.0)
        readiness.append(world.ready())
    assert all(n == 1 for n in readiness[:100]), readiness


def test_alternating_plans_never_cancel_their_own_pending_replacements():
    """After one node drain the plan alternated every 30 s between two layouts and cancelled its
    own pending replacements (10 submissions for 2 replacements). Rule: a replica still pending
    or starting fills a missing slot of its model in place of a new submission."""
    world = World(time_limit_s=1e6, startup_s=200.0)  # slow start: plans change meanwhile
    layouts = [plan(slot("t1", 2)), plan(slot("t2", 2, partitions=("v100",)))]
    for _ in range(5):
        world.step(layouts[0])
        world.tick(2.0)
    world.tick(200.0)
    world.step(layouts[0])
    assert world.ready() == 2
    world.unavailable = {r for r, rr in world.records.items() if rr.ended_at is None}
    drained = set(world.unavailable)
    cancelled, readiness = [], []
    # 180 s while the successors start (200 s): the plan flips every 30 s (15 steps). Once READY,
    # replicas follow the plan make-before-break (the planner's start-up penalty keeps them).
    for step in range(90):
        desired = layouts[(step // 15) % 2]
        decision = decide(desired, facts(*world.records.values(),
                                         unavailable=frozenset(world.unavailable)), world.now, S)
        cancelled += [a.replica_id for a in decision.actions
                      if type(a).__name__ == "Cancel" and a.replica_id not in drained]
        world.apply(decision)
        world.tick(2.0)
        readiness.append(world.ready())
    assert cancelled == [], f"cancelled its own replacements: {cancelled}"
    submitted = [r for r in world.records if r not in drained]
    assert len(submitted) == 2, submitted  # one successor per drained replica, no more
    assert min(readiness) >= 2  # the drained ones served until their successors were READY


def _run_alternating(history, plans_made: int, plans) -> tuple[World, list]:
    """Two READY replicas of t1, then ``plans_made`` plans taken from ``plans`` in turn, each
    fed to ``history`` (None: no hysteresis) and followed for 60 s of 6 s polls (the default
    re-plan and poll intervals; replicas start in 20 s). Returns the world and every
    Submit/Drain/Cancel decided."""
    world = World(time_limit_s=1e6, startup_s=20.0)
    for _ in range(20):
        world.step(plan(slot("t1", 2)))
        world.tick(2.0)
    assert world.ready() == 2
    moves = []
    for made in range(plans_made):
        desired = plans[made % len(plans)]
        if history is not None:
            history.observe(desired)
        for _ in range(10):
            decision = decide(desired, facts(*world.records.values()), world.now, S,
                              history=history)
            moves += [(type(a).__name__, getattr(a, "replica_id", None))
                      for a in decision.actions if isinstance(a, (Submit, Drain, Cancel))]
            world.apply(decision)
            world.tick(6.0)
    return world, moves


def test_a_plan_alternating_every_cycle_never_replaces_ready_replicas():
    """Rule (coral_hpc.reconcile.hysteresis): a READY replica whose slot the plan dropped
    stands in for the new slot until the slot has been absent from 3 plans in a row, unless
    the new slot is 10 % cheaper per request/s. Alternating every plan, it is never absent
    twice in a row: nothing is submitted, drained or cancelled."""
    layouts = [plan(slot("t1", 2)), plan(slot("t2", 2, partitions=("v100",)))]
    world, moves = _run_alternating(PlanHistory(), 20, layouts)
    assert moves == []
    assert sorted(r for r, rr in world.records.items() if rr.ended_at is None) == ["r1", "r2"]
    # the control: without the rule the same plans replace both READY replicas on every plan
    # after the first (which names t1, where they are)
    _, moves = _run_alternating(None, 20, layouts)
    assert sum(1 for kind, _ in moves if kind == "Drain") == 2 * 19


def test_a_plan_that_keeps_another_layout_replaces_ready_replicas_on_its_third_plan():
    history = PlanHistory()
    moved = plan(slot("t2", 2, partitions=("v100",)))
    world, moves = _run_alternating(history, 2, [moved])
    assert moves == []                                   # absent from 1, then 2 plans: kept
    world2, moves = _run_alternating(PlanHistory(), 4, [moved])
    submits = [m for m in moves if m[0] == "Submit"]
    drains = [m for m in moves if m[0] == "Drain"]
    assert len(submits) == 2 and sorted(r for _, r in drains) == ["r1", "r2"]
    live = [rr for rr in world2.records.values() if rr.ended_at is None]
    assert {rr.template_id for rr in live} == {"t2"}     # moved, make-before-break


def test_a_cheaper_layout_replaces_a_ready_replica_at_once_a_dearer_one_does_not():
    records = [rec("a")]                                 # t1: 4.0/h for 2 req/s
    history = PlanHistory()
    cheaper = plan(slot("t2", 1, partitions=("v100",), cost=3.5))   # 12.5 % cheaper
    history.observe(cheaper)
    decision = decide(cheaper, facts(*records), NOW, S, history=history)
    assert [(a.slot.template_id, a.reason) for a in decision.actions
            if isinstance(a, Submit)] == [("t2", "scale up")]
    same = plan(slot("t2", 1, partitions=("v100",), cost=3.8))      # 5 % cheaper: not enough
    history.observe(same)
    assert not [a for a in decide(same, facts(*records), NOW, S, history=history).actions
                if isinstance(a, (Submit, Drain))]
    bigger = plan(slot("t2", 1, partitions=("v100",), throughput=3.0, cost=6.0))
    history.observe(bigger)                              # needs more req/s than a gives
    assert [a.slot.template_id for a in decide(bigger, facts(*records), NOW, S,
                                               history=history).actions
            if isinstance(a, Submit)] == ["t2"]
