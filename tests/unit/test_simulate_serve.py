"""A model's requests served in virtual time (coral_hpc.simulate.serve, which `coral-hpc
simulate`, the paper comparison and the virtual-time day serve with): workloads drawn from a
real trace keep their rate and lengths, a decode replica given the prompt's KV answers sooner,
routing follows the weights, and warm-up requests load a window without being booked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coral_hpc.simulate.serve import Served, _deal, serve_replica, serve_window
from coral_hpc.simulate.traces import ModelWorkload, load_rows, scaled_workload
from coral_replica_sim.replica import Layout, Request
from coral_solver.types import ModelSpec, Plan, PlanRow, Stage, Template

_ROOT = Path(__file__).resolve().parents[2]
TRACES = next(
    (
        base / "shared/data/traces/azure-llm-2023"
        for base in (_ROOT.parent, _ROOT.parents[1])
        if (base / "shared/data/traces/azure-llm-2023").is_dir()
    ),
    _ROOT / "absent",
)
needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(),
    reason="the Azure traces are not beside this checkout (../shared/data/traces)",
)


@needs_traces
def test_workload_keeps_the_rate_and_draws_lengths_from_the_trace_window():
    rows = load_rows(TRACES / "AzureLLMInferenceTrace_code.csv")
    load = scaled_workload("m", rows, 0.0, 10.0, seed=1, run_s=1800.0)
    assert len(load.at) / 1800 == pytest.approx(10.0, rel=0.05)
    assert (load.at[1:] >= load.at[:-1]).all() and load.at[-1] < 1800
    assert load.mean_mix()[1] < 60 < load.mean_mix()[0]  # code: long prompts, short outputs
    # another seed: other arrivals, same planner mix (fixed by the trace window)
    other = scaled_workload("m", rows, 0.0, 10.0, seed=2, run_s=1800.0)
    assert other.mean_mix() == load.mean_mix() and len(other.at) != len(load.at)


def test_a_decode_replica_with_the_prompt_kv_answers_sooner_than_one_that_prefills():
    layout = Layout("llama-3.1-8b", 1, ("a100-80g",), (32,))
    full = serve_replica(layout, [Request(0.0, 4000, 16)])[0]
    loaded = serve_replica(layout, [Request(0.0, 4000, 16, external=3999)])[0]
    assert full.tokens == loaded.tokens == 16
    assert loaded.first_s < full.first_s / 5
    # the decode steps themselves take about as long
    assert (loaded.last_s - loaded.first_s) == pytest.approx(full.last_s - full.first_s, rel=0.1)
    prefill_only = serve_replica(layout, [Request(0.0, 4000, 1)])[0]
    assert prefill_only.tokens == 1 and prefill_only.first_s == pytest.approx(full.first_s)


def test_deal_follows_the_weights_evenly():
    picks = _deal([3.0, 1.0], 8)
    assert [len(p) for p in picks] == [6, 2]
    assert sorted(i for p in picks for i in p) == list(range(8))


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


def test_served_books_which_objective_a_request_missed():
    model = ModelSpec("m", "coral-tiny-llama", 100, 10, 1.0, 0.05, demand_rps=1.0)
    out = Served(requests=4)
    out.count(0.5, 0.04, 10, model, 1.0)  # within both
    out.count(2.0, 0.04, 10, model, 1.0)  # over the TTFT only
    out.count(0.5, 0.09, 10, model, 1.0)  # over the TPOT only
    out.count(2.0, 0.09, 10, model, 2.0)  # over both, standing for two requests
    assert out.good == 1.0
    assert out.missed_ttft == 3.0
    assert out.missed_tpot == 3.0
