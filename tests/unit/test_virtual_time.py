"""One sim-engine replica in virtual time: refusal of what can never fit, and the speed knob."""

import pytest

from coral_replica_sim.replica import EngineLimits, Layout, Request, StepModel, serve

LAYOUT = Layout("llama-3.1-8b", 1, ("a100-80g",), (32,))


def test_a_request_the_kv_cache_can_never_hold_is_refused_at_arrival_and_the_rest_served():
    capacity = StepModel(LAYOUT).kv_capacity_tokens()
    requests = [Request(0.0, 1000, 8), Request(0.5, capacity + 16, 8), Request(1.0, 1000, 8)]
    first, too_long, last = serve(LAYOUT, requests)
    assert too_long.refused and too_long.tokens == 0
    assert too_long.first_s == too_long.last_s == 0.5
    assert not first.refused and first.tokens == 8 and first.last_s > first.first_s > 0.0
    assert not last.refused and last.tokens == 8 and last.first_s > 1.0


def test_speed_divides_every_step_time():
    # arriving together, so every event time is a sum of step times only
    requests = [Request(0.0, 2000, 32), Request(0.0, 500, 64)]
    base = serve(LAYOUT, requests)
    fast = serve(LAYOUT, requests, EngineLimits(speed=4.0))
    for b, f in zip(base, fast):
        assert f.tokens == b.tokens
        assert f.first_s == pytest.approx(b.first_s / 4, rel=1e-9)
        assert f.last_s == pytest.approx(b.last_s / 4, rel=1e-9)
