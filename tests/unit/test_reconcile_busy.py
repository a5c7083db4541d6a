"""The decide step on a busy cluster: a pending replica keeps its place in Slurm's queue while
Slurm expects to start it within the horizon, or while the plan queues it there; it is moved
when its expected start recedes past the horizon and the plan places its model elsewhere."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from coral_hpc.reconcile import Cancel, Exclude, ReconcileSettings, Submit, decide
from tests.unit.reconcile_facts import facts, plan, rec, slot

S = ReconcileSettings(poll_interval_s=2, pending_timeout_s=60, pending_exclusion_s=600,
                      max_queue_wait_s=1800)
NOW = 1000.0


def run(desired, *records):
    return decide(desired, facts(*records), NOW, S)


def test_a_pending_replica_slurm_starts_within_the_horizon_is_kept_past_the_timeout():
    waiting = rec("a", "pending", submitted_at=10.0, expected_start=NOW + 1500)
    decision = run(plan(slot("t1", 1)), waiting)
    assert not decision.of(Cancel) and not decision.of(Exclude) and not decision.of(Submit)


def test_a_queued_slot_keeps_its_replica_however_far_its_start():
    queued = replace(slot("t1", 1), queued=True, expected_wait_s=7200)
    waiting = rec("a", "pending", submitted_at=10.0, expected_start=NOW + 7200)
    decision = run(plan(queued), waiting)
    assert not decision.of(Cancel) and not decision.of(Exclude)


def test_a_start_receding_past_the_horizon_moves_the_replica():
    # the plan now places the model on another shape that starts sooner
    elsewhere = replace(slot("t2", 1, partitions=("v100",)), expected_wait_s=600)
    waiting = rec("a", "pending", submitted_at=10.0, expected_start=NOW + 5000)
    decision = run(plan(slot("t1", 1), elsewhere), waiting)
    assert [c.replica_id for c in decision.of(Cancel)] == ["a"]
    assert [e.kind for e in decision.of(Exclude)] == ["pending_timeout"]
    # with no estimate from Slurm the timeout rule holds as before
    unknown = rec("b", "pending", submitted_at=10.0)
    assert [c.replica_id for c in run(plan(slot("t1", 1)), unknown).of(Cancel)] == ["b"]


def test_a_queued_replica_the_plan_queues_on_another_shape_is_replaced():
    moved = replace(slot("t2", 1, partitions=("v100",)), queued=True, expected_wait_s=600)
    waiting = rec("a", "pending", submitted_at=900.0, expected_start=NOW + 7200)
    decision = run(plan(moved), waiting)
    assert [s.slot.template_id for s in decision.of(Submit)] == ["t2"]
    assert [c.replica_id for c in decision.of(Cancel)] == ["a"]


def test_status_shows_a_pending_replica_with_slurms_reason_and_expected_start(tmp_path,
                                                                               monkeypatch):
    from click.testing import CliRunner

    from coral_hpc.cli.status import status, status_data
    from coral_hpc.config import load_deployment
    from coral_hpc.store import open_store

    models = tmp_path / "models.yaml"
    text = (Path(__file__).resolve().parents[2] / "examples" / "models.yaml").read_text()
    lines = [f"db_path: {tmp_path / 'coral.db'}" if line.startswith("db_path:") else
             f"state_dir: {tmp_path / 'state'}" if line.startswith("state_dir:") else line
             for line in text.splitlines()]
    models.write_text("\n".join(lines) + "\n")
    deployment = load_deployment(models)
    store = open_store(deployment.db_path)
    store.add_replica(rec("a", "pending", model=deployment.models[0].name,
                          slurm_reason="Resources", expected_start=NOW + 720))
    data = status_data(deployment, store, NOW)
    store.close()
    (row,) = data["replicas"]
    assert row["state"] == "PENDING" and row["slurm_reason"] == "Resources"
    assert row["expected_start"] == NOW + 720
    # no daemon runs: status asks Slurm, which still queues the job
    from tests.fakes.slurm import FakeSlurm, recorded_snapshot
    from tests.unit.test_status_elsewhere import _job

    slurm = FakeSlurm(recorded_snapshot(), lambda: NOW)
    slurm.add_job(replace(_job("1", deployment.deployment, "x"), job_id="job-a",
                          state="PENDING", reason="Resources"))
    monkeypatch.setattr("coral_hpc.slurm.client_for_deployment", lambda _d: slurm)
    out = CliRunner().invoke(status, [str(models)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "Resources, expected" in out.output
