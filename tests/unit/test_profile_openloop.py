"""The open-loop capacity search and its judgement (coral_hpc.profile.openloop), on synthetic
outcomes: the search brackets and bisects, the capacity is never above a rate that missed, and
a phase whose generator fell behind its schedule is not met whatever its share within."""

from __future__ import annotations

import pytest

from coral_hpc.profile.openloop import MAX_BEHIND_SHARE, Phase, Timing, search_capacity


def _threshold(capacity: float):
    calls: list[float] = []

    def met_at(rate: float) -> bool:
        calls.append(rate)
        return rate <= capacity

    return met_at, calls


def test_the_search_climbs_until_a_miss_then_bisects_once_then_repeats_what_it_found():
    met_at, calls = _threshold(10.0)
    search = search_capacity(met_at, 4.0, factor=1.5, bisections=1)
    # 4, 6, 9 met; 13.5 missed; then sqrt(9 * 13.5) = 11.02 missed; 9 met again
    assert calls == pytest.approx([4.0, 6.0, 9.0, 13.5, (9.0 * 13.5) ** 0.5, 9.0])
    assert search.capacity == 9.0 and search.confirmed


def test_the_search_descends_from_a_start_above_capacity():
    met_at, calls = _threshold(3.0)
    search = search_capacity(met_at, 10.0, factor=2.0, bisections=1, confirmations=0)
    # 10, 5 missed; 2.5 met; sqrt(2.5 * 5) = 3.54 missed
    assert calls == pytest.approx([10.0, 5.0, 2.5, (2.5 * 5.0) ** 0.5])
    assert search.capacity == 2.5
    assert not search.confirmed  # met once: no repeat was asked for


def test_a_rate_met_once_and_missed_when_repeated_is_not_claimed():
    # 4 met, 6 missed, sqrt(24) met by luck; its repeat misses, so the claim drops to 4,
    # whose repeat holds
    outcomes = iter([True, False, True, False, True])
    calls: list[float] = []
    search = search_capacity(lambda rate: calls.append(rate) or next(outcomes), 4.0,
                             factor=1.5, bisections=1)
    assert calls == pytest.approx([4.0, 6.0, 24 ** 0.5, 24 ** 0.5, 4.0])
    assert search.capacity == 4.0 and search.confirmed


def test_repeats_are_bounded_and_an_unconfirmed_claim_says_so():
    # every repeat misses: two repeats, then the search stops with the rate met once below
    outcomes = iter([True, True, False, True, False, False])
    calls: list[float] = []
    search = search_capacity(lambda rate: calls.append(rate) or next(outcomes), 4.0,
                             factor=1.5, bisections=1, confirmations=2)
    # 4, 6 met; 9 missed; sqrt(54) met; its repeat missed; 6's repeat missed: 4 is left
    assert calls == pytest.approx([4.0, 6.0, 9.0, 54 ** 0.5, 54 ** 0.5, 6.0])
    assert search.capacity == 4.0 and not search.confirmed


def test_when_the_lowest_rate_met_misses_its_repeat_the_search_steps_below_it():
    # the real engine on a busy 2-core host: 161 met, 242 and 198 missed, 161's repeat
    # missed (79 % within). Nothing below 161 was tried, so the claim would be 0 and the
    # layout left with no capacity: the search steps down to 161 / 1.5 and repeats that.
    outcomes = iter([True, False, False, False, True, True])
    calls: list[float] = []
    search = search_capacity(lambda rate: calls.append(rate) or next(outcomes), 161.0,
                             factor=1.5, bisections=1, confirmations=2)
    low = 161.0 / 1.5
    assert calls == pytest.approx([161.0, 241.5, (161.0 * 241.5) ** 0.5, 161.0, low, low])
    assert search.capacity == pytest.approx(low) and search.confirmed


def test_stepping_down_is_bounded_by_the_misses_allowed():
    # 161 met once, then every later phase misses: two misses after the search, then stop
    outcomes = iter([True, False, False, False, False])
    calls: list[float] = []
    search = search_capacity(lambda rate: calls.append(rate) or next(outcomes), 161.0,
                             factor=1.5, bisections=1, confirmations=2)
    assert calls == pytest.approx([161.0, 241.5, (161.0 * 241.5) ** 0.5, 161.0, 161.0 / 1.5])
    assert search.capacity == 0.0 and not search.confirmed


@pytest.mark.parametrize("capacity", [0.7, 3.3, 12.0, 55.0])
def test_the_capacity_found_is_met_and_within_one_bisection_step(capacity):
    met_at, _ = _threshold(capacity)
    found = search_capacity(met_at, 5.0, factor=1.5, bisections=1).capacity
    assert found <= capacity
    assert found >= capacity / 1.5 ** 0.5 - 1e-9


def test_noise_never_raises_the_capacity_above_a_missed_rate():
    outcomes = iter([True, False, True])  # 4 met, 6 missed, then sqrt(24) met

    search = search_capacity(lambda rate: next(outcomes), 4.0, factor=1.5, bisections=1,
                             confirmations=0)
    assert search.capacity == pytest.approx(24 ** 0.5)
    search.tried.append((3.0, False))  # a lower rate missed too: nothing above it counts
    assert search.capacity == 0.0


def test_no_rate_met_gives_zero_and_the_search_stops_at_its_bounds():
    calls: list[float] = []
    search = search_capacity(lambda rate: calls.append(rate) or False, 1.0, factor=2.0,
                             max_phases=8, min_rate=0.05)
    assert search.capacity == 0.0
    assert calls == [1.0, 0.5, 0.25, 0.125, 0.0625]  # the next, 0.031, is below min_rate


def _phase(timings, behind_s=0.0, late_p99_s=0.0):
    return Phase(rate=1.0, seconds=20.0, timings=tuple(timings), late_p99_s=late_p99_s,
                 behind_at_end_s=behind_s, client_cpu_s=0.5, wall_s=2.0)


def test_a_failed_request_is_not_within_and_both_slos_count():
    phase = _phase([Timing(0.5, 0.05)] * 18 + [Timing(3.0, 0.05), None])
    assert phase.within(2.0, 0.1) == pytest.approx(0.9)
    assert phase.failed == 1
    assert not phase.met(2.0, 0.1)
    assert _phase([Timing(0.5, 0.05)] * 20).within(2.0, 0.04) == 0.0
    assert _phase([Timing(0.5, 0.05)] * 20).met(2.0, 0.1)
    assert _phase([Timing(0.5, 0.05)] * 20).client_cores() == 0.25


def test_a_generator_that_fell_behind_did_not_offer_its_rate():
    on_time = _phase([Timing(0.1, 0.01)] * 40, behind_s=MAX_BEHIND_SHARE * 20.0)
    behind = _phase([Timing(0.1, 0.01)] * 40, behind_s=MAX_BEHIND_SHARE * 20.0 + 0.01)
    assert on_time.met(2.0, 0.1)
    assert behind.within(2.0, 0.1) == 1.0 and not behind.met(2.0, 0.1)
    # a moment's delay mid-phase (a late request or two) leaves the rate offered
    assert _phase([Timing(0.1, 0.01)] * 40, behind_s=0.0, late_p99_s=0.8).met(2.0, 0.1)


def test_the_profile_repeats_its_capacity_with_other_arrival_times(monkeypatch):
    """``coral-hpc profile``'s search: the repeat of the rate found draws another seed (a
    replay of the same arrival times would repeat the same luck), and both phases are recorded
    with which one is the repeat."""
    from coral_hpc.profile import measure, openloop

    seeds: list[tuple[float, str]] = []

    def phase(url, model, rate, *, seed, **_kw):
        seeds.append((rate, seed))
        timing = openloop.Timing(0.1, 0.01) if rate <= 3.0 else openloop.Timing(9.0, 0.01)
        return openloop.Phase(rate, 1.0, (timing,) * 40, 0.0, 0.0, 0.0, 1.0)

    monkeypatch.setattr(openloop, "poisson_phase", phase)
    record: list = []
    lines: list[str] = []
    found = measure.open_loop_capacity("http://x", "m", 64, 8, 1.0, 0.2, 2.0, None, record,
                                       lines.append)
    assert found == 3.0  # 2, 3 met; 4.5 and sqrt(13.5) missed; 3 met again
    assert [r for r, _ in seeds].count(found) == 2
    first, repeat = [s for r, s in seeds if r == found]
    assert first != repeat
    assert [p["repeat"] for p in record if p["requests_per_s"] == found] == [0, 1]
    assert "met twice" in lines[-1]


def test_the_phase_length_asked_is_each_phase_s_unless_too_few_requests_would_come(monkeypatch):
    """``coral-hpc profile --phase-seconds``: every phase of the search lasts that long, or
    long enough to expect MIN_REQUESTS requests at a low rate; each record says how long."""
    from coral_hpc.profile import measure, openloop

    lengths: dict[float, float] = {}

    def phase(url, model, rate, *, seconds, **_kw):
        lengths[rate] = seconds
        timing = openloop.Timing(0.1, 0.01) if rate <= 3.0 else openloop.Timing(9.0, 0.01)
        return openloop.Phase(rate, seconds, (timing,) * 40, 0.0, 0.0, 0.0, 1.0)

    monkeypatch.setattr(openloop, "poisson_phase", phase)
    record: list = []
    measure.open_loop_capacity("http://x", "m", 64, 8, 1.0, 0.2, 2.0, None, record,
                               lambda _m: None, phase_s=12.0)
    assert lengths == {r: max(12.0, openloop.MIN_REQUESTS / r) for r in lengths}
    assert lengths[4.5] == 12.0 and lengths[2.0] == 20.0  # 40 requests at 2/s take 20 s
    assert {p["requests_per_s"]: p["seconds"] for p in record} == {
        round(r, 4): round(s, 1) for r, s in lengths.items()}
