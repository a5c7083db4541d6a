"""A model's virtual-time day (coral_hpc.simulate.day): it keeps the model's rate, follows its
trace from its phase and meters the same requests it serves."""

from __future__ import annotations

import numpy as np
import pytest

from coral_hpc.simulate import day as D


def _trace(first_half_prompt: int = 100, second_half_prompt: int = 5000) -> D.TraceRows:
    """An hour-long trace: 3 requests/s in its first half, 1 in its second; prompts differ."""
    t = np.concatenate([np.arange(0.0, 1800.0, 1 / 3), np.arange(1800.0, 3600.0, 1.0)])
    prompt = np.where(t < 1800.0, first_half_prompt, second_half_prompt)
    return D.TraceRows("synthetic", t, prompt, np.full(len(t), 20))


def test_a_day_keeps_the_models_rate_and_meters_the_requests_it_serves():
    day = D.ModelDay(_trace(), phase=0.0, mean_rps=2.0, index=3, seed=7, max_context=131072)
    assert day.counts.sum() / D.DAY_S == pytest.approx(2.0, rel=0.02)
    for minute in (0, 61, 1439):
        at, prompt, output = day.requests(minute * 60.0, (minute + 1) * 60.0)
        assert len(at) == day.counts[minute]
        assert prompt.sum() == day.prompt_sums[minute] and output.sum() == day.output_sums[minute]
        assert np.all((at >= minute * 60.0) & (at < (minute + 1) * 60.0))
    # a window across minute edges holds exactly the requests arriving in it
    at, _, _ = day.requests(90.0, 200.0)
    whole = np.concatenate([day.requests(m * 60.0, (m + 1) * 60.0)[0] for m in range(1, 4)])
    assert np.array_equal(at, whole[(whole >= 90.0) & (whole < 200.0)])


def test_the_day_is_the_trace_stretched_from_the_models_phase():
    early = D.ModelDay(_trace(), 0.0, 2.0, 0, 0, 131072)
    late = D.ModelDay(_trace(), 0.5, 2.0, 0, 0, 131072)
    by_hour = early.hourly(early.counts)
    assert by_hour[1:11].sum() > 2.5 * by_hour[13:23].sum()  # 3 req/s, then 1, stretched x24
    assert late.hourly(late.counts)[13:23].sum() > 2.5 * late.hourly(late.counts)[1:11].sum()
    # lengths come from the trace rows of the hour, clipped to the context
    _, prompt, _ = early.requests(3 * 3600.0, 3 * 3600.0 + 600.0)
    assert set(prompt) == {100}
    clipped = D.ModelDay(_trace(), 0.0, 2.0, 0, 0, max_context=1000)
    _, prompt, output = clipped.requests(18 * 3600.0, 18 * 3600.0 + 600.0)
    assert prompt.max() == 999 and (prompt + output).max() <= 1000
