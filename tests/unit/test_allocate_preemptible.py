"""Stage 2 with preemptible capacity: a partition whose jobs may be preempted serves a model only
beside one of its replicas that is not (never its only one), a multi-stage replica is on one
side or the other, a queued replica never goes there, and the plan states the risk."""

from __future__ import annotations

import math
from dataclasses import replace

from coral_solver.allocate import allocate
from coral_solver.check import check_plan
from coral_solver.joint import TableThroughput
from coral_solver.templates import build_library
from coral_solver.types import Cluster, ModelSpec, NodeGroup, Partition, Policy, QueueOption

EXACT = Policy(n_max=2, rho=math.inf, max_tp=1, startup_penalty=0.0, mip_gap=0.0,
               time_limit_s=30, replan_interval_s=60.0, max_queue_wait_s=1800.0)


def _tm() -> TableThroughput:
    # one model of 2 layers: one GPU of type a serves 10/s; a two-node pipeline 12/s
    return TableThroughput({"m": 2}, {"m": 10.0}, {"m": [1]},
                           {("m", "a", 1, 1): [10.0, 10.0], ("m", "a", 1, 2): [12.0, 12.0]})


def _cluster(safe_free: int, scav_preemptible: bool = True) -> Cluster:
    """``safe``: one node, dear; ``scav``: four nodes of one GPU at a fifth of the price."""
    return Cluster(
        node_groups=(NodeGroup("safe-g", "a", 1, 80.0, ("s1",), (safe_free,)),
                     NodeGroup("scav-g", "a", 1, 80.0, ("p1", "p2", "p3", "p4"), (1, 1, 1, 1))),
        partitions=(Partition("safe", ("safe-g",), prices={"a": 5.0}),
                    Partition("scav", ("scav-g",), prices={"a": 1.0},
                              preemptible=scav_preemptible)),
    )


def _plan(cluster, demand=30.0, min_replicas=0):
    model = ModelSpec("m", "m", 100, 10, 1.0, 0.1, demand_rps=demand, min_replicas=min_replicas)
    library = build_library([model], cluster.gpu_types(), EXACT, _tm(), use_cache=False)
    return [model], library, allocate([model], library, cluster, EXACT)


def _replicas(plan, partition):
    return sum(r.count for r in plan.rows if partition in r.partitions)


def test_preemptible_capacity_serves_beside_a_replica_that_is_not():
    models, library, plan = _plan(_cluster(safe_free=1))
    assert plan.served["m"] >= 30.0 - 1e-9
    assert _replicas(plan, "safe") == 1 and _replicas(plan, "scav") == 2
    assert check_plan(plan, models, _cluster(1), library) == []
    assert any(b.startswith("risk: 2 replica(s) of m on preemptible scav") for b in plan.binding)
    # the same partition not preemptible: all three go to the cheaper one
    _, _, cheap = _plan(_cluster(safe_free=1, scav_preemptible=False))
    assert _replicas(cheap, "scav") == 3 and _replicas(cheap, "safe") == 0
    assert cheap.cost_per_hour < plan.cost_per_hour


def test_never_a_models_only_replica():
    models, library, plan = _plan(_cluster(safe_free=0))
    assert plan.replicas("m") == 0 and plan.status == "scarce"
    assert "model m: preemptible partitions unused: never a model's only replica" in plan.binding
    # a plan with only preemptible replicas is what the checker refuses
    _, _, cheap = _plan(_cluster(safe_free=0, scav_preemptible=False))
    assert _replicas(cheap, "scav") == 3
    problems = check_plan(cheap, models, _cluster(0), library)
    assert any("on preemptible partitions and none elsewhere" in p for p in problems), problems


def test_min_replicas_are_not_met_on_preemptible_capacity_alone():
    _, _, plan = _plan(_cluster(safe_free=0), demand=0.0, min_replicas=1)
    assert plan.status == "infeasible"


def test_a_pipeline_never_mixes_preemptible_and_other_stages():
    # pipelines only (no single-GPU template fits): one safe node and preemptible nodes give
    # no two-node pipeline with a stage on each side
    tm = TableThroughput({"m": 2}, {"m": 10.0}, {"m": [1]}, {("m", "a", 1, 2): [12.0, 12.0]})
    cluster = _cluster(safe_free=1)
    model = ModelSpec("m", "m", 100, 10, 1.0, 0.1, demand_rps=10.0)
    library = build_library([model], cluster.gpu_types(), replace(EXACT, n_max=2), tm,
                            use_cache=False)
    library = {"m": [t for t in library["m"] if t.pp == 2]}
    plan = allocate([model], library, cluster, EXACT)
    for row in plan.rows:
        assert len({p == "scav" for p in row.partitions}) == 1, row.partitions
    assert plan.replicas("m") == 0  # safe has one node: no pipeline there, none on scav alone


def test_a_queued_replica_never_waits_on_a_preemptible_partition():
    cluster = replace(_cluster(safe_free=0), queue_options=(
        QueueOption("scav", "a", 1, 1, 60.0), QueueOption("safe", "a", 1, 1, 3600.0)))
    models, library, plan = _plan(cluster)
    assert [r.partitions for r in plan.queued] == [("safe",)]
    assert check_plan(plan, models, cluster, library) == []
