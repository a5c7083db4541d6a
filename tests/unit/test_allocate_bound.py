"""Stage 2's certified small restriction (coral_solver.allocate_bound): the dominance rule of the
per-model relaxation, widening when GPUs make a dominated template necessary, and the same
optimum as the whole model on random instances."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coral_solver.allocate import allocate
from coral_solver.allocate_bound import _columns, _front
from coral_solver.allocate_model import prepare
from coral_solver.check import check_plan
from coral_solver.joint import random_instance
from coral_solver.templates import build_library
from coral_solver.types import (
    Cluster,
    ModelSpec,
    NodeGroup,
    Partition,
    Policy,
    RunningReplica,
    Stage,
    Template,
)

POLICY = Policy(startup_penalty=3.0, mip_gap=0.0, time_limit_s=30)


def _t(gpu: str, throughput: float, role: str = "both", layers: int = 4) -> Template:
    return Template("m", 1, (Stage(gpu, layers),), throughput, role=role)


def _cluster(nodes: dict[str, int], prices: dict[str, float]) -> Cluster:
    groups = tuple(NodeGroup(f"g-{g}", g, 1, 40.0, tuple(f"{g}-{i}" for i in range(n)), (1,) * n)
                   for g, n in nodes.items())
    return Cluster(groups, (Partition("p", tuple(gr.name for gr in groups), prices=prices),))


def test_front_drops_only_dominated_templates_that_run_nowhere_and_keeps_ties_when_asked():
    model = ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=20.0)
    library = {"m": [_t("a", 10.0), _t("b", 10.0), _t("c", 10.0), _t("d", 30.0),
                     _t("c", 8.0, layers=5), _t("a", 4.0, role="prefill")]}
    # a and b cost 1, c costs 1.5 (dominated by a: same cover, dearer), d costs 4 and covers
    # min(30, 20) = 20 (not dominated); c-5 (cover 8, 1.5) is dominated; the prefill template
    # is judged among prefill templates only
    cluster = _cluster({"a": 2, "b": 2, "c": 2, "d": 2}, {"a": 1.0, "b": 1.0, "c": 1.5, "d": 4.0})
    data = prepare([model], library, cluster, POLICY)
    cols = _columns(data)
    members = np.arange(len(data.templates))
    ids = lambda idx: sorted(data.templates[j].id for j in idx)  # noqa: E731
    assert ids(_front(cols, members, keep_ties=True)) == sorted(
        ["m.tp1.a-4", "m.tp1.b-4", "m.tp1.d-4", "m.prefill.tp1.a-4"])
    assert ids(_front(cols, members, keep_ties=False)) == sorted(
        ["m.tp1.a-4", "m.tp1.d-4", "m.prefill.tp1.a-4"])
    # a running template is never dropped: its replicas are cheaper to keep than to start
    running = replace(cluster, running=(RunningReplica("m.tp1.c-4", ("p",), 1),))
    data = prepare([model], library, running, POLICY)
    assert "m.tp1.c-4" in ids(_front(_columns(data), np.arange(len(data.templates)), False))


def test_a_template_only_gpus_make_necessary_joins_the_restriction_and_the_plan_is_optimal():
    # X (a, cost 1, 10/s) dominates Y (b, cost 1.5, 10/s) in the relaxation, but there is one a
    # node: serving 20/s costs X + Y = 2.5, not Z (c, 20/s) = 4, which the front alone gives
    model = ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=20.0)
    library = {"m": [_t("a", 10.0), _t("b", 10.0), _t("c", 20.0)]}
    cluster = _cluster({"a": 1, "b": 2, "c": 2}, {"a": 1.0, "b": 1.5, "c": 4.0})
    policy = replace(POLICY, startup_penalty=0.0)
    plan = allocate([model], library, cluster, policy)
    full = allocate([model], library, cluster, replace(policy, prune=False))
    assert plan.cost_per_hour == pytest.approx(2.5) == full.cost_per_hour
    assert sorted(r.template.id for r in plan.rows) == ["m.tp1.a-4", "m.tp1.b-4"]
    assert plan.status == "optimal" and plan.gap <= 1e-9
    # solved on the certified restriction, widened once by the relaxation that had to use Y
    assert plan.phases["restricted_templates"] == 3.0
    assert check_plan(plan, [model], cluster, library) == []


@pytest.mark.parametrize("disaggregation", [None, "auto", "on"])
def test_same_optimum_as_the_whole_model_on_random_instances(disaggregation):
    certified = 0
    for seed in range(14):
        inst = random_instance(seed, disaggregation=disaggregation)
        policy = replace(inst.policy, startup_penalty=2.0, mip_gap=0.0, time_limit_s=30,
                         prune=True)
        library = build_library(inst.models, inst.cluster.gpu_types(), policy, inst.throughput,
                                use_cache=False)
        whole = allocate(inst.models, library, inst.cluster, replace(policy, prune=False))
        # what the whole model chose now runs, so the start-up penalty shapes the next plan
        running = tuple(RunningReplica(r.template.id, r.partitions, r.count) for r in whole.rows)
        for cluster in (inst.cluster, replace(inst.cluster, running=running[::2])):
            models = [replace(m, demand_rps=m.demand_rps * 0.8) for m in inst.models]
            reference = allocate(models, library, cluster, replace(policy, prune=False))
            fast = allocate(models, library, cluster, policy)
            assert fast.status == reference.status, seed
            assert fast.cost_per_hour == pytest.approx(reference.cost_per_hour, rel=1e-6), seed
            if "objective" in reference.phases:  # a plan at all: the same objective value
                assert fast.phases["objective"] == pytest.approx(
                    reference.phases["objective"], rel=1e-6), seed
            # the checker finds in it what it finds in the whole model's plan (an instance whose
            # min_replicas cannot be placed has no plan either way)
            assert check_plan(fast, models, cluster, library, inst.throughput) == check_plan(
                reference, models, cluster, library, inst.throughput), seed
            certified += "restricted_templates" in fast.phases
    assert certified >= 8  # the certified path, not only the fallback, was exercised
