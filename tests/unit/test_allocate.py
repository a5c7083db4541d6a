"""Stage 2: packing, demand, quotas, replica bounds, start-up penalty, scarce phases, backends."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from coral_solver.allocate import SolverUnavailable, allocate
from coral_solver.check import check_plan
from coral_solver.joint import TableThroughput, random_instance
from coral_solver.templates import build_library
from coral_solver.types import (
    Billing,
    Cluster,
    ModelSpec,
    NodeGroup,
    Partition,
    Policy,
    Quota,
    RunningReplica,
)

EXACT = Policy(n_max=3, rho=math.inf, max_tp=4, startup_penalty=0.0, mip_gap=0.0, time_limit_s=30)


def _tm(models: dict[str, int], speeds: dict[tuple[str, str, int], float]) -> TableThroughput:
    """Throughput = speed / layers held; speeds per (model, gpu, tp); one stage count table each."""
    table = {}
    for (model, gpu, tp), speed in speeds.items():
        for stages in range(1, 4):
            table[(model, gpu, tp, stages)] = [speed / l for l in range(1, models[model] + 1)]
    return TableThroughput(dict(models), {m: 10.0 for m in models},
                           {m: sorted({tp for (mm, _, tp) in speeds if mm == m}) for m in models},
                           table)


def _model(name, demand, **kw):
    return ModelSpec(name, name, 100, 100, 1.0, 0.1, demand_rps=demand, **kw)


def _solve(models, cluster, tm, policy=EXACT, **kw):
    lib = build_library(models, cluster.gpu_types(), policy, tm, use_cache=False)
    plan = allocate(models, lib, cluster, policy, **kw)
    assert check_plan(plan, models, cluster, lib, tm) == []
    return plan, lib


def test_a_tp4_stage_needs_four_free_gpus_on_one_node():
    tm = _tm({"m": 4}, {("m", "a", 4): 40.0})  # only TP 4 exists: one stage holds 4 layers → 10/s
    models = [_model("m", 5.0)]
    split = Cluster((NodeGroup("a", "a", 4, 40, ("n1", "n2"), (2, 2)),),
                    (Partition("p", ("a",), prices={"a": 1.0}),))
    plan, _ = _solve(models, split, tm)
    assert plan.status == "scarce" and plan.replicas() == 0 and plan.served["m"] == 0
    whole = replace(split, node_groups=(NodeGroup("a", "a", 4, 40, ("n1", "n2"), (4, 0)),))
    plan, _ = _solve(models, whole, tm)
    assert plan.status == "optimal" and plan.replicas() == 1
    assert plan.rows[0].nodes == (("n1",),)
    assert plan.cost_per_hour == pytest.approx(4.0)


def test_demand_met_at_least_cost_mixing_gpu_types():
    # cheap slow "b" and dear fast "a": demand 25 → 2×a (20/s, cost 6) + 1×b? compare exhaustively
    tm = _tm({"m": 2}, {("m", "a", 1): 20.0, ("m", "b", 1): 8.0})
    models = [_model("m", 25.0)]
    cluster = Cluster((NodeGroup("a", "a", 2, 40, ("a1",), (2,)),
                       NodeGroup("b", "b", 4, 16, ("b1",), (4,))),
                      (Partition("p", ("a", "b"), prices={"a": 3.0, "b": 1.0}),))
    plan, lib = _solve(models, cluster, tm)
    assert plan.status == "optimal"
    assert plan.capacity["m"] >= 25.0
    # brute force over replica counts of every template: nothing cheaper fits
    best = math.inf
    templates = lib["m"]
    import itertools

    for counts in itertools.product(range(5), repeat=len(templates)):
        use = {"a": 0, "b": 0}
        for t, c in zip(templates, counts):
            for s in t.stages:
                use[s.gpu_type] += c
        if use["a"] > 2 or use["b"] > 4:
            continue
        if sum(t.throughput * c for t, c in zip(templates, counts)) >= 25.0 - 1e-9:
            best = min(best, sum(c * sum({"a": 3.0, "b": 1.0}[s.gpu_type] for s in t.stages)
                                 for t, c in zip(templates, counts)))
    assert plan.cost_per_hour == pytest.approx(best)


def test_quota_and_max_replicas_bind_and_are_reported():
    tm = _tm({"m": 2}, {("m", "a", 1): 10.0})
    models = [_model("m", 35.0, max_replicas=3)]
    cluster = Cluster((NodeGroup("a", "a", 8, 40, ("a1",), (8,)),),
                      (Partition("p", ("a",), prices={"a": 1.0}),), (Quota("qos", 2),))
    plan, _ = _solve(models, cluster, tm)
    assert plan.status == "scarce" and plan.replicas() == 2
    assert any("quota qos" in b for b in plan.binding)
    plan, _ = _solve(models, replace(cluster, quotas=()), tm)
    assert plan.replicas() == 3 and any("max_replicas" in b for b in plan.binding)


def test_min_replicas_are_kept_even_without_demand():
    tm = _tm({"m": 2}, {("m", "a", 1): 10.0})
    models = [_model("m", 0.0, min_replicas=2)]
    cluster = Cluster((NodeGroup("a", "a", 8, 40, ("a1",), (8,)),),
                      (Partition("p", ("a",), prices={"a": 1.0}),))
    plan, _ = _solve(models, cluster, tm)
    assert plan.replicas("m") == 2


def test_startup_penalty_keeps_running_replicas_unless_moving_saves_enough():
    tm = _tm({"m": 2}, {("m", "a", 1): 20.0, ("m", "b", 1): 20.0})  # 10/s on one GPU
    models = [_model("m", 10.0)]
    cluster = Cluster((NodeGroup("a", "a", 1, 40, ("a1",), (1,)),
                       NodeGroup("b", "b", 1, 40, ("b1",), (1,))),
                      (Partition("p", ("a", "b"), prices={"a": 1.2, "b": 1.0}),))
    lib = build_library(models, cluster.gpu_types(), EXACT, tm, use_cache=False)
    on_a = next(t for t in lib["m"] if t.stages[0].gpu_type == "a")
    running = replace(cluster, running=(RunningReplica(on_a.id, ("p",), 1),))
    stay = allocate(models, lib, running, replace(EXACT, startup_penalty=3.0))
    assert [r.template.id for r in stay.rows] == [on_a.id]
    move = allocate(models, lib, running, replace(EXACT, startup_penalty=0.0))
    assert [r.template.stages[0].gpu_type for r in move.rows] == ["b"]


def test_scarce_demand_is_shared_fairly_then_by_priority():
    tm = _tm({"x": 1, "y": 1}, {("x", "a", 1): 10.0, ("y", "a", 1): 10.0})
    models = [_model("x", 40.0, priority=5.0), _model("y", 40.0)]
    cluster = Cluster((NodeGroup("a", "a", 4, 40, ("a1",), (4,)),),
                      (Partition("p", ("a",), prices={"a": 1.0}),))
    plan, _ = _solve(models, cluster, tm)
    assert plan.status == "scarce"
    # 4 GPUs, 10/s each: max-min gives each model 2 replicas (no starving y for x's priority)
    assert plan.replicas("x") == 2 and plan.replicas("y") == 2
    assert plan.phases["min_served_fraction"] == pytest.approx(0.5)
    # with 5 GPUs max-min still guarantees 2 each; the spare one goes by priority to x
    cluster5 = replace(cluster, node_groups=(NodeGroup("a", "a", 5, 40, ("a1",), (5,)),))
    plan, _ = _solve(models, cluster5, tm)
    assert plan.replicas("x") == 3 and plan.replicas("y") == 2


def test_a_heterogeneous_replica_may_span_partitions_and_billing_prices_it():
    tm = TableThroughput({"m": 4}, {"m": 10.0}, {"m": [1]}, {
        ("m", "a", 1, 2): [10.0, 5.0, 0.0, 0.0], ("m", "b", 1, 2): [10.0, 5.0, 0.0, 0.0],
        ("m", "a", 1, 1): [0.0] * 4, ("m", "b", 1, 1): [0.0] * 4,
        ("m", "a", 1, 3): [0.0] * 4, ("m", "b", 1, 3): [0.0] * 4,
    })
    models = [_model("m", 5.0)]
    billing = Billing(cpu=0.5, mem_gb=0.0, gpu=1.0, gpu_by_type={"a": 2.0}, cpus_per_gpu=4)
    cluster = Cluster((NodeGroup("a", "a", 1, 40, ("a1",), (1,)),
                       NodeGroup("b", "b", 1, 40, ("b1",), (1,))),
                      (Partition("pa", ("a",), billing=billing), Partition("pb", ("b",), billing=billing)))
    plan, _ = _solve(models, cluster, tm)
    assert plan.status == "optimal" and len(plan.rows) == 1
    row = plan.rows[0]
    assert row.template.heterogeneous and sorted(row.partitions) == ["pa", "pb"]
    # a: 0.5×4 + 1 + 2 = 5 per GPU-hour; b: 0.5×4 + 1 = 3
    assert row.cost_per_hour == pytest.approx(8.0)


@pytest.mark.parametrize("seed,solver", [(0, "pyomo:appsi_highs"), (1, "pyomo:highs"),
                                         (2, "pyomo:appsi_highs"), (3, "pyomo:highs"),
                                         (8, "pyomo:appsi_highs"), (10, "pyomo:highs")])
def test_pyomo_and_matrix_paths_and_the_column_restriction_reach_the_same_optimum(seed, solver):
    """``policy.solver: pyomo:<name>`` (Pyomo's APPSI and its newer HiGHS interface, in turn)
    and the default ``highs`` matrix path: the same objective, phase optima and counts."""
    inst = random_instance(seed)
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    full = allocate(inst.models, lib, inst.cluster, inst.policy)
    pyomo = allocate(inst.models, lib, inst.cluster, inst.policy, backend=solver)
    pruned = allocate(inst.models, lib, inst.cluster, replace(inst.policy, prune=True))
    for plan in (full, pyomo, pruned):
        assert check_plan(plan, inst.models, inst.cluster, lib, inst.throughput) == []
        assert plan.status == full.status
        assert plan.cost_per_hour == pytest.approx(full.cost_per_hour, rel=1e-6)
        for key, value in full.phases.items():
            assert plan.phases[key] == pytest.approx(value, rel=1e-6)
    assert {m.name: pyomo.replicas(m.name) for m in inst.models} == {
        m.name: full.replicas(m.name) for m in inst.models}


def test_a_scarce_instance_gives_pyomo_the_same_lexicographic_optimum():
    """The three phases (served fraction, weighted served, cost) through Pyomo too: the
    instance of the fair-share test above, 5 GPUs for 8 wanted."""
    tm = _tm({"x": 1, "y": 1}, {("x", "a", 1): 10.0, ("y", "a", 1): 10.0})
    models = [_model("x", 40.0, priority=5.0), _model("y", 40.0)]
    cluster = Cluster((NodeGroup("a", "a", 5, 40, ("a1",), (5,)),),
                      (Partition("p", ("a",), prices={"a": 1.0}),))
    highs, _ = _solve(models, cluster, tm)
    pyomo, _ = _solve(models, cluster, tm, backend="pyomo:appsi_highs")
    assert pyomo.status == highs.status == "scarce"
    assert pyomo.cost_per_hour == pytest.approx(highs.cost_per_hour, rel=1e-6)
    assert (pyomo.replicas("x"), pyomo.replicas("y")) == (highs.replicas("x"),
                                                          highs.replicas("y")) == (3, 2)
    for key, value in highs.phases.items():
        assert pyomo.phases[key] == pytest.approx(value, rel=1e-6)


def test_a_pyomo_solver_this_host_lacks_is_named_with_how_to_install_it():
    inst = random_instance(0)
    import pyomo.environ as pyo

    lacking = [("no_such_solver", "pyomo help --solvers")]
    if not pyo.SolverFactory("gurobi").available(exception_flag=False):
        lacking.append(("gurobi", "gurobipy"))
    for name, hint in lacking:
        with pytest.raises(SolverUnavailable) as info:
            allocate(inst.models, {}, inst.cluster, inst.policy, backend=f"pyomo:{name}")
        assert f"pyomo:{name}" in str(info.value) and hint in str(info.value)
        assert "INSTALL.md" in str(info.value)
    with pytest.raises(ValueError, match="'highs' or 'pyomo:<name>'"):
        allocate(inst.models, {}, inst.cluster, inst.policy, backend="gurobi")


def test_checker_rejects_overpacked_nodes_wrong_costs_and_unmet_demand():
    tm = _tm({"m": 2}, {("m", "a", 2): 10.0})
    models = [_model("m", 10.0)]
    cluster = Cluster((NodeGroup("a", "a", 4, 40, ("a1", "a2"), (2, 2)),),
                      (Partition("p", ("a",), prices={"a": 1.0}),))
    plan, lib = _solve(models, cluster, tm)
    row = plan.rows[0]
    crowded = replace(plan, rows=(replace(row, count=2, nodes=(("a1",), ("a1",))),),
                      cost_per_hour=2 * row.cost_per_hour, capacity={"m": 2 * row.throughput})
    assert any("node a1" in p for p in check_plan(crowded, models, cluster, lib))
    cheap = replace(plan, rows=(replace(row, cost_per_hour=0.5),))
    assert any("cost_per_hour" in p for p in check_plan(cheap, models, cluster, lib))
    empty = replace(plan, rows=(), capacity={"m": 0.0}, served={"m": 0.0}, cost_per_hour=0.0)
    assert any("not met" in p for p in check_plan(empty, models, cluster, lib))
    elsewhere = replace(plan, rows=(replace(row, partitions=("q",)),))
    assert any("partition q" in p for p in check_plan(elsewhere, models, cluster, lib))
