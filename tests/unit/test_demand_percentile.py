"""policy.plan_for: the rate a plan is sized for — the mean, or a percentile of the arrival rate
over short windows (coral_hpc.demand), and how the policy is validated."""

from __future__ import annotations

import re

import numpy as np
import pytest

from coral_hpc.config.policy import MAX_DEMAND_WINDOWS, MIN_DEMAND_WINDOWS
from coral_hpc.demand import (
    ArrivalWindows,
    demand_basis,
    deployment_demand,
    plan_for_words,
    planned_for_lines,
    rate_percentile,
)
from coral_hpc.errors import ConfigError
from coral_hpc.store import DemandInterval
from tests.support.demand_deployment import demand_deployment

#: 20 windows of 10 s at 1 req/s, then a burst: 19 × 10 arrivals and one window of 210
BURST = (10,) * 19 + (210,)
#: the same mean (2 req/s) spread evenly
EVEN = (20,) * 20


# --------------------------------------------------------------------------- the percentile


def test_percentile_of_the_window_rates_interpolates_between_windows():
    counts = [0, 10, 20, 30, 40]  # rates 0, 1, 2, 3, 4 req/s in 10-s windows
    assert rate_percentile(counts, 10.0, 50) == pytest.approx(2.0)
    assert rate_percentile(counts, 10.0, 100) == pytest.approx(4.0)
    assert rate_percentile(counts, 10.0, 0) == pytest.approx(0.0)
    # rank (5 - 1) × 0.95 = 3.8: between 3 and 4 req/s
    assert rate_percentile(counts, 10.0, 95) == pytest.approx(3.8)
    assert rate_percentile(list(reversed(counts)), 10.0, 95) == pytest.approx(3.8)


def test_an_empty_window_is_a_rate_of_zero_not_a_missing_one():
    with_empty = rate_percentile([0, 0, 0, 30], 10.0, 50)
    assert with_empty == pytest.approx(0.0)
    assert rate_percentile([30], 10.0, 50) == pytest.approx(3.0)
    assert rate_percentile([0] * 20, 10.0, 95) == 0.0


def test_a_burst_lifts_the_95th_percentile_far_above_the_mean():
    mean = sum(BURST) / (len(BURST) * 10.0)
    p95 = rate_percentile(BURST, 10.0, 95)
    assert mean == pytest.approx(2.0)
    # rank 19 × 0.95 = 18.05: 5 % of the way from 1 req/s to the burst's 21 req/s
    assert p95 == pytest.approx(1.0 + 0.05 * 20.0)
    assert rate_percentile(BURST, 10.0, 100) == pytest.approx(21.0)
    assert rate_percentile(EVEN, 10.0, 95) == pytest.approx(2.0)


def test_the_percentile_is_numpys_linear_percentile_of_the_rates():
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 20, 61, 360):
        counts = rng.poisson(rng.uniform(0, 30), n).tolist()
        for q in (50, 90, 95, 99.5, 100):
            assert rate_percentile(counts, 10.0, q) == pytest.approx(
                float(np.percentile(np.array(counts) / 10.0, q)), abs=1e-12), (n, q)


def test_no_window_has_no_percentile_and_bad_arguments_are_refused():
    assert rate_percentile([], 10.0, 95) is None
    with pytest.raises(ValueError, match="window_s"):
        rate_percentile([1], 0.0, 95)
    with pytest.raises(ValueError, match="percentile"):
        rate_percentile([1], 10.0, 101)


# --------------------------------------------------------------------------- what is sized for


def _measured_auto(rps: float) -> list[DemandInterval]:
    return [DemandInterval(0.0, 200.0, "auto", int(rps * 200), 0, 0, 0)]


def test_the_mean_policy_sizes_for_the_mean_whatever_the_windows_say():
    deployment = demand_deployment()
    assert deployment.policy.plan_for == "mean" and deployment.policy.plan_percentile is None
    demand = deployment_demand(deployment, _measured_auto(2.0), windows={
        "auto": ArrivalWindows(10.0, BURST), "declared": ArrivalWindows(10.0, BURST)})
    for item in demand.values():
        assert item.sized == pytest.approx(item.requests_per_s)
        assert item.planned_rps == pytest.approx(item.requests_per_s * 1.2)
        assert item.basis == "the mean rate"


def test_p95_sizes_a_measured_model_for_its_95th_percentile_window_rate():
    deployment = demand_deployment("plan_for: p95, demand_headroom: 0.25")
    bursty = deployment_demand(deployment, _measured_auto(0.5),
                               windows={"auto": ArrivalWindows(10.0, BURST)})["auto"]
    assert bursty.requests_per_s == pytest.approx(0.5)  # the mean is still shown
    assert bursty.sized == pytest.approx(2.0)
    assert bursty.planned_rps == pytest.approx(2.0 * 1.25)
    assert bursty.basis == "the p95 of 20 windows"


def test_p95_never_sizes_below_the_mean():
    deployment = demand_deployment("plan_for: p95")
    item = deployment_demand(deployment, _measured_auto(3.0),
                             windows={"auto": ArrivalWindows(10.0, EVEN)})["auto"]
    assert item.sized == pytest.approx(3.0)
    assert item.basis == "the mean: above the p95 of 20 windows"


def test_a_declared_model_gets_its_rate_times_the_measured_burstiness():
    deployment = demand_deployment("plan_for: p95")
    bursty = deployment_demand(deployment, [],
                               windows={"declared": ArrivalWindows(10.0, BURST)})["declared"]
    # p95 / mean of the windows = 2.0 / 2.0 ... on a 2 req/s declared rate
    assert bursty.requests_per_s == pytest.approx(2.0)
    assert bursty.sized == pytest.approx(2.0 * (2.0 / 2.0))
    spiky = (0,) * 19 + (400,)  # all of it in one window: p95 = 2 req/s, mean 2 req/s
    heavy = (5,) * 10 + (35,) * 10  # mean 2 req/s, p95 3.5 req/s
    item = deployment_demand(deployment, [],
                             windows={"declared": ArrivalWindows(10.0, heavy)})["declared"]
    assert item.sized == pytest.approx(2.0 * 3.5 / 2.0)
    assert item.basis == "declared × 1.75 (p95/mean of 20 windows)"
    # a percentile below the windows' mean never plans below the declared rate
    low = deployment_demand(deployment, [],
                            windows={"declared": ArrivalWindows(10.0, spiky)})["declared"]
    assert low.sized == pytest.approx(2.0)


def test_without_windows_the_plan_is_sized_for_the_mean_and_says_why():
    deployment = demand_deployment("plan_for: p99, demand_window_s: 5")
    demand = deployment_demand(deployment, _measured_auto(1.0),
                               windows={"declared": ArrivalWindows(5.0, (0,) * 20)})
    assert demand["auto"].sized == pytest.approx(1.0)
    assert demand["auto"].basis == "the mean: no window counted yet"
    assert demand["declared"].sized == pytest.approx(2.0)
    assert "nothing arrived in the last 20 windows" in demand["declared"].basis
    other = deployment_demand(deployment, _measured_auto(1.0),
                              windows={"auto": ArrivalWindows(10.0, BURST)})["auto"]
    assert other.sized == pytest.approx(1.0) and "10 s windows, not 5 s" in other.basis


def test_only_the_newest_policy_windows_count():
    deployment = demand_deployment("plan_for: p100, replan_interval_s: 60")
    assert deployment.policy.demand_windows == MIN_DEMAND_WINDOWS
    old_burst = (500,) + (10,) * MIN_DEMAND_WINDOWS
    item = deployment_demand(deployment, _measured_auto(1.0),
                             windows={"auto": ArrivalWindows(10.0, old_burst)})["auto"]
    assert item.sized == pytest.approx(1.0)  # the burst is 21 windows old: gone


def test_the_stored_basis_and_the_lines_people_read():
    deployment = demand_deployment("plan_for: p95")
    demand = deployment_demand(deployment, _measured_auto(0.5),
                               windows={"auto": ArrivalWindows(10.0, BURST)})
    basis = demand_basis(demand.values())
    assert basis["auto"] == {"mean_rps": 0.5, "sized_rps": 2.0, "planned_rps": 2.4,
                             "basis": "the p95 of 20 windows"}
    assert plan_for_words(deployment.policy) == "p95 of the 10 s rate"
    lines = planned_for_lines("p95 of the 10 s rate", {n: b["basis"] for n, b in basis.items()})
    assert lines[0] == "sized for (policy.plan_for: p95 of the 10 s rate):"
    assert "  auto: the p95 of 20 windows" in lines
    assert planned_for_lines("mean", {"a": "the mean rate", "b": "the mean rate"}) == [
        "sized for the mean rate (policy.plan_for: mean)"]


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize("value", ["mean", "p95", "p50", "p99.5", "p100"])
def test_plan_for_takes_mean_or_a_percentile(value):
    policy = demand_deployment(f"plan_for: '{value}'").policy
    assert policy.plan_for == value
    assert policy.plan_percentile == (None if value == "mean" else float(value[1:]))


@pytest.mark.parametrize(("policy", "field", "phrase"), [
    ("plan_for: p49", "policy.plan_for", "'mean' or 'pNN'"),
    ("plan_for: p101", "policy.plan_for", "from 50 to 100"),
    ("plan_for: 95th", "policy.plan_for", "'mean' or 'pNN'"),
    ("plan_for: average", "policy.plan_for", "'mean' or 'pNN'"),
    ("plan_for: 95", "policy.plan_for", "write p95"),
    ("demand_window_s: 0", "policy.demand_window_s", "greater than or equal to 1"),
    ("demand_window_s: 3600", "policy.demand_window_s", "less than or equal to 600"),
])
def test_a_bad_plan_for_or_window_names_file_line_and_field(policy, field, phrase):
    with pytest.raises(ConfigError) as info:
        demand_deployment(policy)
    problem = next(p for p in info.value.problems if f": {field}: " in p)
    assert re.match(r"m\.yaml:\d+: ", problem), problem
    assert phrase in problem, problem


def test_a_percentile_covers_the_re_plan_interval_within_bounds():
    assert demand_deployment().policy.demand_windows == MIN_DEMAND_WINDOWS  # 60 s: 6 windows → 20
    assert demand_deployment("replan_interval_s: 600").policy.demand_windows == 60
    assert demand_deployment("replan_interval_s: 605").policy.demand_windows == 61
    assert demand_deployment("replan_interval_s: 86400").policy.demand_windows == MAX_DEMAND_WINDOWS
