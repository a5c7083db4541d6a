"""A layout that fails at start backs off, exponentially and capped, naming why (issue 27: a
long-context layout whose KV cache could not hold max_model_len crashed at start and was
resubmitted in a loop). decide() on tables of facts with a fake clock."""

from __future__ import annotations

import pytest

from coral_hpc.reconcile import Exclude, ReconcileSettings, Submit, decide
from coral_hpc.reconcile.start_backoff import next_backoff_s
from coral_hpc.store import Exclusion
from coral_hpc.types import ExclusionKind, TemplateExclusion
from tests.unit.reconcile_facts import facts, plan, rec, slot

S = ReconcileSettings(crash_limit=3, crash_cooldown_s=1000, start_backoff_s=60)
KV = ("ValueError: To serve at least one request with the model's max seq len (600000), (1.14 "
      "GiB KV cache is needed, which is larger than the available KV cache memory (1.0 GiB).")


def failed_start(rid: str, ended_at: float, template: str = "t1", **kw):
    return rec(rid, ready_at=None, ended_at=ended_at, end_state="FAILED", template=template,
               failure=KV, **kw)


def run(now, *records, exclusions=()):
    return decide(plan(slot("t1", 1), slot("t2", 1, model="m2")), facts(*records), now, S,
                  exclusions=exclusions)


def test_the_backoff_doubles_and_is_capped():
    assert next_backoff_s(None, S) == 60
    steps = [next_backoff_s(None, S)]
    for _ in range(6):
        steps.append(next_backoff_s(steps[-1], S))
    assert steps == [60, 120, 240, 480, 960, 1000, 1000]
    # the stored exclusion starts a few ms after the decision: still a doubling
    assert next_backoff_s(59.997, S) == 120


def test_one_failed_start_excludes_the_template_at_once_naming_the_logs_error():
    decision = run(100.0, failed_start("a", 95.0))
    (exclude,) = decision.of(Exclude)
    assert exclude.target == TemplateExclusion("t1")
    assert exclude.kind is ExclusionKind.START_FAILED
    assert exclude.until == pytest.approx(160.0)
    assert KV in exclude.reason and "replica a" in exclude.reason
    assert "kept out of plans for 60s" in exclude.reason
    # nothing of t1 is submitted meanwhile; t2 is
    assert [s.slot.template_id for s in decision.of(Submit)] == ["t2"]


def test_failed_starts_in_a_row_double_the_backoff_until_the_cap():
    previous = Exclusion(TemplateExclusion("t1"), ExclusionKind.START_FAILED, 100.0, 340.0, "x")
    # the first replica after that exclusion ended failed again: twice 240 s
    decision = run(400.0, failed_start("b", 390.0), exclusions=[previous])
    (exclude,) = decision.of(Exclude)
    assert exclude.until == pytest.approx(400.0 + 480.0)
    capped = Exclusion(TemplateExclusion("t1"), ExclusionKind.START_FAILED, 0.0, 960.0, "x")
    (exclude,) = run(1000.0, failed_start("c", 990.0), exclusions=[capped]).of(Exclude)
    assert exclude.until == pytest.approx(1000.0 + S.crash_cooldown_s)


def test_a_failure_already_counted_or_in_force_excludes_nothing_new():
    in_force = Exclusion(TemplateExclusion("t1"), ExclusionKind.START_FAILED, 96.0, 156.0, "x")
    assert run(100.0, failed_start("a", 95.0), exclusions=[in_force]).of(Exclude) == []
    expired = Exclusion(TemplateExclusion("t1"), ExclusionKind.START_FAILED, 96.0, 156.0, "x")
    decision = run(200.0, failed_start("a", 95.0), exclusions=[expired])
    assert decision.of(Exclude) == []
    assert "t1" in [s.slot.template_id for s in decision.of(Submit)]


def test_a_replica_that_reached_ready_ends_the_run():
    previous = Exclusion(TemplateExclusion("t1"), ExclusionKind.START_FAILED, 100.0, 580.0, "x")
    served = rec("ok", ready_at=600.0, ended_at=700.0, end_state="CANCELLED",
                 cancelled_at=650.0)
    (exclude,) = run(800.0, served, failed_start("d", 790.0), exclusions=[previous]).of(Exclude)
    assert exclude.until == pytest.approx(800.0 + 60.0)


def test_a_crash_after_ready_is_no_failed_start():
    crashed = rec("e", ended_at=95.0, end_state="FAILED")
    assert run(100.0, crashed).of(Exclude) == []
    # nor is a replica we stopped, nor one that never failed
    stopped = rec("f", ready_at=None, ended_at=95.0, end_state="CANCELLED", cancelled_at=90.0)
    assert run(100.0, stopped).of(Exclude) == []
