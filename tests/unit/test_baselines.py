"""Baselines: valid plans on the same inputs, never cheaper than Coral's optimum when they meet
demand (Coral searches a superset of their plans)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coral_solver import baselines
from coral_solver.allocate import allocate
from coral_solver.check import check_plan
from coral_solver.joint import random_instance
from coral_solver.templates import build_library


@pytest.mark.parametrize("seed", [0, 2, 5, 7, 10, 11])
def test_baselines_are_valid_and_never_beat_the_optimum(seed):
    inst = random_instance(seed, scarce=False)
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    coral = allocate(inst.models, lib, inst.cluster, inst.policy)
    for name in ("homo", "melange", "cauchy", "paper_homo", "cauchy_adapted"):
        plan = getattr(baselines, name)(inst.models, lib, inst.cluster, inst.policy)
        assert check_plan(plan, inst.models, inst.cluster, lib, inst.throughput) == [], name
        assert all(not r.template.heterogeneous for r in plan.rows), name
        if name == "homo":  # one GPU type per model
            for model in inst.models:
                types = {r.template.stages[0].gpu_type for r in plan.rows if r.model == model.name}
                assert len(types) <= 1
        if name == "paper_homo":  # one template (strategy) per model
            for model in inst.models:
                assert len({r.template.id for r in plan.rows if r.model == model.name}) <= 1
        met = all(plan.served[m.name] >= m.demand_rps * (1 - 1e-9) for m in inst.models)
        if met and coral.status == "optimal":
            assert coral.cost_per_hour <= plan.cost_per_hour * (1 + 1e-9), name
        # served never above what Coral's fairness-first plan could serve in total, when scarce
        if coral.status == "scarce":
            assert min(plan.served[m.name] / m.demand_rps for m in inst.models if m.demand_rps) \
                <= coral.phases["min_served_fraction"] + 1e-9


def test_subtract_takes_placed_gpus_off_nodes_and_quotas():
    inst = random_instance(3)
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    plan = allocate(inst.models, lib, inst.cluster, inst.policy)
    left = baselines.subtract(inst.cluster, plan)
    used = sum(r.count * r.template.gpus for r in plan.rows)
    before = sum(sum(g.free) for g in inst.cluster.node_groups)
    after = sum(sum(g.free) for g in left.node_groups)
    assert before - after == used
    again = replace(plan, rows=())
    assert baselines.subtract(inst.cluster, again).node_groups == inst.cluster.node_groups


def test_paper_homo_keeps_one_strategy_while_cauchy_falls_back_when_it_runs_out():
    inst = random_instance(2, scarce=True)  # one model, too few GPUs of its best type
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    homo = baselines.paper_homo(inst.models, lib, inst.cluster, inst.policy)
    cauchy = baselines.cauchy(inst.models, lib, inst.cluster, inst.policy)
    assert check_plan(homo, inst.models, inst.cluster, lib, inst.throughput) == []
    (model,) = inst.models
    ids = {r.template.id for r in homo.rows}
    assert len(ids) == 1
    # Cauchy's first choice is Homo's strategy; it adds others once that fits no more
    assert cauchy.rows[0].template.id in ids and len({r.template.id for r in cauchy.rows}) > 1
    assert cauchy.served[model.name] > homo.served[model.name]
    # the adaptation without phase roles is Cauchy itself
    adapted = baselines.cauchy_adapted(inst.models, lib, inst.cluster, inst.policy)
    assert adapted.rows == cauchy.rows


def test_paper_homo_strategy_groups_interchangeable_placements():
    inst = random_instance(2, scarce=True)
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    # everything one strategy: Homo may then use every homogeneous template, like Cauchy
    same = baselines.paper_homo(inst.models, lib, inst.cluster, inst.policy, strategy=lambda t: 0)
    cauchy = baselines.cauchy(inst.models, lib, inst.cluster, inst.policy)
    assert same.rows == cauchy.rows


def test_cauchy_adapted_sizes_each_phase_on_its_own_homogeneous_templates():
    inst = random_instance(3, scarce=False, disaggregation="on")
    # room for every phase: each node group four times over
    roomy = replace(inst.cluster, node_groups=tuple(
        replace(g, nodes=tuple(f"{n}-{k}" for k in range(4) for n in g.nodes),
                free=tuple(g.gpus_per_node for _ in range(4) for _ in g.nodes))
        for g in inst.cluster.node_groups), quotas=())
    inst = replace(inst, cluster=roomy)
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    plan = baselines.cauchy_adapted(inst.models, lib, inst.cluster, inst.policy)
    assert check_plan(plan, inst.models, inst.cluster, lib, inst.throughput) == []
    assert plan.rows and all(not r.template.heterogeneous for r in plan.rows)
    for model in inst.models:
        rows = [r for r in plan.rows if r.model == model.name]
        capacity = {}
        for role in ("prefill", "decode"):
            # each phase alone covers the demand (a request needs one of each), unless the
            # model's replica bound stops it
            capacity[role] = sum(r.count * r.throughput for r in rows if r.role == role)
            count = sum(r.count for r in rows if r.role == role)
            assert capacity[role] >= model.demand_rps * (1 - 1e-9) or count == model.max_replicas
        assert plan.served[model.name] == pytest.approx(
            min(model.demand_rps, capacity["prefill"], capacity["decode"]))
    # the aggregated baselines never use a phase template
    for name in ("homo", "melange", "cauchy", "paper_homo"):
        other = getattr(baselines, name)(inst.models, lib, inst.cluster, inst.policy)
        assert all(r.role == "both" for r in other.rows), name
