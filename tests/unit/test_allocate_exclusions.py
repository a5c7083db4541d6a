"""Stage 2 keeps excluded (template, GPU type, partition) stages out of plans: the daemon's
pending-timeout and refused-shape exclusions, which name one template in one partition."""

from __future__ import annotations

import math
from dataclasses import replace

from coral_solver.allocate import allocate
from coral_solver.check import check_plan
from coral_solver.joint import TableThroughput
from coral_solver.templates import build_library
from coral_solver.types import Cluster, ModelSpec, NodeGroup, Partition, Policy

EXACT = Policy(n_max=1, rho=math.inf, max_tp=1, startup_penalty=0.0, mip_gap=0.0, time_limit_s=30)


def _setup():
    # one GPU type in two partitions: "cheap" and "dear"; one template serves 10/s
    tm = TableThroughput({"m": 1}, {"m": 10.0}, {"m": [1]},
                         {("m", "a", 1, 1): [10.0]})
    models = [ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=5.0)]
    cluster = Cluster(
        (NodeGroup("a", "a", 4, 40, ("n1", "n2"), (4, 4)),),
        (Partition("cheap", ("a",), prices={"a": 1.0}),
         Partition("dear", ("a",), prices={"a": 3.0})),
    )
    library = build_library(models, cluster.gpu_types(), EXACT, tm, use_cache=False)
    return models, cluster, library, tm


def test_without_exclusions_the_cheap_partition_wins():
    models, cluster, library, _ = _setup()
    plan = allocate(models, library, cluster, EXACT)
    assert [(r.partitions, r.count) for r in plan.rows] == [(("cheap",), 1)]


def test_an_excluded_stage_moves_the_template_to_another_partition():
    models, cluster, library, tm = _setup()
    (template,) = library["m"]
    excluded = replace(cluster, excluded_stages=frozenset({(template.id, "a", "cheap")}))
    plan = allocate(models, library, excluded, EXACT)
    assert plan.status == "optimal"
    assert [(r.template.id, r.partitions, r.count) for r in plan.rows] == [
        (template.id, ("dear",), 1)]
    assert plan.cost_per_hour == 3.0
    assert check_plan(plan, models, excluded, library, tm) == []


def test_excluding_every_partition_leaves_the_model_unserved():
    models, cluster, library, _ = _setup()
    (template,) = library["m"]
    everywhere = replace(cluster, excluded_stages=frozenset(
        {(template.id, "a", "cheap"), (template.id, "a", "dear")}))
    plan = allocate(models, library, everywhere, EXACT)
    assert plan.replicas() == 0 and plan.status in ("scarce", "infeasible")


def test_the_checker_rejects_a_plan_using_an_excluded_stage():
    models, cluster, library, tm = _setup()
    (template,) = library["m"]
    plan = allocate(models, library, cluster, EXACT)  # uses "cheap"
    excluded = replace(cluster, excluded_stages=frozenset({(template.id, "a", "cheap")}))
    problems = check_plan(plan, models, excluded, library, tm)
    assert any("excluded" in p for p in problems)
