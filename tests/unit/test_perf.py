"""Shape tests of the performance model: units, rules and monotonicity that Stage 1 relies on."""

from __future__ import annotations

import itertools
import math

import pytest

from coral_solver import perf
from coral_solver.catalog import gpu_spec, load_gpus, model_arch
from coral_solver.perf import (
    Mix,
    Slo,
    engine_dtype,
    is_calibrated,
    kv_capacity_tokens,
    stage_throughput,
    step_latency_s,
    valid_tp_degrees,
)

SLO = Slo(ttft_s=2.0, tpot_s=0.08)
MIX = Mix(input_tokens=512, output_tokens=128)


@pytest.fixture(autouse=True)
def _shipped_profiles():
    perf.configure()
    yield
    perf.configure()


def test_phi4_tp_degrees_follow_head_counts():
    assert valid_tp_degrees(model_arch("phi-4"), 16) == [1, 2, 5, 10]
    assert valid_tp_degrees(model_arch("llama-3.1-8b"), 8) == [1, 2, 4, 8]
    assert valid_tp_degrees(model_arch("qwen3-235b-a22b"), 16) == [1, 2, 4, 8, 16]


def test_dtype_rules():
    assert engine_dtype(model_arch("llama-3.1-8b"), gpu_spec("v100")) == "half"
    assert engine_dtype(model_arch("llama-3.1-8b"), gpu_spec("t4")) == "half"
    assert engine_dtype(model_arch("llama-3.1-8b"), gpu_spec("a100")) == "bfloat16"
    assert engine_dtype(model_arch("gpt-oss-20b"), gpu_spec("v100")) is None
    assert engine_dtype(model_arch("gpt-oss-20b"), gpu_spec("t4")) is None
    assert engine_dtype(model_arch("gpt-oss-20b"), gpu_spec("a100")) == "bfloat16"
    assert engine_dtype(model_arch("mixtral-8x7b"), gpu_spec("v100-32g")) is None


def test_gpt_oss_on_v100_serves_nothing():
    arch = model_arch("gpt-oss-20b")
    assert stage_throughput(arch, gpu_spec("v100-32g"), 4, arch.layers, 1, SLO, MIX) == 0.0


def test_70b_does_not_fit_one_v100_but_fits_two_h200():
    arch = model_arch("llama-3.1-70b")
    assert kv_capacity_tokens(arch, gpu_spec("v100"), 1, arch.layers) == 0
    assert stage_throughput(arch, gpu_spec("v100"), 1, arch.layers, 1, SLO, MIX) == 0.0
    # 141 GB of weights exceed 0.9 x 141 GB of one H200, not two
    assert kv_capacity_tokens(arch, gpu_spec("h200"), 1, arch.layers) == 0
    assert kv_capacity_tokens(arch, gpu_spec("h200"), 2, arch.layers) > 100_000
    # four of its 80 layers do fit one V100 (Helix ran Llama-2-70B that way)
    assert kv_capacity_tokens(arch, gpu_spec("v100"), 1, 4) > 0


def test_kv_capacity_in_the_right_range_for_8b_on_a100_80g():
    arch = model_arch("llama-3.1-8b")
    tokens = kv_capacity_tokens(arch, gpu_spec("a100-80g"), 1, arch.layers)
    # (0.9 x 80 - reserve - 16 GB weights) / 128 KiB per token: between 380k and 430k tokens
    assert 380_000 < tokens < 430_000
    # tp=2 halves the weight shard and the per-token KV: more than twice the tokens
    assert kv_capacity_tokens(arch, gpu_spec("a100-80g"), 2, arch.layers) > 2 * tokens


@pytest.mark.parametrize("model, gpu, tp", [
    ("llama-3.1-70b", "a100-80g", 4), ("llama-3.1-8b", "l4", 1), ("qwen3-32b", "a100", 2),
    ("mixtral-8x7b", "h100", 2), ("phi-4", "v100", 2),
])
def test_throughput_never_increases_with_layers(model, gpu, tp):
    arch, spec = model_arch(model), gpu_spec(gpu)
    for n_stages in (1, 2, 3):
        values = [stage_throughput(arch, spec, tp, layers, n_stages, SLO, MIX)
                  for layers in range(1, arch.layers + 1)]
        assert all(a >= b for a, b in itertools.pairwise(values)), (n_stages, values)
        assert values[0] > 0


def test_looser_slo_serves_more():
    arch, spec = model_arch("llama-3.1-8b"), gpu_spec("a100")
    tight = stage_throughput(arch, spec, 1, arch.layers, 1, Slo(1.0, 0.03), MIX)
    loose = stage_throughput(arch, spec, 1, arch.layers, 1, Slo(1.0, 0.08), MIX)
    assert 0 < tight < loose
    tighter = stage_throughput(arch, spec, 1, arch.layers, 1, Slo(1.0, 0.005), MIX)
    assert tighter == 0.0  # no step of an 8B model on one A100 takes 5 ms


def test_a100_beats_v100_for_the_same_layout():
    arch = model_arch("llama-3.1-8b")
    a100 = stage_throughput(arch, gpu_spec("a100"), 2, arch.layers, 1, SLO, MIX)
    v100 = stage_throughput(arch, gpu_spec("v100"), 2, arch.layers, 1, SLO, MIX)
    assert a100 > v100 > 0


def test_pipeline_stage_gets_its_share_of_the_slo():
    arch, spec = model_arch("llama-3.1-70b"), gpu_spec("a100-80g")
    one = stage_throughput(arch, spec, 4, 40, 1, SLO, MIX)
    two = stage_throughput(arch, spec, 4, 40, 2, SLO, MIX)
    assert 0 < two < one  # half the TPOT budget and a hand-off per step


def test_step_latency_grows_with_work_and_shrinks_with_tp():
    arch, spec = model_arch("llama-3.1-8b"), gpu_spec("a100-80g")
    base = step_latency_s(arch, spec, 1, 32, 1, 0, 1000)
    assert step_latency_s(arch, spec, 1, 32, 64, 0, 64 * 1000) > base
    assert step_latency_s(arch, spec, 1, 32, 1, 2048, 1000) > step_latency_s(arch, spec, 1, 32, 1, 0, 1000)
    assert step_latency_s(arch, spec, 1, 16, 1, 0, 1000) < base
    prefill = step_latency_s(arch, spec, 1, 32, 0, 4096, 0)
    assert step_latency_s(arch, spec, 4, 32, 0, 4096, 0) < prefill
    # one decoded token of an 8B model reads 16 GB: at 2 TB/s that is at least 8 ms
    assert base > 16.06e9 / (spec.mem_bw_gbs * 1e9)


def test_nvlink_tp_scales_better_than_pcie():
    arch = model_arch("llama-3.1-8b")
    gpus = load_gpus()
    def speedup(name):
        g = gpus[name]
        return step_latency_s(arch, g, 1, 32, 0, 4096, 0) / step_latency_s(arch, g, 4, 32, 0, 4096, 0)
    assert speedup("a100") > speedup("a10")


def test_calibration_flags():
    assert is_calibrated("llama-3.1-8b", "a100")
    assert not is_calibrated("llama-3.1-8b", "h200")  # no public data on H200
    assert not is_calibrated("mixtral-8x7b", "a100")  # MoE not covered by the measurements
    assert is_calibrated(model_arch("qwen3-8b"), gpu_spec("a100-40g"))


def _write_measured(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.yaml").write_text(text)


def test_measured_throughput_overrides_the_model(tmp_path):
    arch, spec = model_arch("llama-3.1-8b"), gpu_spec("a100")
    modelled = stage_throughput(arch, spec, 1, 32, 1, SLO, MIX)
    assert not is_calibrated("llama-3.1-8b", "l40s")
    _write_measured(tmp_path, f"""
arch: llama-3.1-8b
gpu: a100-40g
tp: 1
source: test
throughput:
  - {{input_tokens: 512, output_tokens: 128, ttft_s: 2.0, tpot_s: 0.08, requests_per_s: {modelled / 3}}}
""")
    perf.configure(measured=[tmp_path])
    assert stage_throughput(arch, spec, 1, 32, 1, SLO, MIX) == pytest.approx(modelled / 3)
    # a looser SLO may do better than the measured point, never worse
    assert stage_throughput(arch, spec, 1, 32, 1, Slo(2.0, 0.2), MIX) >= modelled / 3
    # fewer layers never slower, even against a measured point
    assert stage_throughput(arch, spec, 1, 20, 1, SLO, MIX) >= modelled / 3
    # another mix is not covered by the measurement: the model answers
    other = Mix(1024, 256)
    perf.configure()
    expected = stage_throughput(arch, spec, 1, 32, 1, SLO, other)
    perf.configure(measured=[tmp_path])
    assert stage_throughput(arch, spec, 1, 32, 1, SLO, other) == pytest.approx(expected)


def test_measured_step_latencies_rescale_the_model(tmp_path):
    arch, spec = model_arch("llama-3.1-8b"), gpu_spec("l40s")
    before = step_latency_s(arch, spec, 1, 32, 8, 0, 8000)
    rps_before = stage_throughput(arch, spec, 1, 32, 1, SLO, MIX)
    _write_measured(tmp_path, f"""
arch: llama-3.1-8b
gpu: l40s
tp: 1
step_latency:
  - {{decode_seqs: 8, prefill_tokens: 0, context_tokens: 8000, seconds: {2 * before}}}
""")
    perf.configure(measured=[tmp_path])
    assert step_latency_s(arch, spec, 1, 32, 8, 0, 8000) == pytest.approx(2 * before)
    assert stage_throughput(arch, spec, 1, 32, 1, SLO, MIX) < rps_before
    assert is_calibrated("llama-3.1-8b", "l40s")


def test_bad_measured_profile_names_file_and_field(tmp_path):
    from coral_solver.catalog import CatalogError
    _write_measured(tmp_path, """
arch: llama-3.1-8b
gpu: a100
tp: 1
throughput:
  - {input_tokens: 512, output_tokens: 128, ttft_s: 2.0, tpot_s: 0.08}
""")
    perf.configure(measured=[tmp_path])
    arch = model_arch("llama-3.1-8b")
    with pytest.raises(CatalogError, match=r"m\.yaml: throughput\[0\]: missing field 'requests_per_s'"):
        stage_throughput(arch, gpu_spec("a100"), 1, 32, 1, SLO, MIX)


def test_pipeline_steps_charge_the_engine_overhead_once_in_total():
    """A pipeline's stages split the per-step overhead instead of each paying it in full."""
    from coral_solver import catalog, perf

    arch, gpu = catalog.model_arch("llama-3.1-8b"), catalog.gpu_spec("a100")
    alone = perf.step_latency_s(arch, gpu, 1, 16, 1, 0, 0)
    two = perf.step_latency_s(arch, gpu, 1, 16, 1, 0, 0, n_stages=2)
    four = perf.step_latency_s(arch, gpu, 1, 16, 1, 0, 0, n_stages=4)
    # more stages -> a smaller share of the fixed overhead per stage (hand-off is tiny at 1 token)
    assert four < two < alone


def test_erlang_c_wait_tail_matches_the_closed_form():
    # M/M/2 with offered load 1: P(wait) = (a^c/c! * c/(c-a)) / (sum_{k<c} a^k/k! + same) = 1/3,
    # and the wait beyond t decays at rate c/S - lambda.
    assert perf._erlang_c_wait_tail(2, 1.0, 0.5, 0.0) == pytest.approx(1 / 3)
    assert perf._erlang_c_wait_tail(2, 1.0, 0.5, 2.0) == pytest.approx(math.exp(-1.0) / 3)
    # more servers for the same load: less waiting
    assert perf._erlang_c_wait_tail(4, 1.0, 0.5, 0.0) < perf._erlang_c_wait_tail(2, 1.0, 0.5, 0.0)


def test_kv_slots_leave_room_for_the_spread_of_exponential_lengths():
    cap, n_in, n_out = 23632, 1024, 256
    c = perf._concurrent_slots(cap, n_in, n_out, 256)
    mean, sd = n_in + n_out, math.hypot(n_in, n_out)
    assert c * mean + perf._Z * sd * math.sqrt(c) <= cap
    assert (c + 1) * mean + perf._Z * sd * math.sqrt(c + 1) > cap
    assert c < cap // (n_in + n_out / 2)  # fewer than the mean-only count
    assert perf._concurrent_slots(10**9, n_in, n_out, 256) == 256  # max_num_seqs caps it


def test_tail_step_runs_away_near_saturation():
    # t = 10 + 0.5 t settles at 20; t = 10 + 1.1 t never settles
    assert perf._tail_step(lambda t: 10 + 0.5 * t, 10.0, 100.0) == pytest.approx(20.0, rel=2e-3)
    assert perf._tail_step(lambda t: 10 + 1.1 * t, 10.0, 1e9) == math.inf
    assert perf._tail_step(lambda t: 10 + 0.5 * t, 10.0, 15.0) == math.inf  # past the limit


def test_prompt_heavy_mix_where_only_batches_above_one_pass_gets_its_throughput():
    # gpt-oss-120b on one H100 with 1,024 in / 16 out: a prompt-heavy mix, where the old
    # tail-TPOT test failed a lone sequence (its surge was largest at b = 1) and larger batches
    # passed; the capacity is still more than a batch of one's
    arch, gpu = model_arch("gpt-oss-120b"), gpu_spec("h100")
    slo, mix = perf.Slo(ttft_s=4.0, tpot_s=0.2), perf.Mix(input_tokens=1024, output_tokens=16)
    rps = perf.stage_throughput(arch, gpu, 1, arch.layers, 1, slo, mix)
    # a batch of one would serve at most 1 / (out x its prompt-carrying step); the answer is more
    one = 1.0 / (mix.output_tokens * perf.step_latency_s(arch, gpu, 1, arch.layers, 1, 0,
                                                         mix.input_tokens + mix.output_tokens))
    assert rps > one


def test_batched_prompt_chunks_attend_per_sequence():
    arch, gpu = model_arch("llama-3.1-8b"), gpu_spec("a100-80g")
    one = step_latency_s(arch, gpu, 1, arch.layers, 0, 2048, 0)
    # four 2,048-token prompts in one step: each attends to its own tokens (1,024 on average),
    # not to half of the 8,192 tokens of the batch
    four = step_latency_s(arch, gpu, 1, arch.layers, 0, 4 * 2048, 0, prefill_ctx=1024.0)
    as_one_chunk = step_latency_s(arch, gpu, 1, arch.layers, 0, 4 * 2048, 0)
    assert four < as_one_chunk
    # and the per-sequence accounting is linear in the prompts, as the planner's step charges
    over = perf._calibration().step_overhead_s
    assert four - over == pytest.approx(4 * (one - over), rel=0.02)


def test_a_closed_loop_has_no_poisson_surge_so_it_serves_at_least_as_much():
    """``poisson_tail=False`` (a fixed number of clients, as ``coral-hpc profile`` loads the
    engine) keeps only the mean TPOT and TTFT tests: never less than the open-loop figure, and
    more where the surge test binds — as for a prompt-heavy mix on a slow stage."""
    from coral_solver.perf_model import StageCoeffs

    coeffs = StageCoeffs(flops_per_token=4.7e-4, lm_head_flops=0.0, attn_flops=0.0, flops=1.0,
                         attn_flops_rate=1.0, dense_bytes=0.0, expert_bytes=0.0, expert_pick=0.0,
                         weight_bw=1.0, kv_bytes_per_token=0.0, kv_bw=1.0, overlap=1.0,
                         floor_s=0.0, comm_alpha_s=0.0, comm_s_per_token=0.0, hidden_bytes=512.0)
    for mix in (perf.Mix(438, 6), perf.Mix(32, 64)):
        args = (coeffs, 1 << 20, 1, perf.Slo(4.0, 0.4), mix)
        open_loop = perf.throughput_from_coeffs(*args, overhead_s=0.0127)
        closed = perf.throughput_from_coeffs(*args, overhead_s=0.0127, poisson_tail=False)
        assert closed >= open_loop
    assert open_loop > 0
    # the surge binds for a prompt-heavy mix: 6 output tokens, each a 218 ms prompt step away
    # from missing; the replica simulator (coral_solver.simcap, these steps, exponential
    # lengths) meets the SLO for 95 % up to 2.35 req/s, the open-loop figure stays below it
    # (1.33 with the tail over output lengths, coral_solver.perf_tail)
    prompt_heavy = (coeffs, 1 << 20, 1, perf.Slo(4.0, 0.4), perf.Mix(438, 6))
    open_heavy = perf.throughput_from_coeffs(*prompt_heavy, overhead_s=0.0127)
    closed_heavy = perf.throughput_from_coeffs(*prompt_heavy, overhead_s=0.0127,
                                               poisson_tail=False)
    assert closed_heavy > 4
    assert 0 < open_heavy < min(2.35, closed_heavy / 2)
