"""``coral-hpc profile --roles``'s measurements (coral_hpc.profile.roles) over real HTTP against
the sim engine (a real server process whose step times are the performance model's), written as
role profiles and planned from: a measured_only model with disaggregation gets a prefill and a
decode pool whose figures are these measurements. No Slurm: the engine runs on loopback.

Phases are shortened (3 s or 20 requests, not 20 s or 40) to keep the test to about a minute;
the judgement and the search are the profiler's own."""

from __future__ import annotations

import pytest

from coral_hpc.profile import openloop
from coral_hpc.profile.roles import measure_roles
from coral_hpc.profile.write import role_profile_document, role_profile_path, write_profile
from coral_solver import catalog, perf, perf_roles
from coral_solver.perf_profiles import parse_measured
from coral_solver.templates import PerfThroughput, library_templates
from coral_solver.types import ModelSpec, Policy
from tests.e2e.test_engine_sim import sim

ARCH, GPU = "llama-3.1-8b", "a100"
MIX = perf.Mix(input_tokens=512, output_tokens=32)
SLO = perf.Slo(ttft_s=1.0, tpot_s=0.05)


@pytest.fixture
def short_phases(monkeypatch):
    monkeypatch.setattr(openloop, "phase_seconds",
                        lambda rate, *a, **k: max(3.0, 20 / rate) if rate > 0 else 3.0)


def test_both_roles_measured_on_the_sim_engine_plan_both_pools(tmp_path, short_phases):
    arch = catalog.model_arch(ARCH)
    budget = perf_roles.prefill_ttft_budget_s(arch, arch.layers, SLO, MIX)
    assert 0 < budget < SLO.ttft_s - SLO.tpot_s  # the hand-off is taken off the TTFT
    lines: list[str] = []
    with sim(ARCH, "--sim-gpu-types", GPU) as engine:
        got = measure_roles(
            engine.url, ARCH, input_tokens=MIX.input_tokens, output_tokens=MIX.output_tokens,
            ttft_s=SLO.ttft_s, tpot_s=SLO.tpot_s, ttft_budget_s=budget,
            kv_transfer_s=perf_roles.kv_transfer_s(arch, arch.layers, MIX), progress=lines.append)
    prefill, decode = got["prefill"], got["decode"]
    # prefill: one prompt per step, longer prompts take longer; its phases sent one token each
    lengths = [(n, s) for _b, n, _c, s in prefill.steps]
    assert [n for n, _ in lengths] == [128, 256, 512]
    assert lengths[0][1] < lengths[-1][1]
    assert prefill.judged["ttft_s"] == pytest.approx(budget, abs=1e-6)
    # decode: more sequences a step, a longer step; the context is the mix's prompt
    steps = [(b, c, s) for b, _p, c, s in decode.steps]
    assert [b for b, _, _ in steps] == [1, 2, 4, 8]
    assert steps[0][1] >= MIX.input_tokens and steps[-1][2] > steps[0][2]
    for role in (prefill, decode):
        ((i, o, ttft, tpot, rps),) = role.throughput
        assert (i, o, ttft, tpot) == (512, 32, 1.0, 0.05)
        assert rps > 0, (role.role, lines)
        # the rate found was met in a phase, and some rate above it was missed or not tried
        assert any(p["met"] and p["requests_per_s"] == pytest.approx(rps, abs=1e-3)
                   for p in role.open_loop_phases)
    # the sim engine exports no prefix-cache counters: nothing is claimed about the cache
    assert decode.prompt_tokens_cached is None
    # a decode replica serves each request for 32 steps, a prefill replica for one: it
    # serves far fewer requests a second than the prefill replica of the same engine
    assert decode.throughput[0][4] < prefill.throughput[0][4]

    for role, measured in got.items():
        write_profile(role_profile_path(tmp_path, ARCH, GPU, 1, role), role_profile_document(
            arch=ARCH, gpu=GPU, tp=1, layers=arch.layers, source="sim", model=ARCH,
            partition="local", startup_s=1.0, submit_to_ready_s=1.0, measured=measured))
    assert parse_measured(role_profile_path(tmp_path, ARCH, GPU, 1, "decode")).role == "decode"
    try:
        perf.configure(measured=[tmp_path])
        model = ModelSpec(name="m", arch=ARCH, input_tokens=MIX.input_tokens,
                          output_tokens=MIX.output_tokens, ttft_s=SLO.ttft_s, tpot_s=SLO.tpot_s,
                          demand_rps=1.0, disaggregation="on")
        library = library_templates(PerfThroughput(), model, {GPU: (8, 80.0)},
                                    Policy(n_max=2, rho=1e5, max_tp=1, measured_only=True))
    finally:
        perf.configure()
    assert sorted((t.role, t.tp, t.pp, round(t.throughput, 4)) for t in library) == sorted(
        (role, 1, 1, round(m.throughput[0][4], 4)) for role, m in got.items())
