"""Scale to zero, the decision: when a model goes cold, wakes and warms again, the hysteresis
that keeps a model used every few minutes warm, and the decide step draining a cold model's
last READY replica. Virtual time: nothing sleeps."""

from __future__ import annotations

from coral_hpc.reconcile import Drain, decide
from coral_hpc.reconcile.actions import Cancel
from coral_hpc.reconcile.idle import IdleRule, IdleTracker, Temperature
from tests.support.virtual_time import VirtualClock
from tests.unit.reconcile_facts import facts, plan, rec

T = 1200.0  # idle_after: 20 min
RULE = IdleRule(idle_after_s=T, wake_timeout_s=300.0)


def _tracker(clock: VirtualClock, *, last_request: float | None = None,
             live: tuple[str, ...] = ()) -> IdleTracker:
    tracker = IdleTracker({"m": RULE})
    tracker.seed({"m": last_request} if last_request is not None else {}, live, clock())
    return tracker


def _run(tracker: IdleTracker, clock: VirtualClock, seconds: float, ready: int = 1,
         request_every: float | None = None, poll: float = 6.0) -> list:
    """Poll every ``poll`` s for ``seconds``, a request every ``request_every`` s (a wake when
    cold), a READY replica whenever the model is not cold; the transitions seen."""
    seen = []
    end = clock.now + seconds
    next_request = clock.now + request_every if request_every else None
    while clock.now < end:
        clock.advance(poll)
        if next_request is not None and clock.now >= next_request:
            change = tracker.wake("m", clock.now)
            seen += [change] if change else []
            next_request += request_every
        up = 0 if tracker.is_cold("m") else ready
        seen += tracker.step(clock.now, {"m": up})
    return seen


def test_idle_for_idle_after_goes_cold_and_not_before():
    clock = VirtualClock(now=10_000.0)
    tracker = _tracker(clock, last_request=clock.now)
    assert _run(tracker, clock, T - 10) == []
    assert tracker.temperature("m", 1) is Temperature.WARM
    changes = _run(tracker, clock, 20)
    assert [c.to for c in changes] == [Temperature.COLD]
    assert "no request for 120" in changes[0].reason
    assert tracker.cold() == {"m"}


def test_a_model_without_requests_or_replicas_starts_cold_and_one_with_replicas_gets_grace():
    clock = VirtualClock(now=500.0)
    fresh = _tracker(clock)
    assert [c.to for c in fresh.step(clock.now, {})] == [Temperature.COLD]
    adopted = _tracker(clock, live=("m",))
    assert adopted.step(clock.now + T - 1, {"m": 1}) == []
    assert [c.to for c in adopted.step(clock.now + T, {"m": 1})] == [Temperature.COLD]


def test_a_request_wakes_a_cold_model_once_and_others_share_the_wake():
    clock = VirtualClock(now=0.0)
    tracker = _tracker(clock)
    tracker.step(clock.now, {})
    clock.advance(3 * T)
    first = tracker.wake("m", clock.now)
    assert first is not None and first.to is Temperature.WAKING
    assert all(tracker.wake("m", clock.now + k) is None for k in range(1, 20))
    assert tracker.temperature("m", 0) is Temperature.WAKING
    # READY after a 10-min start: warm, and its idle time counts from then
    clock.advance(600)
    assert [c.to for c in tracker.step(clock.now, {"m": 1})] == [Temperature.WARM]
    assert tracker.step(clock.now + T - 1, {"m": 1}) == []


def test_a_long_wake_is_not_dropped_while_a_request_is_held():
    tracker = IdleTracker({"m": IdleRule(idle_after_s=60.0, wake_timeout_s=600.0)})
    tracker.seed({}, (), 0.0)
    tracker.step(0.0, {})
    tracker.wake("m", 100.0)
    assert tracker.step(100.0 + 500, {"m": 0}) == []  # past idle_after, within the hold
    assert [c.to for c in tracker.step(100.0 + 600, {"m": 0})] == [Temperature.COLD]


def test_requests_every_few_minutes_never_flap():
    clock = VirtualClock(now=0.0)
    tracker = _tracker(clock, last_request=0.0)
    assert _run(tracker, clock, 8 * 3600, request_every=300) == []


def test_use_just_beyond_idle_after_goes_cold_once_then_stays_warm():
    clock = VirtualClock(now=0.0)
    tracker = _tracker(clock, last_request=0.0)
    changes = _run(tracker, clock, 12 * 3600, request_every=1.5 * T)
    colds = [c for c in changes if c.to is Temperature.COLD]
    assert len(colds) == 1, [(c.to.value, c.at) for c in changes]
    assert tracker.threshold_s("m") == 2 * T
    assert "stays warm" in [c for c in changes if c.to is Temperature.WAKING][-1].reason


def test_the_threshold_doubles_at_most_twice():
    clock = VirtualClock(now=0.0)
    tracker = _tracker(clock, last_request=0.0)
    for _ in range(5):  # cold, then woken at once: five times in a row
        clock.advance(tracker.threshold_s("m"))
        tracker.step(clock.now, {"m": 1})
        assert tracker.is_cold("m")
        clock.advance(60)
        tracker.wake("m", clock.now)
        tracker.step(clock.now, {"m": 1})
    assert tracker.threshold_s("m") == 4 * T


def test_hysteresis_is_what_keeps_it_warm():
    """The same traffic without the doubling flaps every cycle: the rule is doing the work."""
    clock = VirtualClock(now=0.0)
    tracker = _tracker(clock, last_request=0.0)
    tracker.threshold_s = lambda model: T  # type: ignore[method-assign]
    changes = _run(tracker, clock, 12 * 3600, request_every=1.5 * T)
    assert len([c for c in changes if c.to is Temperature.COLD]) > 10


def test_rare_use_goes_cold_after_idle_after_each_time():
    clock = VirtualClock(now=0.0)
    tracker = _tracker(clock, last_request=0.0)
    changes = _run(tracker, clock, 24 * 3600, request_every=3 * T)
    assert len([c for c in changes if c.to is Temperature.COLD]) >= 20
    assert tracker.threshold_s("m") == T


def test_untracked_models_are_always_warm():
    tracker = IdleTracker({"m": RULE})
    tracker.seed({}, (), 0.0)
    assert tracker.wake("other", 1.0) is None and not tracker.is_cold("other")
    assert [c.model for c in tracker.step(0.0, {})] == ["m"]


def test_decide_drains_a_cold_models_last_ready_replica():
    """A plan without the model keeps its last READY replica while it is configured (make
    before break); once cold it is left out of ``configured`` and drains."""
    replicas = facts(rec("r1"), rec("p1", phase="pending", model="m"))
    empty = plan(time=100.0)
    kept = decide(empty, replicas, 100.0, configured=frozenset({"m"}))
    assert not [a for a in kept.actions if isinstance(a, Drain)]
    cold = decide(empty, replicas, 100.0, configured=frozenset({"m"}) - {"m"})
    assert [a.replica_id for a in cold.actions if isinstance(a, Drain)] == ["r1"]
    assert [a.replica_id for a in cold.actions if isinstance(a, Cancel)] == ["p1"]
