"""What Slurm printed on the local cluster made busy, with reservations for this user and
preemption set up (tests/data/slurm/22.05/busy/, recorded by
tests/data/plan/record_local_busy.py): reservations, the job's account and reservation in
squeue, partition PriorityTier/PreemptMode and QOS Preempt lists, read as coral-hpc plans with
them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from coral_hpc.config import load_deployment
from coral_hpc.plan import availability
from coral_hpc.slurm.build import build_snapshot
from coral_hpc.slurm.parse_jobs import parse_squeue
from coral_hpc.slurm.parse_limits import build_limits, parse_qos, qos_preemptors
from coral_hpc.slurm.parse_nodes import parse_nodes_text, parse_partitions_text
from coral_hpc.slurm.parse_reservations import parse_reservations
from coral_hpc.slurm.snapshot import Limits

REPO = Path(__file__).resolve().parents[2]
BUSY = REPO / "tests" / "data" / "slurm" / "22.05" / "busy"
REC = REPO / "tests" / "data" / "slurm" / "22.05"
MODELS = REPO / "examples" / "models.yaml"


def text(name: str) -> str:
    return (BUSY / name).read_text()


def test_reservations_as_recorded_active_and_later():
    found = {r.name.split("-")[1]: r for r in parse_reservations(
        text("scontrol_show_reservation.txt"), "root", None)}
    assert set(found) == {"rec", "later"}
    active, later = found["rec"], found["later"]
    assert active.state == "active" and active.nodes == ("v100-02",)
    assert later.state == "inactive" and later.nodes == ("a100-02",)
    assert later.start is not None and active.start is not None
    assert 14 * 60 <= later.start - active.start <= 16 * 60  # "now+15minutes"
    assert later.end - later.start == 30 * 60
    # not for another user or account
    assert parse_reservations(text("scontrol_show_reservation.txt"), "coral-other",
                              "other-lab") == ()


def test_squeue_says_each_jobs_account_and_reservation():
    jobs = [j for j in parse_squeue(text("squeue_own.txt")) if j.name == "busy-record"]
    by_account = {j.account: j for j in jobs}
    assert set(by_account) == {"coral-busy", "coral"}
    inside, outside = by_account["coral-busy"], by_account["coral"]
    assert inside.reservation and inside.reservation.startswith("busy-rec-")
    assert inside.state == "RUNNING" and inside.nodes == ("v100-02",)
    assert outside.reservation is None


def test_max_jobs_count_only_the_users_jobs_in_the_deployments_account():
    jobs = parse_squeue(text("squeue_own.txt"))
    snap = build_snapshot(
        slurm_version="22.05.8", observed_at=0.0, deployment="nobody", backend="cli",
        raw_nodes=parse_nodes_text((REC / "scontrol_show_node.txt").read_text()),
        raw_partitions=parse_partitions_text(text("scontrol_show_partition.txt")),
        jobs=jobs, limits=None, gpu_memory=lambda _: 40.0)
    live = [j for j in jobs if j.end_kind is None]
    assert snap.other_user_jobs == len(live)
    in_busy = sum(1 for j in live if j.account == "coral-busy")
    assert snap.other_user_jobs_by_account["coral-busy"] == in_busy >= 1
    deployment = load_deployment(MODELS)
    charged = deployment.model_copy(update={"cluster": deployment.cluster.model_copy(
        update={"account": "coral-busy"})})
    assert availability.job_limits(charged, snap).other_jobs == in_busy
    assert availability.job_limits(deployment, snap).other_jobs == len(live)


def test_qos_preempt_lists_as_recorded():
    rows = parse_qos(text("sacctmgr_qos.txt"))
    assert {r["Name"] for r in rows} >= {"normal", "busy-scav", "busy-prio"}
    assert qos_preemptors(rows) == {"busy-scav": ("busy-prio",)}
    # the rows recorded before Preempt was asked for still read, preempting nothing
    assert qos_preemptors(parse_qos((REC / "sacctmgr_qos.txt").read_text())) == {}
    limits = build_limits([], rows, "root", None, "busy-scav", 0.0)
    assert limits.qos_preempted_by["busy-scav"] == ("busy-prio",)


def _snapshot_with(partitions_text: str, qos: str | None, preempted_by: dict):
    snap = build_snapshot(
        slurm_version="22.05.8", observed_at=0.0, deployment="d", backend="cli",
        raw_nodes=parse_nodes_text((REC / "scontrol_show_node.txt").read_text()),
        raw_partitions=parse_partitions_text(partitions_text), jobs=[],
        limits=Limits(None, qos, None, {}, None, {}, None, None, 0.0,
                      qos_preempted_by=preempted_by),
        gpu_memory=lambda _: 40.0)
    return snap


def test_preemptible_partitions_from_tier_and_qos():
    deployment = load_deployment(MODELS)
    parts = list(deployment.cluster.partitions)
    scav = parts[0].model_copy(update={"name": "busy-scav", "gpu_types": ("v100",)})
    with_scav = deployment.model_copy(update={"cluster": deployment.cluster.model_copy(
        update={"partitions": (*parts, scav)})})
    recorded = text("scontrol_show_partition.txt")
    snap = _snapshot_with(recorded, "normal", {})
    info = snap.partition("busy-scav")
    assert info.priority_tier == 0 and snap.partition("v100").priority_tier == 1
    why = availability.preemptible_partitions(with_scav, snap)
    if info.preempt_mode != "off":  # Slurm kept PreemptMode=REQUEUE on the partition
        assert set(why) == {"busy-scav"} and "PriorityTier 0 below" in why["busy-scav"]
    else:  # PreemptType=preempt/none here: Slurm shows OFF, so nothing is preempted
        assert why == {}
    # the recorded dev-cluster partitions (all tier 1, PreemptMode OFF): none
    plain = _snapshot_with((REC / "scontrol_show_partition.txt").read_text(), "normal", {})
    assert availability.preemptible_partitions(deployment, plain) == {}
    # a partition QOS that another QOS preempts, as the recorded QOS rows say
    preempted = qos_preemptors(parse_qos(text("sacctmgr_qos.txt")))
    v100 = replace(plain.partition("v100"), qos="busy-scav")
    qos_snap = replace(plain, partitions=tuple(v100 if p.name == "v100" else p
                                               for p in plain.partitions),
                       limits=replace(plain.limits, qos_preempted_by=preempted))
    assert availability.preemptible_partitions(deployment, qos_snap) == {
        "v100": "partition QOS busy-scav is preempted by QOS busy-prio"}
    # the site may say otherwise either way
    off = deployment.model_copy(update={"cluster": deployment.cluster.model_copy(update={
        "partitions": tuple(p.model_copy(update={"preemptible": False}) for p in parts)})})
    assert availability.preemptible_partitions(off, qos_snap) == {}
    # the deployment's own QOS preempted: every replica at risk, said, not refused
    job_qos = replace(plain, limits=replace(plain.limits, qos="busy-scav",
                                            qos_preempted_by=preempted))
    _, warnings = availability.with_preemption(deployment, job_qos, _cluster(deployment, plain))
    assert any(w.startswith("QOS busy-scav (this deployment's jobs) is preempted by QOS "
                            "busy-prio") for w in warnings), warnings


def _cluster(deployment, snapshot):
    from coral_hpc.plan.inputs import cluster_from_snapshot

    return cluster_from_snapshot(deployment, snapshot)
