"""Disaggregated serving in the planner: phase throughput (Stage 1) and the demand split (Stage 2)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from coral_solver import catalog, perf, perf_roles
from coral_solver.allocate import allocate
from coral_solver.check import check_plan
from coral_solver.joint import TableThroughput
from coral_solver.roles import phase_templates, roles_for
from coral_solver.templates import _from_json, _to_json, build_library
from coral_solver.types import (
    Cluster,
    ModelSpec,
    NodeGroup,
    Partition,
    Plan,
    PlanRow,
    Policy,
    Stage,
    Template,
)

ARCH = catalog.model_arch("qwen3-32b")
H100 = catalog.gpu_spec("h100")
A100 = catalog.gpu_spec("a100-80g")
MIX = perf.Mix(input_tokens=1000, output_tokens=300)
SLO = perf.Slo(ttft_s=2.0, tpot_s=0.1)


# --------------------------------------------------------------------------- Stage 1: phase model


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_phase_throughput_never_rises_with_more_layers(role):
    values = [perf_roles.phase_throughput(ARCH, H100, 2, l, 1, SLO, MIX, role)
              for l in range(1, ARCH.layers + 1)]
    assert values[0] > 0
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(values))


def test_prefill_depends_on_ttft_and_decode_on_tpot():
    tight, loose = perf.Slo(ttft_s=0.5, tpot_s=0.1), perf.Slo(ttft_s=4.0, tpot_s=0.1)
    p = [perf_roles.phase_throughput(ARCH, H100, 2, ARCH.layers, 1, s, MIX, "prefill")
         for s in (tight, loose)]
    assert 0 < p[0] < p[1]
    fast, slow = perf.Slo(ttft_s=2.0, tpot_s=0.03), perf.Slo(ttft_s=2.0, tpot_s=0.2)
    d = [perf_roles.phase_throughput(ARCH, A100, 2, ARCH.layers, 1, s, MIX, "decode")
         for s in (fast, slow)]
    assert 0 < d[0] < d[1]


def test_prefill_stays_under_the_compute_roofline_and_meets_its_ttft_budget():
    rps = perf_roles.phase_throughput(ARCH, H100, 1, ARCH.layers, 1, SLO, MIX, "prefill")
    # prompt tokens/s cannot beat peak FLOP/s over 2 FLOPs per parameter per token
    assert rps * MIX.input_tokens < H100.fp16_tflops * 1e12 / (2 * ARCH.active_params_b * 1e9)
    # an M/M/1 stage at this rate: P(sojourn > TTFT − transfer − TPOT) is exactly the miss share
    c = perf._stage_coeffs(ARCH, H100, 1, ARCH.layers)
    cal = perf._calibration()
    service = perf.step_latency_s(ARCH, H100, 1, ARCH.layers, 0, MIX.input_tokens, 0)
    assert service == pytest.approx(
        perf_roles.step_time(c, 0, 1000, 0.0, 500.0, cal.step_overhead_s, 1, 0, 1), rel=1e-9)
    budget = SLO.ttft_s - perf_roles.kv_transfer_s(ARCH, ARCH.layers, MIX) - SLO.tpot_s
    assert math.exp(-(1 / service - rps) * budget) == pytest.approx(perf.MISS_PER_OBJECTIVE, rel=1e-6)


def test_no_prefill_when_the_kv_transfer_alone_takes_the_ttft():
    transfer = perf_roles.kv_transfer_s(ARCH, ARCH.layers, MIX)
    slo = perf.Slo(ttft_s=transfer + 0.1 - 1e-6, tpot_s=0.1)  # nothing left for the prompt
    assert perf_roles.phase_throughput(ARCH, H100, 2, ARCH.layers, 1, slo, MIX, "prefill") == 0.0


def test_decode_holds_prompt_and_output_kv_so_longer_prompts_serve_less():
    short = perf_roles.phase_throughput(ARCH, A100, 2, ARCH.layers, 1, SLO, MIX, "decode")
    long = perf_roles.phase_throughput(ARCH, A100, 2, ARCH.layers, 1, SLO,
                                       perf.Mix(input_tokens=8000, output_tokens=300), "decode")
    assert 0 < long < short


def test_kv_bytes_per_request_is_the_prompts_kv_over_all_layers():
    assert perf_roles.kv_bytes_per_request(ARCH, MIX) == 1000 * ARCH.kv_bytes_per_token
    # qwen3-32b: 64 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
    assert ARCH.kv_bytes_per_token == 64 * 8 * 128 * 2 * 2


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role 'mixed'"):
        perf_roles.phase_throughput(ARCH, H100, 1, 1, 1, SLO, MIX, "mixed")


# --------------------------------------------------------------------------- Stage 1: templates


def _table_model() -> tuple[TableThroughput, ModelSpec]:
    """One 4-layer model on 'fast' (compute-rich: prefills well) and 'wide' (bandwidth-rich:
    decodes well) GPUs; aggregated serving is mediocre on both."""
    name = "m"
    tm = TableThroughput({name: 4}, {name: 10.0}, {name: [1]})
    for gpu, both, pre, dec in (("fast", 1.6, 8.0, 1.0), ("wide", 1.6, 1.0, 8.0)):
        for stages in (1, 2):
            tm.table[(name, gpu, 1, stages)] = [both * 4 / l for l in range(1, 5)]
            tm.phase_table[(name, gpu, 1, stages, "prefill")] = [pre * 4 / l for l in range(1, 5)]
            tm.phase_table[(name, gpu, 1, stages, "decode")] = [dec * 4 / l for l in range(1, 5)]
    tm.kv_bytes[name] = 2e8
    model = ModelSpec(name, name, 100, 100, 1.0, 0.1, demand_rps=8.0)
    return tm, model


GPU_TYPES = {"fast": (4, 40.0), "wide": (4, 40.0)}
POLICY = Policy(n_max=2, rho=math.inf, max_tp=1, startup_penalty=0.0, mip_gap=0.0, prune=False)


def test_each_phase_picks_its_own_gpu_type():
    tm, model = _table_model()
    pre = phase_templates(tm, model, GPU_TYPES, POLICY, "prefill")
    dec = phase_templates(tm, model, GPU_TYPES, POLICY, "decode")
    assert {t.role for t in pre} == {"prefill"} and {t.role for t in dec} == {"decode"}
    def best_single(ts):
        return max((t for t in ts if t.pp == 1), key=lambda t: t.throughput).stages

    assert best_single(pre) == (Stage("fast", 4),)
    assert best_single(dec) == (Stage("wide", 4),)
    assert all(t.kv_bytes_per_request == 2e8 for t in pre + dec)
    assert all(".prefill." in t.id for t in pre) and all(".decode." in t.id for t in dec)


@pytest.mark.parametrize("mode,roles", [("off", {"both"}), ("on", {"prefill", "decode"}),
                                        ("auto", {"both", "prefill", "decode"})])
def test_the_library_follows_the_disaggregation_policy(mode, roles, tmp_path):
    tm, model = _table_model()
    model = replace(model, disaggregation=mode)
    assert set(roles_for(model)) == roles
    library = build_library([model], GPU_TYPES, POLICY, tm, cache_dir=tmp_path)
    assert {t.role for t in library["m"]} == roles
    cached = build_library([model], GPU_TYPES, POLICY, tm, cache_dir=tmp_path)  # from disk
    assert cached == library


def test_role_survives_the_cache_round_trip():
    t = Template("m", 2, (Stage("h100", 64),), 3.5, True, "decode", 2.6e8)
    assert _from_json(_to_json([t])) == [t]
    assert _from_json([{"model": "m", "tp": 1, "stages": [{"gpu_type": "a", "layers": 2}],
                        "throughput": 1.0}])[0].role == "both"  # a cache written before roles


def test_a_bad_disaggregation_value_is_named():
    _, model = _table_model()
    with pytest.raises(ValueError, match="disaggregation 'sometimes'"):
        roles_for(replace(model, disaggregation="sometimes"))


# --------------------------------------------------------------------------- Stage 2


def _cluster(fabric: float | None = None) -> Cluster:
    groups = (NodeGroup("f", "fast", 4, 40.0, ("f0", "f1"), (4, 4)),
              NodeGroup("w", "wide", 4, 40.0, ("w0", "w1"), (4, 4)))
    return Cluster(groups, (Partition("p", ("f", "w"), prices={"fast": 1.0, "wide": 1.0}),),
                   kv_fabric_gbs=fabric)


def _plan(mode: str, cluster: Cluster | None = None):
    tm, model = _table_model()
    model = replace(model, disaggregation=mode)
    cluster = cluster or _cluster()
    library = build_library([model], cluster.gpu_types(), POLICY, tm, use_cache=False)
    plan = allocate([model], library, cluster, POLICY)
    assert check_plan(plan, [model], cluster, library, tm) == []
    return plan


def test_stage2_sizes_each_phase_to_the_demand_and_prefers_the_cheaper_kind():
    off, on, auto = _plan("off"), _plan("on"), _plan("auto")
    # aggregated: 8 req/s at 1.6 per GPU = 5 GPUs; split: one fast prefill (8) + one wide decode (8)
    assert off.cost_per_hour == pytest.approx(5.0)
    assert on.cost_per_hour == pytest.approx(2.0)
    assert sorted((r.role, r.template.stages[0].gpu_type, r.count) for r in on.rows) == [
        ("decode", "wide", 1), ("prefill", "fast", 1)]
    assert auto.cost_per_hour == pytest.approx(2.0)
    assert {r.role for r in auto.rows} == {"prefill", "decode"}
    assert on.capacity["m"] == pytest.approx(8.0)  # min(prefill, decode), not their sum


def test_auto_keeps_aggregated_replicas_where_they_are_cheaper():
    tm, model = _table_model()
    # make aggregated serving as good as either phase: two roles then cost more than one replica
    for key in list(tm.table):
        tm.table[key] = [8.0 * 4 / l for l in range(1, 5)]
    model = replace(model, disaggregation="auto")
    cluster = _cluster()
    library = build_library([model], cluster.gpu_types(), POLICY, tm, use_cache=False)
    plan = allocate([model], library, cluster, POLICY)
    assert {r.role for r in plan.rows} == {"both"} and plan.cost_per_hour == pytest.approx(1.0)


def test_the_kv_fabric_limit_caps_the_disaggregated_share():
    # 2e8 bytes per request over 1 GB/s: at most 5 of the 8 req/s can go prefill -> decode;
    # the other 3 take two aggregated GPUs (3.2 req/s): 2 + 2 beats 5 aggregated GPUs
    plan = _plan("auto", _cluster(fabric=1.0))
    assert plan.status == "optimal" and plan.cost_per_hour == pytest.approx(4.0)
    roles = {r.role: r.count * r.throughput for r in plan.rows}
    assert min(roles.get("prefill", 0), roles.get("decode", 0)) >= 5.0 - 1e-9
    assert roles.get("both", 0) >= 3.0 - 1e-9
    scarce = _plan("on", _cluster(fabric=1.0))
    assert scarce.status == "scarce" and scarce.served["m"] == pytest.approx(5.0)


def test_checker_counts_a_disaggregated_request_once_it_has_both_phases():
    tm, model = _table_model()
    model = replace(model, disaggregation="on")
    cluster = _cluster()
    library = build_library([model], cluster.gpu_types(), POLICY, tm, use_cache=False)
    prefill = max((t for t in library["m"] if t.role == "prefill"), key=lambda t: t.throughput)
    row = PlanRow(prefill, ("p",), 1, 1.0, (("f0",),))
    only_prefill = Plan((row,), {"m": 8.0}, {"m": 8.0}, {"m": 8.0}, 1.0, "optimal", 0.0, 0.0)
    problems = check_plan(only_prefill, [model], cluster, library, tm)
    assert any("capacity" in p for p in problems) and any("not met" in p for p in problems)
