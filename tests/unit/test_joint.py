"""The decomposition is lossless: two-stage optimum == joint MILP optimum on random instances.

Gap 0, no column restriction, no ρ filter (ρ = ∞): Stage 1 keeps only dominated templates out,
which cannot change the optimum. Scarce instances compare every lexicographic phase.
"""

from __future__ import annotations

import time

import pytest

from solver.allocate import allocate
from solver.check import check_plan
from solver.joint import random_instance, solve_joint
from solver.templates import build_library

SEEDS = range(50)


@pytest.mark.slow
def test_two_stage_optimum_equals_joint_optimum_on_50_random_instances():
    began = time.perf_counter()
    layouts = scarce = compared = 0
    for seed in SEEDS:
        inst = random_instance(seed)
        library = build_library(inst.models, inst.cluster.gpu_types(), inst.policy,
                                inst.throughput, use_cache=False)
        plan = allocate(inst.models, library, inst.cluster, inst.policy)
        joint = solve_joint(inst)
        where = f"seed {seed}: two-stage {plan.status} {plan.phases}, joint {joint.status} {joint.phases}"
        assert plan.status == joint.status, where
        if plan.status == "infeasible":  # min_replicas cannot be placed: both must say so
            continue
        compared += 1
        assert check_plan(plan, inst.models, inst.cluster, library, inst.throughput) == [], where
        assert plan.cost_per_hour == pytest.approx(joint.cost_per_hour, rel=1e-6, abs=1e-9), where
        for phase in ("min_served_fraction", "weighted_served"):
            if phase in joint.phases:
                assert plan.phases[phase] == pytest.approx(joint.phases[phase], rel=1e-6), where
        for name, served in joint.served.items():
            if plan.status == "optimal":
                assert plan.served[name] == pytest.approx(served, rel=1e-6), where
        scarce += plan.status == "scarce"
        layouts += any(r.template.pp > 1 or r.template.heterogeneous for r in plan.rows)
    elapsed = time.perf_counter() - began
    print(f"\n{compared} instances compared ({scarce} scarce); a multi-stage or heterogeneous "
          f"template in the optimum of {layouts}; {elapsed:.1f} s")
    assert compared >= 45 and scarce >= 5
    assert layouts >= 10, f"only {layouts} optima used a multi-stage or heterogeneous template"
