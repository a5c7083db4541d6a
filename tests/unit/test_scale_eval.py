"""The scale run's parts (bench/scale_eval): a model's day keeps its rate, follows its trace from
its phase and meters the same requests it serves; the site is 1,000 nodes in overlapping
partitions as the daemon's planner reads them; warm-up requests load a served window but are
not booked."""

from __future__ import annotations

import numpy as np
import pytest

from bench.paper_eval.evaluate import serve_window
from bench.paper_eval.workload import ModelWorkload
from bench.scale_eval import day as D
from bench.scale_eval import run as R
from bench.scale_eval import site as S
from coral_hpc.demand import deployment_demand
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.types import SIGNAL_LEAD_S, SIGNAL_RESOLUTION_S
from coral_solver import catalog
from coral_solver.types import ModelSpec, Plan, PlanRow, Stage, Template


def _trace(first_half_prompt: int = 100, second_half_prompt: int = 5000) -> D.TraceRows:
    """An hour-long trace: 3 requests/s in its first half, 1 in its second; prompts differ."""
    t = np.concatenate([np.arange(0.0, 1800.0, 1 / 3), np.arange(1800.0, 3600.0, 1.0)])
    prompt = np.where(t < 1800.0, first_half_prompt, second_half_prompt)
    return D.TraceRows("synthetic", t, prompt, np.full(len(t), 20))


def test_a_day_keeps_the_models_rate_and_meters_the_requests_it_serves():
    day = D.ModelDay(_trace(), phase=0.0, mean_rps=2.0, index=3, seed=7, max_context=131072)
    assert day.counts.sum() / D.DAY_S == pytest.approx(2.0, rel=0.02)
    for minute in (0, 61, 1439):
        at, prompt, output = day.requests(minute * 60.0, (minute + 1) * 60.0)
        assert len(at) == day.counts[minute]
        assert prompt.sum() == day.prompt_sums[minute] and output.sum() == day.output_sums[minute]
        assert np.all((at >= minute * 60.0) & (at < (minute + 1) * 60.0))
    # a window across minute edges holds exactly the requests arriving in it
    at, _, _ = day.requests(90.0, 200.0)
    whole = np.concatenate([day.requests(m * 60.0, (m + 1) * 60.0)[0] for m in range(1, 4)])
    assert np.array_equal(at, whole[(whole >= 90.0) & (whole < 200.0)])


def test_the_day_is_the_trace_stretched_from_the_models_phase():
    early = D.ModelDay(_trace(), 0.0, 2.0, 0, 0, 131072)
    late = D.ModelDay(_trace(), 0.5, 2.0, 0, 0, 131072)
    by_hour = early.hourly(early.counts)
    assert by_hour[1:11].sum() > 2.5 * by_hour[13:23].sum()  # 3 req/s, then 1, stretched x24
    assert late.hourly(late.counts)[13:23].sum() > 2.5 * late.hourly(late.counts)[1:11].sum()
    # lengths come from the trace rows of the hour, clipped to the context
    _, prompt, _ = early.requests(3 * 3600.0, 3 * 3600.0 + 600.0)
    assert set(prompt) == {100}
    clipped = D.ModelDay(_trace(), 0.0, 2.0, 0, 0, max_context=1000)
    _, prompt, output = clipped.requests(18 * 3600.0, 18 * 3600.0 + 600.0)
    assert prompt.max() == 999 and (prompt + output).max() <= 1000


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


def _one_replica_plan() -> tuple[Plan, ModelSpec]:
    template = Template("m", 1, (Stage("a100-80g", 32),), throughput=5.0)
    row = PlanRow(template, ("p",), 1, 1.0)
    plan = Plan((row,), {"m": 5.0}, {"m": 5.0}, {"m": 5.0}, 1.0, "optimal", 0.0, 0.0)
    return plan, ModelSpec("m", "llama-3.1-8b", 2000, 50, 1.0, 0.05, demand_rps=5.0)


def test_warm_up_requests_load_the_replica_but_are_not_booked():
    plan, spec = _one_replica_plan()
    window = np.linspace(100.0, 110.0, 20, endpoint=False)
    burst = np.linspace(95.0, 100.0, 200, endpoint=False)  # a warm-up burst before the window

    def load(at):
        n = len(at)
        return ModelWorkload("m", at, np.full(n, 2000), np.full(n, 50), "test", (2000, 50))

    alone = serve_window(plan, spec, load(window), 100.0, 10.0)
    loaded = serve_window(plan, spec, load(np.concatenate([burst, window])), 100.0, 10.0,
                          warmup_s=5.0)
    assert alone.requests == loaded.requests == 20
    assert alone.output_tokens == loaded.output_tokens == 20 * 50
    assert alone.good == pytest.approx(20)
    assert loaded.good < alone.good  # the burst still queues ahead of the window's requests
