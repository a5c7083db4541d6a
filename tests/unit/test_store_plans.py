"""Store.plans_between: the plan in force at the range start, then every later plan before its
end — what ``coral-hpc cost`` integrates the predicted cost over."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral_hpc.accounting.predicted import predicted_cost
from coral_hpc.store import open_store


@pytest.fixture
def store(tmp_path: Path):
    opened = open_store(tmp_path / "coral.db")
    yield opened
    opened.close()


def _add(store, time: float, cost: float) -> int:
    return store.add_plan(time, cost, [{"template_id": f"t{int(time)}", "count": 1}], {"m": 1.0})


def test_the_plan_in_force_at_since_comes_first_then_later_ones(store):
    ids = {t: _add(store, t, c) for t, c in ((10.0, 1.0), (20.0, 2.0), (30.0, 3.0), (40.0, 4.0))}
    plans = store.plans_between(25.0, 40.0)
    # 20 is in force at 25; 30 starts inside; 40 starts at the (exclusive) end
    assert [p.id for p in plans] == [ids[20.0], ids[30.0]]
    assert plans[0].rows == [{"template_id": "t20", "count": 1}]
    assert plans[0].demand == {"m": 1.0}


def test_a_plan_made_exactly_at_since_is_the_one_in_force(store):
    _add(store, 10.0, 1.0)
    at = _add(store, 20.0, 2.0)
    assert [p.id for p in store.plans_between(20.0, 100.0)] == [at]


def test_a_range_before_the_first_plan_holds_only_later_plans(store):
    assert store.plans_between(0.0, 100.0) == []
    first = _add(store, 50.0, 1.0)
    assert [p.id for p in store.plans_between(0.0, 100.0)] == [first]
    assert store.plans_between(0.0, 50.0) == []


def test_after_the_last_plan_that_plan_is_still_in_force(store):
    _add(store, 10.0, 1.0)
    last = _add(store, 20.0, 2.0)
    assert [p.id for p in store.plans_between(1000.0, 2000.0)] == [last]


def test_predicted_cost_over_the_range_uses_exactly_those_plans(store):
    _add(store, 0.0, 3600.0)      # 1 per second
    _add(store, 100.0, 7200.0)    # 2 per second
    _add(store, 200.0, 36000.0)   # outside the range: must not count
    plans = store.plans_between(50.0, 150.0)
    # 50 s at 1/s + 50 s at 2/s
    assert predicted_cost(plans, 50.0, 150.0) == pytest.approx(150.0)
