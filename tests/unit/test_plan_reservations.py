"""Reservations the account may use are planned on: their nodes become placements
``partition@reservation`` with the reservation's window, and a replica placed there is launched
with ``--reservation`` (submitit and the hetjob script alike).

The local cluster's snapshot (tests/data/plan/devcluster-snapshot.json, recorded) made full:
every GPU held by others, except what a reservation for this user holds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.launch.render import render_hetjob
from coral_hpc.launch.spec import replica_spec
from coral_hpc.launch.submit import submitit_parameters
from coral_hpc.plan import availability
from coral_hpc.plan.layout import layout_of
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.plan.report import plan_json
from coral_hpc.plan.reservations import usable_reservations
from coral_hpc.slurm.parse_reservations import parse_reservations
from coral_hpc.slurm.snapshot import ClusterSnapshot, ReservationInfo
from coral_hpc.types import ReplicaLayout, StageLayout, placement_name, split_placement

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"
REC = REPO / "tests" / "data" / "slurm" / "22.05"
MODELS = REPO / "examples" / "models.yaml"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


def full(snapshot: ClusterSnapshot, reserved: str | None = None) -> ClusterSnapshot:
    """Every GPU allocated to someone else; ``reserved`` flagged RESERVED (Slurm's state of a
    node in an active reservation) with nothing running there."""
    nodes = []
    for n in snapshot.nodes:
        if n.name == reserved:
            nodes.append(replace(n, state="reserved", slurm_state="IDLE+RESERVED", gpus_free=0))
        else:
            nodes.append(replace(n, state="allocated", slurm_state="ALLOCATED",
                                 gpus_alloc=n.gpus_total, gpus_free=0, cpus_alloc=n.cpus))
    return replace(snapshot, nodes=tuple(nodes))


def reservation(snapshot: ClusterSnapshot, node: str, start_in: float = -60.0,
                length: float = 7200.0, **kw) -> ReservationInfo:
    now = snapshot.observed_at
    return ReservationInfo(name=kw.pop("name", "lab-res"), nodes=(node,), start=now + start_in,
                           end=now + start_in + length, partition=None,
                           state="active" if start_in <= 0 else "inactive", **kw)


def solve(deployment, snapshot, cache):
    return Planner(cache_dir=cache).solve(PlanRequest.from_snapshot(deployment, snapshot))


def test_placement_names_round_trip():
    assert placement_name("a100", "lab-res") == "a100@lab-res"
    assert split_placement("a100@lab-res") == ("a100", "lab-res")
    assert split_placement("a100") == ("a100", None)
    layout = ReplicaLayout(1, (StageLayout("a100", "a100", 32, "lab-res"),), "auto")
    assert layout.partitions == ("a100@lab-res",)
    assert ReplicaLayout.from_dict(layout.to_dict()) == layout


def test_a_full_cluster_plans_on_the_users_active_reservation(cache):
    deployment = load_deployment(MODELS)
    base = ClusterSnapshot.from_json(DEVCLUSTER.read_text())
    busy = full(base, reserved="a100-80g-01")
    res = reservation(busy, "a100-80g-01")
    outcome = solve(deployment, replace(busy, reservations=(res,)), cache)
    rows = outcome.solved.plan.rows
    assert rows, outcome.solved.plan.binding
    assert all(set(r.partitions) == {"a100-80g@lab-res"} for r in rows)
    assert all(n == ("a100-80g-01",) * r.template.pp for r in rows for n in r.nodes)
    assert not outcome.problems
    # the job it becomes names the reservation; its time limit ends with it
    slot = outcome.desired.slots[0]
    assert slot.layout.stages[0].reservation == "lab-res"
    assert slot.time_limit_s == 7200 - 60
    doc = plan_json(outcome)
    planned = [r for r in doc["replicas"] if not r["queued"]]
    assert {s["reservation"] for r in planned for s in r["stages"]} == {"lab-res"}
    assert all(r["start"] == "now" and not r["preemptible"] for r in planned)
    # models the reservation has no room for queue outside it, start unknown (no estimates)
    assert all(r["start"] == "start unknown" for r in doc["replicas"] if r["queued"])
    # without the reservation, the same full cluster has nothing now
    bare = solve(deployment, busy, cache)
    assert not bare.solved.plan.rows


def test_a_reservation_that_starts_within_the_horizon_counts_with_its_wait(cache):
    deployment = load_deployment(MODELS)
    busy = full(ClusterSnapshot.from_json(DEVCLUSTER.read_text()))
    soon = reservation(busy, "a100-80g-01", start_in=600.0)
    outcome = solve(deployment, replace(busy, reservations=(soon,)), cache)
    rows = outcome.solved.plan.rows
    assert rows and all(r.wait_s == pytest.approx(600.0) for r in rows)
    assert {s.expected_wait_s for s in outcome.desired.slots if not s.queued} == {600.0}
    assert all(not s.start_known for s in outcome.desired.slots if s.queued)
    late = reservation(busy, "a100-80g-01", start_in=deployment.policy.max_queue_wait_s + 60)
    assert usable_reservations(deployment, replace(busy, reservations=(late,)))[0] == []


def test_reservations_too_short_maintenance_or_oddly_named_are_not_planned():
    deployment = load_deployment(MODELS)
    snap = ClusterSnapshot.from_json(DEVCLUSTER.read_text())
    # recorded: a one-minute reservation for root, in the future
    (recorded,) = parse_reservations((REC / "scontrol_show_reservation.txt").read_text(),
                                     "root", None)
    assert recorded.flags == ("IGNORE_JOBS", "SPEC_NODES")
    near = replace(recorded, start=snap.observed_at + 60, end=snap.observed_at + 120)
    policy = deployment.model_copy(update={"policy": deployment.policy.model_copy(
        update={"startup_time_s": 300.0})})  # a minute is less than start-up + a re-plan
    usable, warnings = usable_reservations(policy, replace(snap, reservations=(near,)))
    assert usable == [] and "reservation busy-record: ends in 2 min" in warnings[0]
    maint = reservation(snap, "v100-01", flags=("MAINT",))
    odd = reservation(snap, "v100-02", name="x;rm -rf")
    usable, warnings = usable_reservations(deployment, replace(snap, reservations=(maint, odd)))
    assert usable == [] and warnings == ["reservation x;rm -rf: its name is not a plain Slurm "
                                         "name; not planned"]


def test_quotas_limits_and_time_limits_follow_the_partition_into_its_reservation():
    deployment = load_deployment(MODELS)
    snap = ClusterSnapshot.from_json(DEVCLUSTER.read_text())
    res = reservation(snap, "v100-01", length=1800.0)
    snap = replace(snap, reservations=(res,))
    assert availability.time_limit_for(deployment, snap, ["v100@lab-res"]) == 1800 - 60
    assert availability.time_limit_for(deployment, snap, ["v100"]) == min(
        deployment.cluster.time_limit_s, snap.partition("v100").max_time_s)
    models, cluster, _ = Planner().inputs(PlanRequest.from_snapshot(deployment, snap))
    names = {p.name for p in cluster.partitions}
    assert "v100@lab-res" in names
    groups = cluster.environment_groups
    assert ("v100@lab-res",) in groups  # a pipeline is in the reservation or not at all
    (group,) = [g for g in cluster.node_groups if "v100-01" in g.nodes]
    assert group.nodes == ("v100-01",) and "@lab-res" in group.name
    assert all("v100-01" not in g.nodes for g in cluster.node_groups if g is not group)


def _spec(deployment, layout):
    return replica_spec(deployment, "qwen3-8b", "r1", "qwen3-8b.tp1.a100-36", layout,
                        api_key_file=None)


def test_submitit_and_the_hetjob_script_pass_the_reservation():
    deployment = load_deployment(MODELS)
    single = _spec(deployment, ReplicaLayout(1, (StageLayout("a100", "a100", 36, "lab-res"),),
                                             "auto"))
    assert submitit_parameters(single)["additional_parameters"]["reservation"] == "lab-res"
    plain = _spec(deployment, ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto"))
    assert "reservation" not in submitit_parameters(plain)["additional_parameters"]
    het = _spec(deployment, ReplicaLayout(1, (StageLayout("a100", "a100", 18, "lab-res"),
                                              StageLayout("v100", "v100", 18, "lab-res")),
                                          "half"))
    script = render_hetjob(het, Path("/tmp/spec.json"))
    assert script.count("#SBATCH --reservation=lab-res") == 2
    assert "--reservation" not in render_hetjob(
        _spec(deployment, ReplicaLayout(1, (StageLayout("a100", "a100", 18),
                                            StageLayout("v100", "v100", 18)), "half")),
        Path("/tmp/spec.json"))
    # the layout a plan row gives names the reservation per stage
    from coral_solver.types import Stage, Template

    template = Template("qwen3-8b", 1, (Stage("a100", 36),), 1.0)
    layout = layout_of(template, ("a100@lab-res",), "qwen3-8b")
    assert layout.stages[0].partition == "a100" and layout.stages[0].reservation == "lab-res"


def test_a_replica_on_a_reserved_node_is_not_on_an_unavailable_one():
    # Slurm flags a node of an active reservation RESERVED: our replica running there in the
    # reservation must not be replaced as if the node were draining (found on the local
    # cluster: it was, every cycle, and never became READY)
    from coral_hpc.reconcile.observe import on_unavailable, unavailable_places
    from coral_hpc.records import ReplicaRecord

    snap = full(ClusterSnapshot.from_json(DEVCLUSTER.read_text()), reserved="v100-02")
    partitions = [p.name for p in load_deployment(MODELS).cluster.partitions]
    record = ReplicaRecord(id="r1", model="qwen3-8b", template_id="t", layout=None,
                           partitions=("v100@lab-res",), throughput=1.0, cost_per_hour=1.0,
                           created_at=0.0, nodes="v100-02")
    assert not on_unavailable(record, unavailable_places(snap, partitions))
    # a drained partition still counts for a replica in one of its reservations
    drained = replace(snap, partitions=tuple(replace(p, state="drain") if p.name == "v100" else p
                                             for p in snap.partitions))
    assert on_unavailable(record, unavailable_places(drained, partitions))
    down = replace(snap, nodes=tuple(replace(n, state="down") if n.name == "v100-02" else n
                                     for n in snap.nodes))
    assert on_unavailable(record, unavailable_places(down, partitions))
