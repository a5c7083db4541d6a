"""Simulated capacity of prefill-only and decode-only templates (coral_solver.simcap_roles):
under ``capacity: simulated`` a disaggregated model's pools are rated by simulating their whole
replica, each role on its share of the SLO (KV hand-off included), as aggregated templates are."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coral_replica_sim.replica import Layout
from coral_solver import catalog, perf, perf_roles, simcap, simcap_roles
from coral_solver.roles import phase_templates
from coral_solver.templates import PerfThroughput, _cache_key, build_library
from coral_solver.types import ModelSpec, Policy

# qwen3-8b of examples/models.yaml: 512 in / 128 out, TTFT 2 s, TPOT 80 ms, on one A100
ARCH = "qwen3-8b"
ONE_A100 = Layout(ARCH, 1, ("a100",), (catalog.model_arch(ARCH).layers,))
SLO = perf.Slo(2.0, 0.08)
LENGTHS = simcap.Lengths.exponential(512, 128)


def _rate(role: str, slo: perf.Slo = SLO, lengths: simcap.Lengths = LENGTHS,
          layout: Layout = ONE_A100) -> float:
    return simcap_roles.role_capacity(layout, slo, lengths, 0.95, role)


def test_prefill_capacity_falls_as_the_prompt_grows_or_the_ttft_shrinks():
    base = _rate("prefill")
    assert base > 0
    longer = _rate("prefill", lengths=simcap.Lengths.exponential(2048, 128))
    tighter = _rate("prefill", slo=perf.Slo(0.25, SLO.tpot_s))
    assert longer < base, (longer, base)
    assert tighter < base, (tighter, base)
    # at the rate found, the goal share of prompts met their budget; 10 % above, not
    judged = simcap_roles.prefill_attainment(ONE_A100, SLO, LENGTHS, base, goal=0.0)
    assert judged.attainment >= 0.95
    above = simcap_roles.prefill_attainment(ONE_A100, perf.Slo(0.25, SLO.tpot_s), LENGTHS,
                                            tighter * 1.1, goal=0.0)
    assert above.attainment < 0.95


def test_decode_capacity_falls_as_the_tpot_shrinks():
    base = _rate("decode")
    tighter = _rate("decode", slo=perf.Slo(SLO.ttft_s, 0.03))
    assert 0 < tighter < base, (tighter, base)
    judged = simcap_roles.decode_attainment(ONE_A100, SLO, LENGTHS, base, goal=0.0)
    assert judged.attainment >= 0.95


def test_a_kv_hand_off_that_takes_the_prefill_budget_rates_the_prefill_pool_zero():
    """TTFT = one TPOT + the mean prompt's KV hand-off: the prefill side has no time left for
    the mean prompt, and only prompts well below the mean have any; the analytic role rating
    says 0 and so must the simulation (no goal of 95 % is reachable)."""
    arch = catalog.model_arch("llama-3.1-70b")
    layout = Layout("llama-3.1-70b", 4, ("a100-80g",), (arch.layers,))
    mix = perf.Mix(1024, 256)
    hand_off = perf.kv_transfer_s(arch, arch.layers, mix.input_tokens)
    assert hand_off > 0.02  # 80 layers of KV of 1,024 tokens over the calibrated link
    slo = perf.Slo(0.15 + hand_off, 0.15)
    assert perf.prefill_ttft_budget_s(arch, arch.layers, slo, mix) == pytest.approx(0.0)
    lengths = simcap.Lengths.exponential(1024, 256)
    assert perf_roles.phase_throughput(arch, catalog.gpu_spec("a100-80g"), 4, arch.layers, 1,
                                       slo, mix, "prefill") == 0.0
    assert simcap_roles.role_capacity(layout, slo, lengths, 0.95, "prefill") == 0.0
    # with the hand-off's time given back it serves
    loose = perf.Slo(slo.ttft_s + 1.0, slo.tpot_s)
    assert simcap_roles.role_capacity(layout, loose, lengths, 0.95, "prefill") > 0


def test_the_role_is_part_of_the_memo_key():
    args = (ARCH, 1, ("a100",), ONE_A100.layers, SLO, LENGTHS, 0.95)
    prefill = simcap_roles.role_template_capacity(*args, "prefill")
    decode = simcap_roles.role_template_capacity(*args, "decode")
    assert prefill == _rate("prefill") and decode == _rate("decode")
    assert prefill != decode
    with pytest.raises(ValueError, match="role"):
        simcap_roles.role_capacity(ONE_A100, SLO, LENGTHS, 0.95, "both")


def test_simulated_and_analytic_role_capacities_agree_within_a_factor_of_two():
    """The same replica rated two ways: the analytic role figure (one prompt a step and an
    M/M/1 tail for prefill; tail-sized KV slots, a batch surge and Erlang C for decode) and the
    simulation (chunked prefill batching prompts, the sampled lengths). They model the same
    hardware and SLO shares, so they must agree in order: within a factor of 2 either way."""
    arch, gpu = catalog.model_arch(ARCH), catalog.gpu_spec("a100")
    mix = perf.Mix(512, 128)
    for role in ("prefill", "decode"):
        analytic = perf_roles.phase_throughput(arch, gpu, 1, arch.layers, 1, SLO, mix, role)
        simulated = _rate(role)
        ratio = simulated / analytic
        assert 0.5 <= ratio <= 2.0, (
            f"{ARCH} {role} on one A100: simulated {simulated:.3g} / analytic {analytic:.3g} "
            f"= {ratio:.2f}, outside the band [0.5, 2]")


def _disaggregated_model() -> ModelSpec:
    return ModelSpec("q", ARCH, 512, 128, SLO.ttft_s, SLO.tpot_s, disaggregation="on")


def test_the_library_rates_role_templates_by_simulation_under_simulated_capacity():
    """Old code rated prefill and decode templates analytically whatever policy.capacity said;
    now each one's figure is its simulated role capacity."""
    model = _disaggregated_model()
    gpus = {"a100": (1, 40.0)}
    tm = PerfThroughput()
    library = build_library([model], gpus, Policy(max_tp=1, n_max=1, capacity="simulated"),
                            use_cache=False)["q"]
    assert sorted(t.role for t in library) == ["decode", "prefill"]
    for t in library:
        simulated = tm.simulated_phase_throughput(model, t, 0.95, t.role)
        analytic = tm.phase_throughput(model, "a100", 1, t.stages[0].layers, 1, t.role)
        assert t.throughput == simulated
        assert t.throughput != analytic
    analytic_library = build_library([model], gpus, Policy(max_tp=1, n_max=1),
                                     use_cache=False)["q"]
    assert {t.id for t in analytic_library} == {t.id for t in library}


def test_the_checker_rechecks_a_role_template_by_simulation():
    from coral_solver.check import _check_template

    model = _disaggregated_model()
    policy = Policy(max_tp=1, n_max=1, capacity="simulated")
    tm = PerfThroughput()
    for role in ("prefill", "decode"):
        (t,) = phase_templates(tm, model, {"a100": (1, 40.0)}, policy, role)
        assert _check_template(t, model, tm, 1e-6, policy) == []
        inflated = replace(t, throughput=t.throughput * 1.1)
        assert f"the {role} replica simulated serves" in _check_template(
            inflated, model, tm, 1e-6, policy)[0]


def test_a_throughput_model_that_cannot_simulate_roles_is_refused():
    from coral_solver.joint import TableThroughput

    table = TableThroughput({}, {}, {}, {})
    with pytest.raises(ValueError, match="simulates prefill and decode"):
        phase_templates(table, _disaggregated_model(), {"a100": (1, 40.0)},
                        Policy(capacity="simulated"), "prefill")


def test_the_role_simulation_keys_the_library_cache(monkeypatch, files_read):
    """Role templates simulated: a library cached when they were analytic must not be reused,
    and an edit of the role simulation must key a new one."""
    from pathlib import Path

    from coral_solver import templates

    tm = PerfThroughput()
    model, gpus = _disaggregated_model(), {"a100": (1, 40.0)}
    policy = Policy(capacity="simulated")
    key = _cache_key(tm, model, gpus, policy)
    monkeypatch.setattr(templates, "CACHE_VERSION", 4)  # the version before role simulation
    assert _cache_key(tm, model, gpus, policy) != key
    files_read.clear()  # only what the fingerprint reads
    tm.fingerprint()
    read = files_read
    assert simcap_roles.__file__ is not None
    assert Path(simcap_roles.__file__).resolve() in read


def test_the_search_ends_at_what_the_replica_sustains_when_the_sample_cannot_tell():
    """coral-tiny-llama under a 4 s TTFT: its 700 sampled requests meet the SLO even arriving
    all at once, so no finite sample fails a high rate and the doubling never ended. A rate
    above what the replica takes in with every request waiting is not sustained: the search
    stops there, for aggregated and role templates alike."""
    from coral_replica_sim.replica import Request

    tiny = Layout("coral-tiny-llama", 1, ("v100",), (4,))
    slo, lengths = perf.Slo(4.0, 0.4), simcap.Lengths.exponential(438, 6)
    burst = [Request(0.0, p, o) for p, o in zip(lengths.prompt, lengths.output)]
    assert simcap.attainment(tiny, slo, lengths, 1e9, goal=0.0).attainment == 1.0
    sustained = simcap.backlog_rate(tiny, burst)
    assert 0 < simcap.capacity(tiny, slo, lengths, 0.95) <= sustained
    for role in simcap_roles.ROLES:
        ceiling = simcap_roles.ceiling(tiny, lengths, role)
        assert 0 < simcap_roles.role_capacity(tiny, slo, lengths, 0.95, role) <= ceiling
