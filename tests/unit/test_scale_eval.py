"""The scale run's parts (bench/scale_eval): the site is 1,000 nodes in overlapping partitions
as the daemon's planner reads them, its models drawn seeded, its rotation overhead and sampled
hours as the run counts them."""

from __future__ import annotations

import pytest

from bench.scale_eval import run as R
from bench.scale_eval import site as S
from coral_hpc.demand import deployment_demand
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.types import SIGNAL_LEAD_S, SIGNAL_RESOLUTION_S
from coral_solver import catalog


def test_models_are_drawn_seeded_with_their_rates_and_fitting_traces():
    models = S.draw_models(50, 500.0, seed=0)
    assert models == S.draw_models(50, 500.0, seed=0)
    assert len({m.name for m in models}) == 50
    assert sum(m.mean_rps for m in models) == pytest.approx(500.0)
    assert {m.size for m in models} == {"small", "medium", "large"}
    for m in models:
        if m.trace == "mooncake":  # 126k-token prompts: only 128k-context architectures
            assert catalog.model_arch(m.arch).max_context >= S.LONG_CONTEXT
    with pytest.raises(ValueError):
        S.draw_models(0, 1.0)


def test_the_planner_reads_the_site_as_1000_nodes_in_overlapping_partitions():
    models = S.draw_models(3, 10.0)
    deployment = S.deployment(models, {m.name: (1024, 128) for m in models},
                              {"replan_interval_s": 900})
    request = PlanRequest(deployment, S.snapshot(), deployment_demand(deployment, []), (),
                          frozenset(), frozenset(), 180.0)
    _, cluster, policy = Planner().inputs(request)
    nodes = [n for g in cluster.node_groups for n in g.nodes]
    assert len(nodes) == len(set(nodes)) == S.total_nodes() == 1000
    assert sum(sum(g.free) for g in cluster.node_groups) == S.total_gpus()
    parts = {p.name: p for p in cluster.partitions}
    groups = {g.name: g for g in cluster.node_groups}
    h100 = {n for name in parts["h100"].node_groups for n in groups[name].nodes}
    gpu = {n for name in parts["gpu"].node_groups for n in groups[name].nodes}
    assert h100 < gpu and len(h100) == 120  # the catch-all partition overlaps the typed ones
    assert parts["small"].gpu_hour_cost("l4") == pytest.approx(S.PRICES["l4"])
    assert policy.startup_penalty == pytest.approx(180.0 / 900)


def test_rotation_overhead_is_a_successors_overlap_per_usable_life():
    models = S.draw_models(1, 1.0)
    deployment = S.deployment(models, {models[0].name: (1024, 128)}, {"replan_interval_s": 900})
    # 4 h limit less Slurm's signal lead (and the minute it may come early) and the 900 s
    # walltime lead, plus the successor's 180 s start-up; the overlap is that start-up plus the
    # 12 s drain grace (2 polls of 6 s)
    life = 4 * 3600 - SIGNAL_LEAD_S - SIGNAL_RESOLUTION_S - 900 + 180
    assert R.rotation_overhead(deployment) == pytest.approx((180 + 12) / life)


def test_hours_between_samples_take_the_nearest_sample_round_the_day():
    assert R.nearest(23, [0, 12]) == 0 and R.nearest(5, [0, 12]) == 0
    assert R.nearest(7, [0, 12]) == 12 and R.nearest(6, [0, 12]) == 0  # a tie: the earlier
