"""replan_triggers (edge triggers, typed kinds), learnt start-up time, backoff, plan rows
round trip."""

from __future__ import annotations

import pytest

from coral_hpc.config import PolicyConfig
from coral_hpc.plan.desired import plan_from_rows, slot_rows
from coral_hpc.reconcile import Backoff, ReconcileSettings, TriggerKind, replan_triggers
from coral_hpc.reconcile.startup import lead_startup_s, learned_startup_s, startup_penalty
from coral_hpc.store import Exclusion, StartupObservation
from coral_hpc.types import ExclusionKind, TemplateExclusion
from tests.unit.reconcile_facts import facts, plan, rec, slot

S = ReconcileSettings(replan_interval_s=60, pending_timeout_s=60, walltime_lead_s=300,
                      walltime_signal_s=100, unhealthy_after=3, unhealthy_grace_s=30)


def triggers(plan_time, now, *records, **kw):
    kw.setdefault("unavailable_at_plan", frozenset())
    return replan_triggers(plan_time, now, S, facts(*records), **kw)


def reasons(plan_time, now, *records, **kw):
    return [t.reason for t in triggers(plan_time, now, *records, **kw)]


def kinds(plan_time, now, *records, **kw):
    return [t.kind for t in triggers(plan_time, now, *records, **kw)]


def test_no_plan_yet():
    assert [(t.kind, t.reason) for t in replan_triggers(None, 5.0, S)] == [
        (TriggerKind.START, "no plan yet")]


def test_quiet_cluster_within_the_interval_needs_no_plan():
    assert reasons(100.0, 159.0, rec("a"), rec("b", "pending", submitted_at=100.0)) == []


def test_interval_elapsed():
    assert reasons(100.0, 160.0) == ["re-plan interval (60s) elapsed"]
    assert kinds(100.0, 160.0) == [TriggerKind.INTERVAL]


def test_demand_moved():
    (reason,) = reasons(100.0, 110.0, demand_changed=["phi-4", "llama"])
    assert reason.startswith("demand of llama, phi-4 moved")
    assert kinds(100.0, 110.0, demand_changed=["phi-4"]) == [TriggerKind.DEMAND]


def test_node_or_partition_draining_triggers_once():
    now_down = frozenset({"node:a100-01", "partition:v100"})
    assert reasons(100.0, 110.0, unavailable=now_down) == [
        "draining or down: node:a100-01, partition:v100"
    ]
    # the plan made after the drain knew it: no trigger
    assert reasons(110.0, 112.0, unavailable=now_down, unavailable_at_plan=now_down) == []
    assert reasons(110.0, 112.0, unavailable_at_plan=now_down) == [
        "back in service: node:a100-01, partition:v100"
    ]
    assert kinds(100.0, 110.0, unavailable=now_down) == [TriggerKind.CLUSTER]


def test_unknown_cluster_state_at_plan_time_replans():
    assert [(t.kind, t.reason) for t in replan_triggers(100.0, 101.0, S,
                                                         unavailable_at_plan=None)] == [
        (TriggerKind.START, "cluster state at the last plan unknown")]


@pytest.mark.parametrize(
    ("record", "plan_time", "now", "fires"),
    [
        (rec("a", ended_at=105.0, end_state="NODE_FAIL"), 100.0, 110.0, True),
        (rec("a", ended_at=95.0, end_state="NODE_FAIL"), 100.0, 110.0, False),  # plan knew
        (rec("a", ended_at=105.0, end_state="CANCELLED", cancelled_at=104.0), 100.0, 110.0,
         False),  # we ended it
        (rec("a", "pending", submitted_at=45.0), 100.0, 110.0, True),  # deadline 105
        (rec("a", "pending", submitted_at=30.0), 100.0, 110.0, False),  # deadline 90: plan knew
        (rec("a", "pending", submitted_at=55.0), 100.0, 110.0, False),  # deadline 115: not yet
        # limit 1000, warning 100 s before, lead 300: successor due at 600
        (rec("a", started_at=0.0, time_limit_s=1000.0), 590.0, 610.0, True),
        (rec("a", started_at=0.0, time_limit_s=1000.0), 601.0, 610.0, False),
        (rec("a", health_failures=3, health_ok_at=80.0), 100.0, 111.0, True),  # too long at 110
        (rec("a", health_failures=3, health_ok_at=80.0), 100.0, 109.0, False),
    ],
)
def test_replica_triggers_fire_once_after_the_plan(record, plan_time, now, fires):
    assert bool(reasons(plan_time, now, record)) is fires


def test_new_exclusions_trigger_a_replan():
    fresh = Exclusion(TemplateExclusion("t1"), ExclusionKind.CRASH_COOLDOWN, 105.0, 1000.0,
                      "crashed 3 times")
    old = Exclusion(TemplateExclusion("t2"), ExclusionKind.CRASH_COOLDOWN, 95.0, 1000.0,
                    "crashed 3 times")
    assert reasons(100.0, 110.0, exclusions=[fresh, old]) == [
        "excluded template:t1: crashed 3 times"
    ]


def _obs(seconds, template="t1"):
    return [StartupObservation(float(i), f"r{i}", template, "a100", s)
            for i, s in enumerate(seconds)]


def test_startup_time_is_configured_until_learnt_then_the_median():
    assert learned_startup_s(_obs([10, 20]), 180.0) == 180.0
    assert learned_startup_s(_obs([10, 20, 300]), 180.0) == 20.0
    mixed = _obs([10, 12, 14], "t1") + _obs([100, 110, 120], "t2")
    assert learned_startup_s(mixed, 180.0, template_id="t2") == 110.0
    assert learned_startup_s(mixed, 180.0, template_id="t3") == pytest.approx((14 + 100) / 2)
    assert startup_penalty(30.0, 60.0) == 0.5
    with pytest.raises(ValueError):
        startup_penalty(30.0, 0.0)


def test_the_walltime_lead_covers_the_slowest_recent_start_up_not_the_median():
    # newest first, as the store returns them: the slow ones are recent (engines loading at once)
    assert lead_startup_s(_obs([250, 240, 60, 50, 45, 400]), 90.0) == 250.0  # newest 5 only
    assert lead_startup_s(_obs([50, 45, 40]), 90.0) == 50.0  # learnt: the configured guess goes
    assert lead_startup_s(_obs([120]), 90.0) == 120.0  # too few yet: the slower of both
    assert lead_startup_s(_obs([30]), 90.0) == 90.0
    assert lead_startup_s([], 90.0) == 90.0


def test_backoff_doubles_to_a_cap_and_resets():
    backoff = Backoff(base_s=2.0, max_s=10.0)
    assert backoff.ready(0.0)
    assert [backoff.failed(0.0) for _ in range(5)] == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert not backoff.ready(9.9) and backoff.ready(10.0)
    backoff.succeeded()
    assert backoff.ready(0.0) and backoff.failed(0.0) == 2.0


def test_settings_from_policy_carry_the_configured_values():
    policy = PolicyConfig(poll_interval_s=2, pending_timeout_s=60, crash_limit=2,
                          walltime_lead_s=120, replan_interval_s=30)
    settings = ReconcileSettings.from_policy(policy)
    assert (settings.poll_interval_s, settings.pending_timeout_s, settings.crash_limit,
            settings.walltime_lead_s, settings.replan_interval_s) == (2, 60, 2, 120, 30)
    assert settings.stale_after_s == 6
    assert settings.pending_exclusion_s >= settings.pending_timeout_s


def test_default_settings_are_those_of_a_models_yaml_without_policy():
    """One place for each default: ReconcileSettings() is what `policy:` left out gives (the
    documented 6 s poll interval, not a second default of its own)."""
    assert ReconcileSettings() == ReconcileSettings.from_policy(PolicyConfig())
    assert ReconcileSettings().poll_interval_s == 6.0


def test_plan_rows_round_trip_through_plain_data():
    desired = plan(slot("t1", 2), slot("t2", 1, model="n", partitions=("a100", "v100")),
                   time=42.0)
    assert plan_from_rows(slot_rows(desired), 42.0) == desired


def test_slots_from_a_solver_plan_keep_layout_throughput_and_cost():
    from coral_hpc.plan.planner import desired_plan
    from coral_hpc.types import ReplicaLayout, StageLayout
    from coral_solver.types import ModelSpec, Plan, PlanRow, Stage, Template

    hetero = Template("m", tp=2, stages=(Stage("a100", 20), Stage("v100", 12)), throughput=3.5)
    single = Template("n", tp=1, stages=(Stage("a100", 36),), throughput=2.0)
    plan = Plan(
        rows=(PlanRow(hetero, ("a100", "v100"), 2, 9.0), PlanRow(single, ("a100",), 0, 2.0)),
        demand={"m": 7.0}, served={"m": 7.0}, capacity={"m": 7.0}, cost_per_hour=18.0,
        status="optimal", gap=0.0, solve_seconds=0.1,
    )
    models = [ModelSpec("m", "qwen3-32b", 512, 128, 2.0, 0.1),
              ModelSpec("n", "qwen3-8b", 512, 128, 2.0, 0.1)]
    desired = desired_plan(plan, models, now=5.0)
    (only,) = desired.slots  # count 0 rows dropped
    assert (only.template_id, only.partitions, only.count) == (hetero.id, ("a100", "v100"), 2)
    assert (only.throughput, only.cost_per_hour) == (3.5, 9.0)
    # V100 has no bf16: the whole pipeline runs in half precision
    assert only.layout == ReplicaLayout(2, (StageLayout("a100", "a100", 20),
                                            StageLayout("v100", "v100", 12)), "half")
    assert desired.capacity("m") == 7.0
