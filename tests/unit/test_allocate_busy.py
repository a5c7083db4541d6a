"""Stage 2 on a busy cluster: GPUs Slurm gives only after a wait are priced by that wait, models
with nothing within the horizon get one replica queued where Slurm starts it first, and site
limits (MaxTRES per job, MaxNodes, MaxJobs/MaxSubmit, engine environments) bind and are named."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from coral_solver.allocate import allocate
from coral_solver.check import check_plan
from coral_solver.joint import TableThroughput
from coral_solver.templates import build_library
from coral_solver.types import (
    Cluster,
    JobLimits,
    ModelSpec,
    NodeGroup,
    Partition,
    Policy,
    QueueOption,
)

EXACT = Policy(
    n_max=2,
    rho=math.inf,
    max_tp=2,
    startup_penalty=0.0,
    mip_gap=0.0,
    time_limit_s=30,
    replan_interval_s=60.0,
    max_queue_wait_s=1800.0,
)


def _tm() -> TableThroughput:
    # one model of 2 layers: tp1 on one node serves 10/s, tp2 20/s; pipelines over two nodes
    # (pp2) serve 12/s per tp1 replica on either type
    return TableThroughput(
        {"m": 2},
        {"m": 10.0},
        {"m": [1, 2]},
        {
            ("m", "a", 1, 1): [10.0, 10.0],
            ("m", "a", 2, 1): [20.0, 20.0],
            ("m", "a", 1, 2): [12.0, 12.0],
            ("m", "b", 1, 2): [12.0, 12.0],
            ("m", "b", 1, 1): [10.0, 10.0],
        },
    )


def _single_tm() -> TableThroughput:
    # one model of 2 layers served by one GPU of type a: 10/s
    return TableThroughput({"m": 2}, {"m": 10.0}, {"m": [1]}, {("m", "a", 1, 1): [10.0, 10.0]})


def _library(models, cluster, tm, policy=EXACT):
    return build_library(models, cluster.gpu_types(), policy, tm, use_cache=False)


def test_a_node_free_now_beats_a_cheaper_one_free_only_after_a_long_wait():
    tm = _single_tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=5.0)]
    # "now" is dearer (2.0/h) than "later" (1.0/h), which Slurm gives only in 30 minutes:
    # a 30-minute wait at a 60 s re-plan interval costs 30 x 1.0 more, so "now" wins
    cluster = Cluster(
        (
            NodeGroup("now", "a", 1, 40, ("n1",), (1,)),
            NodeGroup("later", "a", 1, 40, ("n2",), (1,), wait_s=1800.0),
        ),
        (
            Partition("dear", ("now",), prices={"a": 2.0}),
            Partition("cheap", ("later",), prices={"a": 1.0}),
        ),
    )
    library = _library(models, cluster, tm)
    plan = allocate(models, library, cluster, EXACT)
    assert [(r.partitions, r.waits) for r in plan.rows] == [(("dear",), (0.0,))]
    # with a short wait, the cheaper node is worth waiting for: 1.0 + 1 min × 1.0/60 s < 2.0
    short = replace(
        cluster, node_groups=(cluster.node_groups[0], replace(cluster.node_groups[1], wait_s=60.0))
    )
    plan = allocate(models, library, short, EXACT)
    assert [(r.partitions, r.waits) for r in plan.rows] == [(("cheap",), (60.0,))]
    assert plan.rows[0].wait_s == 60.0
    assert check_plan(plan, models, short, library, tm) == []


def test_capacity_within_the_horizon_serves_demand_the_idle_gpus_cannot():
    tm = _single_tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=15.0)]
    cluster = Cluster(
        (
            NodeGroup("now", "a", 1, 40, ("n1",), (1,)),
            NodeGroup("later", "a", 1, 40, ("n2",), (1,), wait_s=600.0),
        ),
        (Partition("p", ("now", "later"), prices={"a": 1.0}),),
    )
    plan = allocate(models, _library(models, cluster, tm), cluster, EXACT)
    assert plan.status == "optimal"
    assert sorted(w for r in plan.rows for w in r.waits) == [0.0, 600.0]
    assert plan.served["m"] == 15.0


def test_with_nothing_free_each_model_gets_its_best_replica_queued_where_slurm_starts_first():
    tm = _tm()
    models = [
        ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=5.0),
        ModelSpec("idle", "m", 100, 100, 1.0, 0.1, demand_rps=0.0),
    ]
    tm.layer_count["idle"] = 2
    tm.weights_gb["idle"] = 10.0
    tm.tps["idle"] = [1]
    tm.table[("idle", "a", 1, 1)] = [10.0, 10.0]
    busy = (NodeGroup("a1", "a", 2, 40, ("n1",), (0,)), NodeGroup("a2", "a", 2, 40, ("n2",), (0,)))
    cluster = Cluster(
        busy,
        (Partition("p1", ("a1",), prices={"a": 1.0}), Partition("p2", ("a2",), prices={"a": 1.0})),
        queue_options=(
            QueueOption("p1", "a", 1, 1, 7200.0, ("n1",)),
            QueueOption("p2", "a", 1, 1, 3600.0, ("n2",)),
            QueueOption("p1", "a", 2, 1, 9000.0, ("n1",)),
        ),
    )
    library = _library(models, cluster, tm)
    plan = allocate(models, library, cluster, EXACT)
    assert plan.rows == ()
    # the model with demand is queued once, on the shape Slurm starts first (p2, in 1 h);
    # the model without demand or min_replicas is not
    assert [(q.model, q.partitions, q.count, q.nodes, q.waits) for q in plan.queued] == [
        ("m", ("p2",), 1, (("n2",),), (3600.0,))
    ]
    assert plan.capacity["m"] == 0.0 and plan.cost_per_hour == 0.0
    assert any("queued on p2, expected in 60 min" in b for b in plan.binding)
    assert check_plan(plan, models, cluster, library, tm) == []


def test_a_queued_replica_respects_quotas_and_is_checked():
    from coral_solver.types import Quota

    tm = _tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=5.0)]
    cluster = Cluster(
        (NodeGroup("a1", "a", 2, 40, ("n1",), (0,)),),
        (Partition("p1", ("a1",), prices={"a": 1.0}),),
        quotas=(Quota("q", 1),),
        queue_options=(
            QueueOption("p1", "a", 2, 1, 100.0, ("n1",)),
            QueueOption("p1", "a", 1, 1, 5000.0, ("n1",)),
        ),
    )
    library = _library(models, cluster, tm)
    plan = allocate(models, library, cluster, EXACT)
    # the tp2 shape starts sooner but needs 2 GPUs against a 1-GPU quota: the tp1 one is queued
    assert [(q.template.tp, q.waits) for q in plan.queued] == [(1, (5000.0,))]
    assert check_plan(plan, models, cluster, library, tm) == []
    # the checker refuses a queued replica for a model that already has replicas
    idle = replace(cluster, node_groups=(NodeGroup("a1", "a", 2, 40, ("n1",), (2,)),))
    served = allocate(models, library, idle, EXACT)
    assert served.rows and not served.queued
    both = replace(served, queued=plan.queued)
    assert any("already has replicas" in p for p in check_plan(both, models, idle, library, tm))
    excluded = replace(
        cluster, excluded_stages=frozenset({(plan.queued[0].template.id, "a", "p1")})
    )
    assert any("excluded" in p for p in check_plan(plan, models, excluded, library, tm))


def test_max_tres_per_job_and_max_jobs_bind_and_are_named():
    tm = _tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=40.0)]
    cluster = Cluster(
        (NodeGroup("a", "a", 2, 40, ("n1", "n2", "n3"), (2, 2, 2)),),
        (Partition("p", ("a",), prices={"a": 1.0}),),
    )
    library = _library(models, cluster, tm)
    free = allocate(models, library, cluster, EXACT)
    # 2 × tp2 and 4 × tp1 both cost 4/h: either optimum may come back
    assert free.served["m"] == 40.0 and free.cost_per_hour == pytest.approx(4.0)
    # MaxTRES gres/gpu=1 per job: only tp1 replicas; MaxJobs 2 with one other job: 1 replica
    limited = replace(cluster, job_limits=JobLimits(max_gpus_per_job=1, max_jobs=2, other_jobs=1))
    plan = allocate(models, library, limited, EXACT)
    assert [(r.template.tp, r.count) for r in plan.rows] == [(1, 1)]
    assert plan.status == "scarce"
    assert any(b.startswith("site limit MaxTRES gres/gpu=1 per job") for b in plan.binding)
    assert any(b.startswith("site limit MaxJobs=2") for b in plan.binding)
    # MaxSubmit caps pending + running the same way
    submit = replace(cluster, job_limits=JobLimits(max_submit=3))
    plan = allocate(models, library, submit, EXACT)
    assert plan.replicas() <= 3 and any("MaxSubmit=3" in b for b in plan.binding)


def test_partition_max_nodes_keeps_pipelines_out_and_environments_keep_stages_together():
    tm = _tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=24.0, max_replicas=2)]
    # only one node of each type, so serving 24/s in 2 replicas needs 12/s pipelines (a+b)
    groups = (
        NodeGroup("a", "a", 1, 40, ("na1", "na2"), (1, 1)),
        NodeGroup("b", "b", 1, 40, ("nb1", "nb2"), (1, 1)),
    )
    parts = (Partition("pa", ("a",), prices={"a": 1.0}), Partition("pb", ("b",), prices={"b": 1.0}))
    cluster = Cluster(groups, parts)
    library = _library(models, cluster, tm)
    assert any(t.heterogeneous for t in library["m"])
    plan = allocate(models, library, cluster, EXACT)
    assert plan.served["m"] == 24.0 and all(r.template.pp == 2 for r in plan.rows)
    # pa and pb run different engine environments: no pipeline may span them
    apart = replace(cluster, environment_groups=(("pa",), ("pb",)))
    plan = allocate(models, library, apart, EXACT)
    assert all(len(set(r.partitions)) == 1 for r in plan.rows)
    assert not any(r.template.heterogeneous for r in plan.rows)
    assert any("engine environments" in b for b in plan.binding)
    # MaxNodes=1 on both partitions: no two-node replica at all
    single = replace(cluster, job_limits=JobLimits(max_nodes_by_partition={"pa": 1, "pb": 1}))
    plan = allocate(models, library, single, EXACT)
    assert all(r.template.pp == 1 for r in plan.rows)
    assert any("MaxNodes=1 per job" in b for b in plan.binding)


def test_a_replica_already_waiting_moves_only_for_a_clearly_sooner_shape():
    tm = _tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=5.0)]
    busy = (NodeGroup("a1", "a", 2, 40, ("n1",), (0,)), NodeGroup("a2", "a", 2, 40, ("n2",), (0,)))
    parts = (
        Partition("p1", ("a1",), prices={"a": 1.0}),
        Partition("p2", ("a2",), prices={"a": 1.0}),
    )
    library = _library(models, Cluster(busy, parts), tm)
    # ours waits on p1 (Slurm: 62 min); a new job on p2 would start in 60: not worth moving
    held = QueueOption("p1", "a", 1, 1, 3720.0, held=True)
    near = Cluster(busy, parts, queue_options=(held, QueueOption("p2", "a", 1, 1, 3600.0)))
    assert [q.partitions for q in allocate(models, library, near, EXACT).queued] == [("p1",)]
    # p2 in 20 minutes: clearly sooner, the queued replica moves there
    far = Cluster(busy, parts, queue_options=(held, QueueOption("p2", "a", 1, 1, 1200.0)))
    assert [q.partitions for q in allocate(models, library, far, EXACT).queued] == [("p2",)]


def test_min_replicas_that_cannot_start_now_are_queued_instead_of_no_plan():
    tm = _tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=0.0, min_replicas=2)]
    one_free = (
        NodeGroup("a1", "a", 2, 40, ("n1",), (1,)),
        NodeGroup("a2", "a", 2, 40, ("n2",), (0,)),
    )
    parts = (
        Partition("p1", ("a1",), prices={"a": 1.0}),
        Partition("p2", ("a2",), prices={"a": 1.0}),
    )
    cluster = Cluster(
        one_free, parts, queue_options=(QueueOption("p2", "a", 1, 1, 4000.0, ("n2",)),)
    )
    library = _library(models, cluster, tm)
    plan = allocate(models, library, cluster, EXACT)
    # one replica starts now on n1; the second is queued where Slurm starts it
    assert plan.status == "scarce" and plan.replicas("m") == 1
    assert [(q.partitions, q.count) for q in plan.queued] == [(("p2",), 1)]
    assert any("min_replicas 2 cannot all start now (1 can)" in b for b in plan.binding)
    assert check_plan(plan, models, cluster, library, tm) == []
    # without any Slurm estimate the checker still says min_replicas is not met
    bare = allocate(models, library, replace(cluster, queue_options=()), EXACT)
    assert any("min_replicas 2" in p for p in check_plan(bare, models, cluster, library, tm))


def test_min_replicas_queues_only_what_the_started_replicas_leave_missing():
    # two replicas start now in ONE plan row (count 2) on n1; min_replicas 4 asks for two more,
    # not three: the queue counted plan rows instead of replicas, and the checker then refused
    # the plan ("already has replicas"), so serve retried for ever
    tm = _single_tm()
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=0.0, min_replicas=4)]
    nodes = (
        NodeGroup("a1", "a", 2, 40, ("n1",), (2,)),
        NodeGroup("a2", "a", 2, 40, ("n2",), (0,)),
    )
    parts = (
        Partition("p1", ("a1",), prices={"a": 1.0}),
        Partition("p2", ("a2",), prices={"a": 1.0}),
    )
    cluster = Cluster(nodes, parts, queue_options=(QueueOption("p2", "a", 1, 1, 4000.0, ("n2",)),))
    library = _library(models, cluster, tm)
    plan = allocate(models, library, cluster, EXACT)
    assert [row.count for row in plan.rows] == [2]
    assert sum(q.count for q in plan.queued) == 2
    assert check_plan(plan, models, cluster, library, tm) == []
