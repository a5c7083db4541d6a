"""The simulated capacity's shortcuts (coral_solver.simcap): each must give the very verdicts
and figures of the plain run, only sooner — a rate's misses counted as soon as they are
certain, the backlog run stopped at its last first token, the ceiling simulated only when a
rate would pass."""

from __future__ import annotations

import math

import pytest

from coral_replica_sim.replica import Layout, Request, serve
from coral_solver import perf, simcap, simcap_roles

LAYOUT = Layout("phi-4", 1, ("l40s",), (40,))
SLO = perf.Slo(1.2, 0.06)
LENGTHS = simcap.Lengths.exponential(1243, 217)
#: rates (requests/s) around this layout's capacity (~0.65) and far above it
RATES = (0.45, 0.6, 0.65, 0.7, 0.9, 2.0)


def _served(monkeypatch: pytest.MonkeyPatch, stops: list[bool] | None = None) -> list[int]:
    """Record how many watch calls each run of serve_watched made before it ended (and in
    ``stops`` whether it stopped early)."""
    calls: list[int] = []
    real = simcap.serve_watched

    def counting(layout, requests, limits, watch):
        calls.append(0)

        def counted(*args):
            calls[-1] += 1
            return watch(*args)

        result = real(layout, requests, limits, counted if watch else None)
        if stops is not None:
            stops.append(result[3])
        return result

    monkeypatch.setattr(simcap, "serve_watched", counting)
    return calls


def _plain(rate: float, goal: float) -> simcap.Judged:
    """attainment() without the first-token deadline: misses counted when tokens come."""
    at = simcap.arrivals(LENGTHS, rate)
    requests = [Request(float(at[i]), LENGTHS.prompt[i], LENGTHS.output[i])
                for i in range(len(at))]
    return simcap.judge(LAYOUT, requests, lambda i, s: s - requests[i].at <= SLO.ttft_s,
                        tpot_s=SLO.tpot_s, goal=goal, rate=rate)


@pytest.mark.parametrize("rate", RATES)
def test_counting_misses_early_keeps_the_verdict_and_the_full_runs_attainment(rate):
    full = simcap.attainment(LAYOUT, SLO, LENGTHS, rate, goal=0.0)
    assert full == _plain(rate, 0.0)  # every early miss is one the full run counts
    judged = simcap.attainment(LAYOUT, SLO, LENGTHS, rate, goal=0.95)
    assert judged.stopped == (full.attainment < 0.95)
    assert _plain(rate, 0.95).stopped == judged.stopped


def test_a_failing_rate_stops_sooner_with_deadlines(monkeypatch):
    calls = _served(monkeypatch)
    early = simcap.attainment(LAYOUT, SLO, LENGTHS, 2.0, goal=0.95)
    late = _plain(2.0, 0.95)
    assert early.stopped and late.stopped
    assert calls[0] < calls[1]


def test_the_backlog_rate_stops_at_the_last_first_token(monkeypatch):
    burst = [Request(0.0, p, o) for p, o in zip(LENGTHS.prompt, LENGTHS.output)]
    first, _last, _n, _ = simcap.serve_watched(LAYOUT, burst, simcap.limits(), None)
    assert simcap.backlog_rate(LAYOUT, burst) == len(burst) / max(first.values())
    stops: list[bool] = []
    _served(monkeypatch, stops)
    simcap.backlog_rate(LAYOUT, burst)
    assert stops == [True]  # at its last first token, before the last requests' decode


def test_the_ceiling_is_simulated_only_once_a_rate_passes(monkeypatch):
    asked = []
    real = simcap.backlog_rate

    def backlog(layout, requests):
        asked.append(len(requests))
        return real(layout, requests)

    monkeypatch.setattr(simcap, "backlog_rate", backlog)
    # a TPOT no step meets: no rate passes, the ceiling is never needed
    assert simcap.capacity(LAYOUT, perf.Slo(1.2, 0.001), LENGTHS, 0.95) == 0.0
    assert asked == []
    found = simcap.capacity(LAYOUT, SLO, LENGTHS, 0.95)
    assert len(asked) == 1 and 0 < found < math.inf


@pytest.mark.parametrize("role", simcap_roles.ROLES)
def test_role_deadlines_keep_the_full_runs_attainment(role):
    judge = {"prefill": simcap_roles.prefill_attainment,
             "decode": simcap_roles.decode_attainment}[role]
    for rate in (0.3, 3.0):
        full = judge(LAYOUT, SLO, LENGTHS, rate, goal=0.0)
        judged = judge(LAYOUT, SLO, LENGTHS, rate, goal=0.95)
        assert judged.stopped == (full.attainment < 0.95)


def test_a_scheduled_batchs_step_times_use_its_counted_context():
    from coral_replica_sim.batching import Scheduler, Sequence
    from coral_replica_sim.replica import StepModel

    model = StepModel(LAYOUT)
    s = Scheduler(kv_capacity_tokens=model.kv_capacity_tokens(), max_num_batched_tokens=2048)
    for i, (p, o) in enumerate(zip(LENGTHS.prompt[:40], LENGTHS.output[:40])):
        s.add(Sequence(str(i), p, o))
    seen = 0
    while (batch := s.schedule()) is not None and seen < 300:
        # a batch made without its context (0) has it counted from its sequences
        assert model.batch_times(batch) == model.batch_times(batch._replace(context_tokens=0))
        seen += bool(batch.decode and batch.prefill)
        s.complete(batch)
    assert seen > 0  # some batches mixed decodes and prompt chunks


def _alone(layout: Layout, prompt: int, external: int = 0) -> float:
    first, _l, produced, _ = simcap.serve_watched(
        layout, [Request(0.0, prompt, 1, external=external)], simcap.limits(), None)
    return first[0] if produced[0] else math.inf


@pytest.mark.parametrize("layout,rate", [
    (LAYOUT, 0.7), (LAYOUT, 2.0),
    (Layout("phi-4", 2, ("a10g", "a10g", "l4"), (15, 16, 9)), 0.5),
    (Layout("gpt-oss-20b", 1, ("a10g", "l40s"), (5, 19)), 3.0)])
@pytest.mark.parametrize("decode", [False, True])
def test_no_first_token_comes_sooner_than_alone(layout, rate, decode):
    """The assumption simcap.hopeless rests on: others in the replica only delay a request's
    first token (prompts chunked with others', pipelines busy, a queue, preemption)."""
    at = simcap.arrivals(LENGTHS, rate)
    requests = [Request(float(at[i]), p, o, external=p - 1 if decode else 0)
                for i, (p, o) in enumerate(zip(LENGTHS.prompt, LENGTHS.output))]
    outcomes = serve(layout, requests, simcap.limits())
    alone: dict[int, float] = {}
    for r, out in zip(requests, outcomes):
        if out.refused:
            continue
        if r.prompt_tokens not in alone:
            alone[r.prompt_tokens] = _alone(layout, r.prompt_tokens, r.external)
        assert out.first_s - r.at >= alone[r.prompt_tokens] - 1e-9


def test_a_template_no_rate_serves_is_rated_zero_without_probing(monkeypatch):
    layout = Layout("gpt-oss-20b", 1, ("a10g",), (24,))
    slo, lengths = perf.Slo(0.9, 0.03), simcap.Lengths.exponential(2027, 27)
    assert simcap.hopeless(layout, lengths, [slo.ttft_s] * len(lengths.prompt), 0.95)
    searched = simcap.capacity(layout, slo, lengths, 0.95, rated_zero=lambda: False)
    assert searched == 0.0  # the full search agrees
    probed = []
    monkeypatch.setattr(simcap, "attainment", lambda *a, **k: probed.append(a) or None)
    assert simcap.capacity(layout, slo, lengths, 0.95) == 0.0
    assert probed == []
    # a template that serves some rate is not hopeless
    assert not simcap.hopeless(LAYOUT, LENGTHS, [SLO.ttft_s] * len(LENGTHS.prompt), 0.95)
