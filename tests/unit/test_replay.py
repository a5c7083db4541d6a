"""The load-test helpers: trace slicing and fitting, the Poisson fallback, the SLO summary, and the
time-scale equivalence that lets an SLO check run a slow model's engine at ``--sim-speed k``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coral_hpc.loadtest.replay import ReplaySummary, RequestResult, Slo, percentile
from coral_hpc.loadtest.virtual import EngineShape, simulate
from coral_hpc.loadtest.workload import (
    Arrival,
    Mix,
    TraceRow,
    Workload,
    load_trace,
    poisson_workload,
    slice_workload,
    trace_dir,
    workload,
)
from coral_replica_sim.replica import EngineLimits, Layout

ROWS = [TraceRow(t=100.0 + 0.5 * i + (0.3 if i % 3 == 0 else 0.0), context_tokens=100 + 10 * i,
                 generated_tokens=20 + (i % 7)) for i in range(50)]


def test_slice_keeps_the_trace_shape_at_the_target_rate_and_mix():
    mix = Mix(400, 80)
    load = slice_workload(ROWS, mix, rate_rps=3.0, duration_s=4.0, start=5)
    assert len(load.arrivals) == 12 and load.rate_rps == pytest.approx(3.0)
    assert load.arrivals[0].at == 0.0 and load.arrivals[-1].at < 4.0
    # one stretch factor for every gap: the bursts of the trace survive
    picked = ROWS[5:18]
    stretch = 4.0 / (picked[-1].t - picked[0].t)
    for a, row in zip(load.arrivals, picked):
        assert a.at == pytest.approx((row.t - picked[0].t) * stretch)
    mean_in, mean_out = load.mean_mix()
    assert abs(mean_in - 400) <= 1 and abs(mean_out - 80) <= 1   # rounding only
    # the order of sizes is the trace's: longer prompts stay longer
    assert [a.prompt_tokens for a in load.arrivals] == sorted(a.prompt_tokens for a in load.arrivals)


def test_slice_clips_to_the_engine_context_and_counts_it():
    load = slice_workload(ROWS, Mix(3000, 500), rate_rps=2.0, duration_s=10.0, max_model_len=2048)
    assert load.clipped > 0
    assert all(a.prompt_tokens + a.max_tokens <= 2048 for a in load.arrivals)


def test_slice_refuses_what_the_trace_cannot_give():
    with pytest.raises(ValueError, match="needs 101"):
        slice_workload(ROWS, Mix(10, 10), rate_rps=10.0, duration_s=10.0)
    with pytest.raises(ValueError, match="must be > 0"):
        slice_workload(ROWS, Mix(10, 10), rate_rps=0.0, duration_s=10.0)


def test_poisson_fallback_has_the_rate_and_mix_and_is_reproducible():
    load = poisson_workload(Mix(500, 100), rate_rps=20.0, duration_s=200.0, seed=3)
    n = len(load.arrivals)
    assert abs(n - 4000) < 4 * 4000 ** 0.5                    # 4 standard deviations
    mean_in, mean_out = load.mean_mix()
    assert mean_in == pytest.approx(500, rel=0.06) and mean_out == pytest.approx(100, rel=0.06)
    assert load == poisson_workload(Mix(500, 100), rate_rps=20.0, duration_s=200.0, seed=3)
    assert "poisson" in load.source


def test_workload_falls_back_to_poisson_without_the_trace_folder(tmp_path):
    load = workload(Mix(100, 20), 2.0, 30.0, folder=tmp_path / "absent")
    assert load.source.startswith("poisson")


def test_malformed_trace_row_names_file_and_line(tmp_path):
    bad = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.99,many,109\n")
    with pytest.raises(ValueError, match=r"AzureLLMInferenceTrace_conv.csv:3"):
        load_trace("conv", tmp_path)


@pytest.mark.skipif(not (trace_dir() / "AzureLLMInferenceTrace_conv.csv").is_file(),
                    reason="the Azure LLM trace folder (../shared/data/traces) is absent")
def test_the_real_conversation_trace_reads_as_its_readme_says():
    rows = load_trace("conv")
    assert len(rows) == 19366
    assert rows[0].context_tokens == 374 and rows[0].generated_tokens == 44
    span_min = (rows[-1].t - rows[0].t) / 60
    assert 57 < span_min < 59
    assert sum(r.context_tokens for r in rows) / len(rows) == pytest.approx(1155, abs=1)


def _result(ttft, tpot, error=None, missed=None):
    return RequestResult(at=0, prompt_tokens=1, max_tokens=2, send_lag_s=0, ttft_s=ttft,
                         tpot_s=tpot, error=error, missed=missed)


def test_summary_counts_only_requests_meeting_both_slos():
    slo = Slo(1.0, 0.1)
    results = (_result(0.5, 0.05), _result(1.5, 0.05), _result(0.5, 0.2), _result(0.5, None),
               _result(None, None, error="HTTP 503"), _result(None, None, missed="ttft"))
    summary = ReplaySummary("m", slo, "test", 1.0, 6.0, results)
    assert summary.within_slo == 2 and summary.fraction_within_slo == pytest.approx(2 / 6)
    assert summary.errors == 1 and summary.abandoned == 1
    assert summary.quantiles("ttft_s")["p50"] == pytest.approx(0.5)
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5) and percentile([], 90) is None


def test_sim_speed_is_the_same_system_on_a_faster_clock():
    """An engine at --sim-speed k fed the same requests k times faster delivers every token at
    exactly 1/k of the time: the within-SLO set under SLO/k is the same (the scheduler orders
    events; it never reads the clock)."""
    layout = Layout("llama-3.1-70b", 1, ("a100-80g", "a100-80g", "v100"), (37, 37, 6))
    base = poisson_workload(Mix(1024, 64), rate_rps=1.0, duration_s=20.0, seed=7)
    k = 4.0
    fast = Workload(tuple(replace(a, at=a.at / k) for a in base.arrivals), base.duration_s / k,
                    base.source)
    slow_results = simulate(EngineShape(layout), base)
    fast_results = simulate(EngineShape(layout, EngineLimits(speed=k)), fast)
    assert len(slow_results) == len(fast_results) > 10
    for slow, quick in zip(slow_results, fast_results):
        assert quick.ttft_s == pytest.approx(slow.ttft_s / k, rel=1e-9, abs=1e-12)
        assert quick.e2e_s == pytest.approx(slow.e2e_s / k, rel=1e-9, abs=1e-12)
    slo = Slo(2.0, 0.15)
    fast_slo = Slo(slo.ttft_s / k, slo.tpot_s / k)
    assert [r.within(slo) for r in slow_results] == [r.within(fast_slo) for r in fast_results]


def test_virtual_engine_queues_when_the_kv_cache_is_full():
    """Sanity of the virtual driver: requests that cannot all fit wait, and are served in order."""
    layout = Layout("qwen3-8b", 1, ("a100",), (36,))
    burst = Workload(tuple(Arrival(0.0, 20000, 200) for _ in range(6)), 1.0, "burst")
    results = simulate(EngineShape(layout), burst)
    assert all(r.completion_tokens == 200 for r in results)
    ttfts = [r.ttft_s for r in results]
    assert ttfts == sorted(ttfts) and ttfts[-1] > 2 * ttfts[0]
