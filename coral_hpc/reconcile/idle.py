"""Scale to zero: which models are cold (their replicas drain) and which are warm. Pure.

The rule, for a model with ``idle_after`` T (``coral_hpc.config.scale``):

* **Cold** when no request came for its idle threshold: the plan gives it no replica (its
  demand counts as zero, its ``min_replicas`` is 0) and the decide step may drain its last
  READY replica (the normal drain path: out of the routing table, then cancelled).
* **Warm** otherwise: the plan keeps at least one replica of it, whatever its measured demand.
* **Waking**: warm, but no READY replica yet (the display and the gateway tell it from warm by
  the READY count). A wake begins with a request for a cold model (the gateway's wake signal,
  or requests the demand scrape saw); every request during a wake shares it. A waking model
  goes cold again only when nobody asked for it for the longer of its threshold and its
  ``wake_timeout`` (a held request is still waiting meanwhile).
* Idle time counts from the later of the last request and the moment the model became READY
  after a wake (a wake that took minutes gets its whole threshold once it serves).

**Hysteresis.** The threshold is T × 2^k. k counts the model's wakes in a row that came less
than T after it went cold (it was needed again at once: going cold was a mistake), at most 2,
so the threshold is at most 4 T; a wake after a cold spell of T or more sets k back to 0. A model
used every few minutes (less than T apart) never goes cold; one used every T to 2 T goes cold
once and then stays warm; one used rarely (more than 2 T apart) goes cold after T each time.

A restarted daemon starts afresh from the stored requests (k = 0), as the plan history does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: the threshold doubles at most this many times (4 × idle_after)
MAX_DOUBLINGS = 2


class Temperature(str, enum.Enum):
    """What a model with ``idle_after`` looks like from outside (``status``, the gateway)."""

    WARM = "warm"      #: a READY replica serves it
    WAKING = "waking"  #: wanted, no READY replica yet
    COLD = "cold"      #: idle: no replica, none planned until a request comes


@dataclass(frozen=True)
class IdleRule:
    """One model's settings: ``idle_after_s`` (T) and ``wake_timeout_s``."""

    idle_after_s: float
    wake_timeout_s: float


@dataclass(frozen=True)
class Transition:
    """A model went cold or began to wake, and why (an event for people)."""

    model: str
    to: Temperature
    at: float
    reason: str


@dataclass
class _State:
    last_activity: float | None = None
    cold_since: float | None = None
    waking_since: float | None = None
    doublings: int = 0
    #: cold because it idled (not because nothing was on record): a quick wake is a flap
    idled: bool = False


class IdleTracker:
    """The temperature of each model with ``idle_after``; models without it are always warm
    and not tracked. Fed requests, wakes and READY counts; :meth:`step` applies the rule."""

    def __init__(self, rules: Mapping[str, IdleRule]):
        self._rules = dict(rules)
        self._states: dict[str, _State] = {}
        self.seeded = False

    def configure(self, rules: Mapping[str, IdleRule]) -> None:
        """Use new settings (a reload); models that lost ``idle_after`` are warm from now."""
        self._rules = dict(rules)
        for model in list(self._states):
            if model not in self._rules:
                del self._states[model]

    def seed(self, last_request: Mapping[str, float], live: Iterable[str], now: float) -> None:
        """First look after a start: each model's last stored request (if any) and the models
        with live replicas. A model with neither is cold at once; a model with live replicas
        and no request on record gets a whole threshold from ``now`` before it goes cold."""
        serving = set(live)
        for model in self._rules:
            found = last_request.get(model)
            if model in serving:
                found = now if found is None else found
            state = self._states.setdefault(model, _State())
            state.last_activity = found
        self.seeded = True

    @property
    def rules(self) -> Mapping[str, IdleRule]:
        """Each tracked model's rule."""
        return dict(self._rules)

    def force_cold(self, model: str, now: float) -> None:
        """Make ``model`` cold now (a wake that can never succeed), its threshold back to T."""
        if model in self._rules:
            state = self._states.setdefault(model, _State())
            state.cold_since, state.waking_since, state.doublings = now, None, 0
            state.idled = False

    @property
    def tracked(self) -> frozenset[str]:
        """The models with ``idle_after``."""
        return frozenset(self._rules)

    def threshold_s(self, model: str) -> float:
        """Idle time after which ``model`` goes cold now (T × 2^k)."""
        state = self._states.get(model) or _State()
        return self._rules[model].idle_after_s * (2 ** state.doublings)

    def is_cold(self, model: str) -> bool:
        """True when ``model`` is tracked and cold."""
        state = self._states.get(model)
        return state is not None and state.cold_since is not None

    def is_waking(self, model: str) -> bool:
        """True when a wake of ``model`` has begun and no READY replica was seen since."""
        state = self._states.get(model)
        return state is not None and state.waking_since is not None

    def waking_since(self, model: str) -> float | None:
        """When the current wake of ``model`` began (None: not waking)."""
        state = self._states.get(model)
        return None if state is None else state.waking_since

    def cold(self) -> frozenset[str]:
        """The models cold now."""
        return frozenset(m for m in self._rules if self.is_cold(m))

    def temperature(self, model: str, ready: int) -> Temperature:
        """Cold, waking (wanted, ``ready`` is 0) or warm."""
        if self.is_cold(model):
            return Temperature.COLD
        return Temperature.WARM if ready > 0 else Temperature.WAKING

    def requests_seen(self, model: str, at: float) -> Transition | None:
        """Requests for ``model`` arrived up to ``at``: they count as activity and wake a cold
        model (a wake signal lost on the way is made up for here)."""
        if model not in self._rules:
            return None
        state = self._states.setdefault(model, _State())
        if state.cold_since is not None:
            return self.wake(model, at)
        state.last_activity = at if state.last_activity is None else max(state.last_activity, at)
        return None

    def wake(self, model: str, at: float) -> Transition | None:
        """A request for ``model`` at ``at``: a cold model begins to wake (a :class:`Transition`);
        a waking or warm one only notes the activity (None: the request shares that wake)."""
        if model not in self._rules:
            return None
        state = self._states.setdefault(model, _State())
        state.last_activity = at if state.last_activity is None else max(state.last_activity, at)
        if state.cold_since is None:
            return None
        cold_for = at - state.cold_since
        if state.idled and cold_for < self._rules[model].idle_after_s:
            state.doublings = min(MAX_DOUBLINGS, state.doublings + 1)
        else:
            state.doublings = 0
        state.cold_since = None
        state.waking_since = at
        reason = (f"a request after {cold_for:.0f}s cold" if state.idled
                  else "a request (no earlier one on record)")
        if state.doublings:
            reason += (f"; woken soon after going cold, so it now stays warm "
                       f"{self.threshold_s(model):.0f}s without requests")
        return Transition(model, Temperature.WAKING, at, reason)

    def step(self, now: float, ready: Mapping[str, int]) -> list[Transition]:
        """Apply the rule at ``now`` given each model's READY replicas; what changed."""
        out: list[Transition] = []
        for model, rule in self._rules.items():
            state = self._states.setdefault(model, _State())
            if state.cold_since is not None:
                continue
            if state.waking_since is not None and ready.get(model, 0) > 0:
                # woken: its idle time starts now, not at the request that woke it
                state.waking_since = None
                state.last_activity = max(state.last_activity or now, now)
                out.append(Transition(model, Temperature.WARM, now, "a replica is READY"))
                continue
            limit = self.threshold_s(model)
            if state.waking_since is not None:
                limit = max(limit, rule.wake_timeout_s)
            idle = None if state.last_activity is None else now - state.last_activity
            if idle is None or idle >= limit:
                state.cold_since = now
                state.waking_since = None
                state.idled = idle is not None
                why = ("no request on record" if idle is None
                       else f"no request for {idle:.0f}s (idle_after {limit:.0f}s)")
                out.append(Transition(model, Temperature.COLD, now, why))
        return out
