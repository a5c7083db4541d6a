"""The capacity search is monotone in step cost: a slower step never gives more capacity.

bench/capacity_band.py found the opposite on the step coefficients fitted to the real engine's
two-node pipeline: 7.98 req/s with no hand-off, 7.36 at 1 ms, 9.00 at 12.5 ms. A slower step
(more hand-off, more overhead, more per token) must never be rated higher; these tests hold the
search to that, up to its resolution (coral_solver.perf_queue.BATCH_RESOLUTION, 0.1 %).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from coral_solver import catalog, perf, perf_roles
from coral_solver.perf_model import StageCoeffs

#: the search finds the largest feasible batch to 0.1 % (perf_queue.BATCH_RESOLUTION)
REL = 1e-3
#: bench/results/capacity_band.md: coral-tiny-llama (4 layers, hidden 256) on vLLM's CPU build,
#: its PP 1 steps fitted as overhead + s per token (+ s per KV token, fitted 0)
FIT_OVERHEAD_S, FIT_PER_TOKEN_S = 0.013036825739180082, 0.0006966508408662714
BAND_SLO, BAND_MIX = perf.Slo(2.0, 0.2), perf.Mix(64, 32)
BAND_KV_TOKENS, BAND_MAX_SEQS = 524288, 32


def _fitted(per_token_s: float = FIT_PER_TOKEN_S, per_kv_s: float = 0.0,
            share: float = 0.5) -> StageCoeffs:
    """Step coefficients of a stage holding ``share`` of the layers (bench/paper_pp.py's
    stage_coeffs: additive, the fitted terms in proportion)."""
    return StageCoeffs(flops_per_token=per_token_s * share, lm_head_flops=0.0, attn_flops=0.0,
                       flops=1.0, attn_flops_rate=1.0, dense_bytes=0.0, expert_bytes=0.0,
                       expert_pick=0.0, weight_bw=1.0, kv_bytes_per_token=per_kv_s * share,
                       kv_bw=1.0, overlap=1.0, floor_s=0.0, comm_alpha_s=0.0,
                       comm_s_per_token=0.0, hidden_bytes=512.0)


def _band(c: StageCoeffs, n_stages: int = 2, overhead_s: float = FIT_OVERHEAD_S,
          handoff_s: float | None = 0.0, poisson_tail: bool = True) -> float:
    return perf.throughput_from_coeffs(c, BAND_KV_TOKENS, n_stages, BAND_SLO, BAND_MIX,
                                       overhead_s=overhead_s, poisson_tail=poisson_tail,
                                       handoff_s=handoff_s, max_concurrent=BAND_MAX_SEQS)


def _assert_non_increasing(costs: list[float], rates: list[float]) -> None:
    rises = [(a, b, x, y) for a, b, x, y in zip(costs, costs[1:], rates, rates[1:])
             if y > x * (1.0 + REL)]
    assert not rises, f"capacity rises with the cost (cost, cost', rps, rps'): {rises}"


def test_the_bench_pipeline_loses_capacity_with_every_ms_of_hand_off():
    handoffs_ms = [0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 12.5, 15.0, 20.0, 30.0, 50.0]
    rates = [_band(_fitted(), handoff_s=h / 1e3) for h in handoffs_ms]
    _assert_non_increasing(handoffs_ms, rates)
    zero, one, bench = (rates[handoffs_ms.index(h)] for h in (0.0, 1.0, 12.5))
    assert zero >= one >= bench > 0  # the three figures the bench first reported: 7.98, 7.36, 9.00
    assert rates[-1] < zero  # and the hand-off does cost something


@pytest.mark.parametrize("n_stages", [1, 2])
@pytest.mark.parametrize("poisson_tail", [True, False])
def test_capacity_never_rises_with_the_engine_overhead(n_stages, poisson_tail):
    overheads_ms = [0.5, 1.0, 2.0, 4.0, 6.5, 9.0, 13.0, 17.0, 25.0, 40.0, 60.0]
    rates = [_band(_fitted(share=1.0 / n_stages), n_stages, overhead_s=o / 1e3,
                   poisson_tail=poisson_tail) for o in overheads_ms]
    _assert_non_increasing(overheads_ms, rates)
    assert rates[0] > rates[-1]


@pytest.mark.parametrize("field", ["per_token", "per_kv"])
def test_capacity_never_rises_with_the_per_token_costs(field):
    scales = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0]
    rates = []
    for s in scales:
        c = (_fitted(per_token_s=FIT_PER_TOKEN_S * s) if field == "per_token"
             else _fitted(per_kv_s=2e-6 * s))
        rates.append(_band(c, handoff_s=2e-3))
    _assert_non_increasing(scales, rates)
    assert rates[0] > rates[-1]


def _random_case(rng: random.Random) -> tuple[StageCoeffs, dict]:
    """A stage with random coefficients: the fitted shape or a catalogue roofline scaled."""
    if rng.random() < 0.5:
        c = _fitted(per_token_s=rng.uniform(1e-5, 2e-3), per_kv_s=rng.uniform(0.0, 1e-6),
                    share=1.0)
    else:
        arch = catalog.model_arch(rng.choice(["llama-3.1-8b", "qwen3-8b", "phi-4"]))
        gpu = catalog.gpu_spec(rng.choice(["a100", "a100-80g", "h100", "l40s"]))
        c = dataclasses.replace(perf._stage_coeffs(arch, gpu, 1, arch.layers),
                                flops=rng.uniform(0.3, 3.0) * 1e14)
    n_in, n_out = rng.choice([(64, 32), (512, 128), (1024, 256), (2048, 28), (128, 512)])
    kwargs = dict(n_stages=rng.choice([1, 2, 3]), slo=perf.Slo(rng.uniform(0.5, 5.0),
                                                                  rng.uniform(0.03, 0.3)),
                  mix=perf.Mix(n_in, n_out), overhead_s=rng.uniform(5e-4, 3e-2),
                  handoff_s=rng.uniform(0.0, 2e-2), max_concurrent=rng.choice([None, 32, 128]))
    return c, kwargs


def _rate(c: StageCoeffs, kw: dict) -> float:
    return perf.throughput_from_coeffs(c, 1 << 22, kw["n_stages"], kw["slo"], kw["mix"],
                                       overhead_s=kw["overhead_s"], handoff_s=kw["handoff_s"],
                                       max_concurrent=kw["max_concurrent"])


def test_no_step_cost_raises_capacity_on_random_coefficients():
    """Property check with a fixed seed: raising any one step cost of a random stage (its
    overhead, hand-off, per-token compute, KV read or per-step floor, and the weight read where
    the step adds it to the compute) never raises its capacity beyond the search's resolution.

    Not checked: the weight read of a roofline step that hides it partly under compute
    (overlap < 1). It counts fully in the empty step but only in part in a loaded one, so it
    raises the spare share the tail's surge counts on (perf_queue._Feasibility._tail_tpot_ok)
    and can raise capacity a little (at most 1.9 % over 314 random stages, up to ten times the
    weights); a known limit of that share, not of the search."""
    rng = random.Random(20261203)
    checked = 0
    for _ in range(60):
        c, kw = _random_case(rng)
        base = _rate(c, kw)
        for factor in (1.1, 1.5, 3.0):
            dearer = [
                (c, {**kw, "overhead_s": kw["overhead_s"] * factor}),
                (c, {**kw, "handoff_s": kw["handoff_s"] * factor + 1e-4}),
                (dataclasses.replace(c, flops_per_token=c.flops_per_token * factor), kw),
                (dataclasses.replace(c, kv_bytes_per_token=c.kv_bytes_per_token * factor), kw),
                (dataclasses.replace(c, floor_s=c.floor_s * factor + 1e-4), kw),
            ]
            if c.overlap == 1.0:  # additive: the weight read costs every step alike
                dearer.append((dataclasses.replace(c, dense_bytes=c.dense_bytes * factor + 1e-4),
                               kw))
            for c2, kw2 in dearer:
                assert _rate(c2, kw2) <= base * (1.0 + REL), (c, kw, c2, kw2)
        checked += base > 0
    assert checked >= 30  # most random stages serve something: the check is not vacuous


@pytest.mark.parametrize("arch_name,gpu_name,mix,n_stages,field", [
    ("qwen3-8b", "h100", perf.Mix(512, 128), 1, "step_overhead_s"),
    ("llama-3.1-8b", "a100", perf.Mix(1024, 256), 2, "pp_alpha_s"),
    ("llama-3.1-8b", "a100", perf.Mix(1024, 256), 2, "step_overhead_s"),
])
def test_a_decode_replica_never_gains_from_a_slower_step(monkeypatch, arch_name, gpu_name, mix,
                                                          n_stages, field):
    """The decode role's search (coral_solver.perf_roles) draws the same surge: a slower step
    (more hand-off between its stages, more engine overhead) never rates it higher."""
    arch, gpu = catalog.model_arch(arch_name), catalog.gpu_spec(gpu_name)
    slo = perf.Slo(2.0, 0.05)
    cal = perf._calibration()
    costs = [getattr(cal, field) * f for f in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)]
    rates = []
    for cost in costs:
        monkeypatch.setattr(perf, "_calibration",
                            lambda cost=cost: dataclasses.replace(cal, **{field: cost}))
        rates.append(perf_roles.phase_throughput(arch, gpu, 1, arch.layers // n_stages,
                                                 n_stages, slo, mix, "decode"))
    _assert_non_increasing(costs, rates)
    assert rates[0] > rates[-1] > 0
