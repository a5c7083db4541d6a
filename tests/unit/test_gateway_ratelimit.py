"""Per-key requests and tokens per minute over a sliding window (virtual clock)."""

from __future__ import annotations

import pytest

from coral_hpc.gateway.ratelimit import WINDOW_S, RateLimiter


def test_rpm_admits_that_many_in_any_minute_then_says_when():
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    for i in range(3):
        now[0] = 100.0 + 10 * i                       # at 100, 110, 120
        assert limiter.admit("a", rpm=3, tpm=None) is None
    now[0] = 130.0
    assert limiter.admit("a", rpm=3, tpm=None) == ("rpm", pytest.approx(30.0))  # 100 + 60 - 130
    assert limiter.admit("b", rpm=3, tpm=None) is None     # another key is not held back
    now[0] = 100.0 + WINDOW_S                         # the first request left the window
    assert limiter.admit("a", rpm=3, tpm=None) is None
    assert limiter.admit("a", rpm=3, tpm=None)[0] == "rpm"  # refused ones were not counted


def test_tpm_holds_a_key_back_until_enough_tokens_age_out():
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert limiter.admit("a", rpm=None, tpm=1000) is None
    limiter.spent("a", 600)                           # at 0
    now[0] = 20.0
    assert limiter.admit("a", rpm=None, tpm=1000) is None
    limiter.spent("a", 500)                           # at 20: 1,100 in the window
    now[0] = 30.0
    # below the limit again once the first 600 leave, at 60
    assert limiter.admit("a", rpm=None, tpm=1000) == ("tpm", pytest.approx(30.0))
    now[0] = 60.0
    assert limiter.admit("a", rpm=None, tpm=1000) is None


def test_no_limits_admit_everything():
    limiter = RateLimiter(clock=lambda: 0.0)
    assert all(limiter.admit("a", None, None) is None for _ in range(10_000))
