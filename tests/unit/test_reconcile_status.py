"""replica_status: one function derives a replica's state from stored facts (fake clock)."""

from __future__ import annotations

import pytest

from coral_hpc.reconcile import ReconcileSettings, ReplicaFacts, ReplicaState, replica_status
from tests.unit.reconcile_facts import rec

S = ReconcileSettings(
    pending_timeout_s=60, walltime_lead_s=300, walltime_signal_s=100, unhealthy_after=3,
    unhealthy_grace_s=30, submit_lost_s=20,
)


def status(record, now=100.0, node_unavailable=False):
    return replica_status(ReplicaFacts(record, node_unavailable=node_unavailable), now, S)


@pytest.mark.parametrize(
    ("record", "state"),
    [
        (rec("a", "submitting"), ReplicaState.SUBMITTING),
        (rec("a", "pending"), ReplicaState.PENDING),
        # submitted, not yet in the queue's answer: waiting, like a pending job
        (rec("a", "pending", slurm_state=None), ReplicaState.PENDING),
        (rec("a", "starting"), ReplicaState.STARTING),
        (rec("a", "starting", slurm_state="CONFIGURING"), ReplicaState.STARTING),
        (rec("a"), ReplicaState.READY),
        (rec("a", slurm_state="COMPLETING"), ReplicaState.READY),
        (rec("a", health_failures=2), ReplicaState.READY),
        (rec("a", health_failures=3), ReplicaState.UNHEALTHY),
        (rec("a", slurm_state="SUSPENDED"), ReplicaState.UNHEALTHY),
        (rec("a", drain_requested_at=50.0), ReplicaState.DRAINING),
        (rec("a", drain_requested_at=50.0, cancelled_at=60.0), ReplicaState.DRAINING),
        (rec("a", cancelled_at=60.0, ended_at=70.0, end_state="CANCELLED"), ReplicaState.ENDED),
        (rec("a", ended_at=70.0, end_state="FAILED"), ReplicaState.FAILED),
        (rec("a", ended_at=70.0, end_state="NODE_FAIL"), ReplicaState.FAILED),
        (rec("a", ended_at=70.0, end_state="PREEMPTED"), ReplicaState.FAILED),
        (rec("a", ended_at=70.0, end_state="TIMEOUT"), ReplicaState.FAILED),
        # someone else's scancel is not ours: the replica failed
        (rec("a", ended_at=70.0, end_state="CANCELLED"), ReplicaState.FAILED),
        # a terminal Slurm state counts even before the end is recorded
        (rec("a", slurm_state="OUT_OF_MEMORY"), ReplicaState.FAILED),
        (rec("a", "pending", slurm_state="CANCELLED", cancelled_at=90.0), ReplicaState.ENDED),
    ],
)
def test_state_table(record, state):
    assert status(record).state is state


@pytest.mark.parametrize(
    ("end_state", "crashed"),
    [("FAILED", True), ("OUT_OF_MEMORY", True), ("NODE_FAIL", False), ("PREEMPTED", False),
     ("TIMEOUT", False), ("CANCELLED", False), ("BOOT_FAIL", False)],
)
def test_only_the_templates_own_failures_are_crashes(end_state, crashed):
    assert status(rec("a", ended_at=70.0, end_state=end_state)).crashed is crashed


def test_time_left_and_walltime_lead():
    # limit 1000 s, Slurm's USR2 warning 100 s before it: usable until 900, successor due at 600
    record = rec("a", started_at=0.0, time_limit_s=1000.0)
    assert status(record, now=600.0).time_left_s == pytest.approx(400.0)
    assert not status(record, now=599.0).near_walltime
    assert status(record, now=600.0).near_walltime
    assert status(record, now=600.0).needs_successor


def test_a_learnt_start_up_longer_than_the_lead_starts_the_successor_earlier():
    # seen on the real engine: a 180 s lead, engines READY 260 s after submit on a loaded host,
    # the old replicas drained at Slurm's warning before their successors served. Usable until
    # 900; learnt start-up 450 s > lead 300 s: the successor is due at 450, not 600
    from dataclasses import replace

    learnt = replace(S, startup_s=450.0)
    record = rec("a", started_at=0.0, time_limit_s=1000.0)
    facts = ReplicaFacts(record)
    assert not replica_status(facts, 449.0, learnt).near_walltime
    assert replica_status(facts, 450.0, learnt).near_walltime
    assert not replica_status(facts, 450.0, S).near_walltime  # the configured lead alone: 600


def test_walltime_lead_is_at_most_half_a_short_usable_time():
    # limit 120 s: the warning comes at most half-way (60 s); lead at most half of that: 30 s
    record = rec("a", started_at=0.0, time_limit_s=120.0)
    assert not status(record, now=29.0).near_walltime
    assert status(record, now=30.0).near_walltime


def test_no_time_limit_never_nears_walltime():
    assert status(rec("a", time_limit_s=None), now=1e9).time_left_s is None
    assert not status(rec("a", time_limit_s=None), now=1e9).near_walltime


def test_pending_too_long_counts_from_submission():
    record = rec("a", "pending", submitted_at=40.0)
    assert status(record, now=100.0).pending_for_s == pytest.approx(60.0)
    assert not status(record, now=100.0).pending_too_long
    assert status(record, now=100.5).pending_too_long


def test_time_slurm_did_not_answer_is_not_queue_wait():
    # issue 27: pending 18 s, then 64 s of controller outage, then 4 s: 22 s of queue wait
    record = rec("a", "pending", submitted_at=14.0)
    paused = replica_status(ReplicaFacts(record, unanswered_s=64.0), 100.0, S)
    assert paused.pending_for_s == pytest.approx(22.0) and not paused.pending_too_long
    later = replica_status(ReplicaFacts(record, unanswered_s=64.0), 138.5, S)
    assert later.pending_too_long


def test_a_lost_submission_is_flagged_after_submit_lost_s():
    record = rec("a", "submitting", created_at=90.0)
    assert not status(record, now=110.0).submit_lost
    assert status(record, now=110.5).submit_lost


def test_node_unavailable_means_move_only_once_running():
    assert status(rec("a"), node_unavailable=True).must_move
    assert status(rec("a", "starting"), node_unavailable=True).needs_successor
    assert not status(rec("a", "pending"), node_unavailable=True).must_move


def test_unhealthy_too_long_counts_from_the_last_good_probe():
    record = rec("a", health_failures=5, health_ok_at=80.0)
    assert not status(record, now=110.0).unhealthy_too_long
    assert status(record, now=110.5).unhealthy_too_long
    assert status(record, now=110.5).needs_successor


def test_ended_replicas_need_no_successor_whatever_their_facts():
    record = rec("a", started_at=0.0, time_limit_s=100.0, ended_at=99.0, end_state="TIMEOUT")
    result = status(record, now=100.0, node_unavailable=True)
    assert result.state is ReplicaState.FAILED
    assert not result.needs_successor
