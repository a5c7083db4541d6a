"""Stage 2's certified small restriction (coral_solver.allocate_bound): the dominance rule of the
per-model relaxation, widening when GPUs make a dominated template necessary, and the same
optimum as the whole model on random instances."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from coral_solver.allocate import allocate
from coral_solver.allocate_bound import _columns, _front
from coral_solver.allocate_data import prepare
from coral_solver.check import check_plan
from coral_solver.joint import random_instance
from coral_solver.templates import build_library
from coral_solver.types import (
    Cluster,
    ModelSpec,
    NodeGroup,
    Partition,
    Policy,
    Quota,
    RunningReplica,
    Stage,
    Template,
)

POLICY = Policy(startup_penalty=3.0, mip_gap=0.0, time_limit_s=30)


@pytest.fixture(autouse=True)
def _certified_path_at_any_size(monkeypatch):
    """These instances are small enough to check against the whole model, far below the
    library size at which allocate takes the certified path by itself: take it always."""
    from coral_solver import allocate as allocate_module

    monkeypatch.setattr(allocate_module, "PER_MODEL_SHORTCUTS_MIN_TEMPLATES", 0)


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


def _two_models_one_weak_relaxation():
    """Model m: X (a, 1/h) and Y (b, 1.5/h) serve 10/s each, Z (c, 2.6/h) 20/s; demand 20/s.
    A quota of one GPU on a leaves X once, and a quota of none on b no Y at all, so the optimum
    is Z (2.6): the relaxation, which knows no quotas, bounds it at 2 (X twice) and, with an
    excluded template forced in, at 2.5 (X + Y). Model n runs alone on d."""
    m = ModelSpec("m", "m", 100, 100, 1.0, 0.1, demand_rps=20.0)
    n = ModelSpec("n", "n", 100, 100, 1.0, 0.1, demand_rps=10.0)
    library = {"m": [_t("a", 10.0), _t("b", 10.0), _t("c", 20.0)],
               "n": [Template("n", 1, (Stage("d", 4),), 10.0)]}
    cluster = _cluster({"a": 2, "b": 2, "c": 2, "d": 2},
                       {"a": 1.0, "b": 1.5, "c": 2.6, "d": 1.0})
    quotas = (Quota("a-one", 1, gpu_types=("a",)), Quota("b-none", 0, gpu_types=("b",)))
    return [m, n], library, replace(cluster, quotas=quotas)


def _proven_flags(monkeypatch) -> list:
    from coral_solver import allocate as allocate_module

    seen: list = []
    inner = allocate_module.certified_restriction

    def recording(*args, **kwargs):
        found = inner(*args, **kwargs)
        seen.append(None if found is None else found.proven)
        return found

    monkeypatch.setattr(allocate_module, "certified_restriction", recording)
    return seen


def test_each_models_own_optimum_proves_a_restricted_plan_the_relaxation_could_not(monkeypatch):
    from coral_solver import allocate_bound

    models, library, cluster = _two_models_one_weak_relaxation()
    policy = replace(POLICY, startup_penalty=0.0)
    whole = allocate(models, library, cluster, replace(policy, prune=False))
    assert whole.cost_per_hour == pytest.approx(3.6)  # Z for m, one d for n
    # one round: the restriction's plan (Z) is found, but the relaxation's bound stays at 2.5
    monkeypatch.setattr(allocate_bound, "MAX_ROUNDS", 1)
    seen = _proven_flags(monkeypatch)
    plan = allocate(models, library, cluster, policy)
    assert seen[0] is False  # the whole problem's restriction: not proven by the relaxation
    assert plan.status == "optimal" and plan.gap <= 1e-9
    assert plan.cost_per_hour == pytest.approx(3.6)
    # proven by the models' own optima, on the restriction: the whole model was never built
    assert "restricted_templates" in plan.phases
    assert plan.phases["bound"] == pytest.approx(3.6)
    assert check_plan(plan, models, cluster, library) == []


@pytest.mark.parametrize("seed, disaggregation", [(10, None), (18, "auto")])
def test_an_unproven_restricted_plan_starts_the_whole_model_at_the_same_optimum(
        monkeypatch, seed, disaggregation):
    from coral_solver import allocate as allocate_module
    from coral_solver.allocate_bound import certified_restriction, lift_point
    from coral_solver.allocate_model import build_model

    inst = random_instance(seed, disaggregation=disaggregation)
    policy = replace(inst.policy, startup_penalty=2.0, mip_gap=0.0, time_limit_s=30, prune=True)
    library = build_library(inst.models, inst.cluster.gpu_types(), policy, inst.throughput,
                            use_cache=False)
    # the restricted plan, lifted into the whole model: a plan of it, at the same cost
    data = prepare(inst.models, library, inst.cluster, policy)
    restricted = certified_restriction(inst.models, library, inst.cluster, policy, data,
                                       float("inf"))
    assert restricted is not None and not restricted.proven
    sm = build_model(data)
    point = lift_point(restricted.sm, restricted.result.x, sm)
    point[sm.demand["phi"]] = 1.0
    lower = np.asarray(sm.lm.col_lower, float)
    lower[sm.demand["phi"]] = 1.0
    assert allocate_module.feasible(sm.lm, point, lower, np.asarray(sm.lm.col_upper, float))
    assert float(sm.cost @ point) == pytest.approx(restricted.result.objective, rel=1e-9)
    assert restricted.bound <= restricted.result.objective + 1e-9
    # started from it, and from nothing (as before): the whole model's optimum either way
    seen = _proven_flags(monkeypatch)
    warm = allocate(inst.models, library, inst.cluster, policy)
    assert seen[0] is False
    monkeypatch.setattr(allocate_module, "START_FROM_RESTRICTED", False)
    cold = allocate(inst.models, library, inst.cluster, policy)
    reference = allocate(inst.models, library, inst.cluster, replace(policy, prune=False))
    assert warm.status == cold.status == reference.status == "optimal"
    assert warm.phases["objective"] == pytest.approx(reference.phases["objective"], rel=1e-6)
    assert cold.phases["objective"] == pytest.approx(reference.phases["objective"], rel=1e-6)
    assert check_plan(warm, inst.models, inst.cluster, library, inst.throughput) == []


def test_a_library_of_few_templates_per_model_is_solved_whole(monkeypatch):
    from coral_solver import allocate as allocate_module

    monkeypatch.setattr(allocate_module, "PER_MODEL_SHORTCUTS_MIN_TEMPLATES", 100)
    models, library, cluster = _two_models_one_weak_relaxation()
    policy = replace(POLICY, startup_penalty=0.0)
    seen = _proven_flags(monkeypatch)
    plan = allocate(models, library, cluster, policy)
    assert seen == []  # 4 templates for 2 models: the relaxations would cost more than they save
    assert "restricted_templates" not in plan.phases
    assert plan.status == "optimal" and plan.cost_per_hour == pytest.approx(3.6)
