"""The paper evaluation's parts (bench/paper_eval): regions stay apart, workloads keep their rate
and mix, the replica simulation serves every role, availability follows the reference plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.paper_eval import replica, setups
from bench.paper_eval.evaluate import (
    RegionalThroughput,
    _deal,
    availability,
    cluster_for,
    library_for,
    model_specs,
)
from bench.paper_eval.workload import model_workload
from coral_replica_sim.replica import Layout
from coral_solver.types import Policy

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


class _Load:
    def __init__(self, mix):
        self._mix = mix

    def mean_mix(self):
        return self._mix


def test_no_template_spans_two_regions():
    setup = setups.SETUPS[0]
    loads = {m: _Load((512, 128)) for m in setup.setting.models}
    models = model_specs(setup, loads, {m: 1.0 for m in loads})[:1]
    library = library_for(models, setup, Policy(n_max=3), RegionalThroughput())
    templates = [t for ts in library.values() for t in ts]
    assert any(t.heterogeneous for t in templates) and any(t.pp > 1 for t in templates)
    for t in templates:
        assert len({s.gpu_type.split("@")[1] for s in t.stages}) == 1, t.id
    assert {s.gpu_type.split("@")[1] for t in templates for s in t.stages} == set(setups.REGIONS)


@needs_traces
def test_workload_keeps_the_rate_and_draws_lengths_from_the_trace_window():
    load = model_workload("m", "azure-code", 0.0, 10.0, seed=1, folder=TRACES)
    assert len(load.at) / 1800 == pytest.approx(10.0, rel=0.05)
    assert (load.at[1:] >= load.at[:-1]).all() and load.at[-1] < 1800
    assert load.mean_mix()[1] < 60 < load.mean_mix()[0]  # code: long prompts, short outputs
    # another seed: other arrivals, same planner mix (fixed by the trace window)
    other = model_workload("m", "azure-code", 0.0, 10.0, seed=2, folder=TRACES)
    assert other.mean_mix() == load.mean_mix() and len(other.at) != len(load.at)


def test_a_decode_replica_with_the_prompt_kv_answers_sooner_than_one_that_prefills():
    layout = Layout("llama-3.1-8b", 1, ("a100-80g",), (32,))
    full = replica.serve(layout, [replica.Request(0.0, 4000, 16)])[0]
    loaded = replica.serve(layout, [replica.Request(0.0, 4000, 16, external=3999)])[0]
    assert full.tokens == loaded.tokens == 16
    assert loaded.first_s < full.first_s / 5
    # the decode steps themselves take about as long
    assert (loaded.last_s - loaded.first_s) == pytest.approx(full.last_s - full.first_s, rel=0.1)
    prefill_only = replica.serve(layout, [replica.Request(0.0, 4000, 1)])[0]
    assert prefill_only.tokens == 1 and prefill_only.first_s == pytest.approx(full.first_s)


def test_deal_follows_the_weights_evenly():
    picks = _deal([3.0, 1.0], 8)
    assert [len(p) for p in picks] == [6, 2]
    assert sorted(i for p in picks for i in p) == list(range(8))


def test_availability_is_the_reference_plans_use_plus_margin_and_a_node_per_type():
    setup = setups.SETUPS[1]  # core / default / scarce: 25 % above
    loads = {m: _Load((512, 128)) for m in setup.setting.models}
    models = model_specs(setup, loads, {m: 2.0 for m in loads})
    library = library_for(models, setup, Policy(n_max=2), RegionalThroughput())
    unlimited = cluster_for(
        setup, {f"{g}@{r}": 64 for g in setup.setting.gpu_types for r in setups.REGIONS}
    )
    from coral_solver.allocate import allocate

    plan = allocate(models, library, unlimited, Policy(n_max=2))
    gpus = availability(setup, plan)
    used: dict[str, int] = {}
    for row in plan.rows:
        for stage in row.template.stages:
            base = stage.gpu_type.split("@")[0]
            used[base] = used.get(base, 0) + row.count * row.template.tp
    for g in setup.setting.gpu_types:
        per_region = [gpus[f"{g}@{r}"] for r in setups.REGIONS]
        assert sum(per_region) >= 1.25 * used.get(g, 0) + 16 - 1e-9
        assert max(per_region) - min(per_region) == 0
