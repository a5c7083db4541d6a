"""Scale to zero in virtual time: ``coral-hpc simulate`` applies the daemon's idle rule.

The rule is the daemon's own: :class:`coral_hpc.reconcile.idle.IdleTracker` (idle after
``idle_after``, hysteresis, ``wake_timeout``) and
:func:`coral_hpc.reconcile.idle_plan.planning_inputs` (a cold model is planned at zero demand
and no replica, a warm or waking one at least one). Every step of the simulation
(:func:`coral_hpc.simulate.run.simulate`):

* **Activity**: each model's requests of the step before count as activity (their exact
  arrival times, as the gateway sees them).
* **Cold**: :meth:`~coral_hpc.reconcile.idle.IdleTracker.step` at the step's start; a model that
  goes cold triggers a re-plan (``idle``), which gives it no replica: it costs nothing from then.
* **Wake**: the first request of a cold model wakes it at its arrival and triggers a re-plan
  (``wake``) in that step, not at the next re-plan interval. The replica it gets is READY
  ``startup_s`` after the request (``policy.startup_time_s``, the start-up the simulator
  charges every new replica); it is paid from the step's start (up to a step, 60 s, more than
  the daemon pays: the comparison is not tilted towards scale to zero).
* **Held**: requests arriving while the model wakes (``wake: hold``) wait until the replica is
  READY: they reach it then, and their wait counts in their time to first token; one whose wait
  would pass ``wake_timeout`` is refused (503, as the gateway does). With ``wake: reject`` they
  are refused at once (503 + Retry-After). Every request of one wake shares it.
* **Start**: every model starts warm, as if just used (a whole ``idle_after`` before it can go
  cold), as always-on starts with its replicas up.

A wake whose re-plan gives the model no replica (a plan refused) leaves its requests refused as
any model without a replica; the model goes cold again after ``wake_timeout``. A model that
goes cold and is asked for again within the same step keeps its replica in the plan (the
simulator books no second start-up) but its requests still wait a whole start-up.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.demand import ModelDemand
from coral_hpc.reconcile import Trigger, TriggerKind
from coral_hpc.reconcile.idle import IdleTracker, Temperature, Transition
from coral_hpc.reconcile.idle_plan import idle_rules, planning_inputs
from coral_hpc.simulate.traces import ModelWorkload


@dataclass
class ZeroFigures:
    """One model's scale-to-zero figures over a run."""

    wakes: int = 0
    held: int = 0
    refused_reject: int = 0   #: wake: reject (503 + Retry-After at once)
    refused_timeout: int = 0  #: held longer than wake_timeout
    waits: list[float] = field(default_factory=list)  #: each held request's wait, seconds
    hours_without_replica: float = 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready: counts and the wake waits' p50 / p95 / max (seconds)."""
        waits = np.array(self.waits)
        pct = (lambda q: round(float(np.percentile(waits, q)), 1)) if len(waits) else \
            (lambda q: None)
        return {"wakes": self.wakes, "held": self.held,
                "refused_reject": self.refused_reject, "refused_timeout": self.refused_timeout,
                "wake_wait_s": {"p50": pct(50), "p95": pct(95),
                                "max": round(float(waits.max()), 1) if len(waits) else None},
                "hours_without_replica": round(self.hours_without_replica, 4)}


class _Stream:
    """One model's requests as served: held ones moved to their replica's READY time (with
    their wait), refused ones left out."""

    def __init__(self, load: ModelWorkload) -> None:
        self.load = load
        self.at = load.at.copy()
        self.waited = np.zeros(len(load.at))
        self.keep = np.ones(len(load.at), dtype=bool)
        self.changed = False

    def workload(self) -> ModelWorkload:
        if not self.changed:
            return self.load
        k = self.keep
        return ModelWorkload(self.load.model, self.at[k], self.load.prompt[k],
                             self.load.output[k], self.load.source, self.load.mix,
                             self.waited[k])


class ServedLoads(Mapping[str, ModelWorkload]):
    """Each model's requests as the gateway lets them reach replicas (see :class:`_Stream`)."""

    def __init__(self, streams: Mapping[str, _Stream]) -> None:
        self._streams = streams

    def __getitem__(self, name: str) -> ModelWorkload:
        return self._streams[name].workload()

    def __iter__(self) -> Iterator[str]:
        return iter(self._streams)

    def __len__(self) -> int:
        return len(self._streams)


class ScaleToZero:
    """The idle rule stepped in virtual time for one run (see the module doc)."""

    def __init__(self, deployment: Deployment, loads: Mapping[str, ModelWorkload],
                 startup_s: float) -> None:
        self.tracker = IdleTracker(idle_rules(deployment))
        self.settings = {m.name: scale_to_zero(m, deployment.policy) for m in deployment.models}
        self.startup_s = startup_s
        self.loads = loads
        self.streams = {name: _Stream(load) for name, load in loads.items()}
        self.served = ServedLoads(self.streams)
        self.figures = {name: ZeroFigures() for name in sorted(self.tracker.tracked)}
        self.woken_at: dict[str, float] = {}
        self.ready_at: dict[str, float] = {}  #: when the woken model's replica is READY
        self.seen_until = 0.0
        # every model starts warm, as just used (always-on starts with its replicas up)
        self.tracker.seed({m: 0.0 for m in self.tracker.tracked}, (), 0.0)

    @property
    def active(self) -> bool:
        """True when some model scales to zero."""
        return bool(self.tracker.tracked)

    def follow(self, now: float, dt: float, replicas: Mapping[str, int]) -> list[Trigger]:
        """At the start of the step [now, now + dt) with ``replicas`` per model in force: the
        last step's requests as activity, the idle rule, the wakes of this step; a re-plan
        trigger for each model that went cold or began to wake."""
        if not self.active:
            return []
        changes: list[Transition] = []
        for name in self.tracker.tracked:
            load = self.loads[name]
            idx = load.window(self.seen_until, now)
            if idx.stop > idx.start:
                change = self.tracker.requests_seen(name, float(load.at[idx.stop - 1]))
                changes += [change] if change is not None else []
        self.seen_until = now
        ready = {name: (count if now >= self.ready_at.get(name, -np.inf) else 0)
                 for name, count in replicas.items()}
        changes += self.tracker.step(now, ready)
        for name in sorted(self.tracker.cold()):
            load = self.loads[name]
            idx = load.window(now, now + dt)
            if idx.stop > idx.start:  # its first request wakes it, at its arrival
                at = float(load.at[idx.start])
                change = self.tracker.wake(name, at)
                if change is not None:
                    changes.append(change)
                    self.figures[name].wakes += 1
                    self.woken_at[name], self.ready_at[name] = at, at + self.startup_s
        return [Trigger(TriggerKind.IDLE if c.to is Temperature.COLD else TriggerKind.WAKE,
                        f"{c.model} {c.to.value}: {c.reason}")
                for c in changes if c.to in (Temperature.COLD, Temperature.WAKING)]

    def planning_inputs(self, deployment: Deployment, demand: Mapping[str, ModelDemand]
                        ) -> tuple[Deployment, Mapping[str, ModelDemand]]:
        """What the planner is asked with: the daemon's own
        :func:`~coral_hpc.reconcile.idle_plan.planning_inputs`."""
        if not self.active:
            return deployment, demand
        return planning_inputs(deployment, demand, self.tracker)

    def hold(self, now: float, dt: float, replicas: Mapping[str, int],
             figures: Mapping[str, Any]) -> None:
        """The step [now, now + dt) under the plan in force (``replicas`` per model): requests
        of a waking model are held until its replica is READY, or refused; ``figures`` (the
        run's :class:`~coral_hpc.simulate.run.ModelFigures`) count the refused ones."""
        for name, mine in self.figures.items():
            if replicas.get(name, 0) == 0:
                mine.hours_without_replica += dt / 3600.0
                continue
            ready = self.ready_at.get(name)
            if ready is None or ready <= now:
                continue
            stream = self.streams[name]
            start = max(now, self.woken_at[name])
            idx = stream.load.window(start, min(now + dt, ready))
            if idx.stop <= idx.start:
                continue
            stream.changed = True
            wait = ready - stream.load.at[idx]
            setting = self.settings[name]
            if setting.wake == "reject":
                refused = np.ones(len(wait), dtype=bool)
                mine.refused_reject += len(wait)
            else:
                refused = wait > setting.wake_timeout_s
                mine.refused_timeout += int(refused.sum())
            positions = np.arange(idx.start, idx.stop)
            stream.keep[positions[refused]] = False
            held = positions[~refused]
            stream.at[held] = ready
            stream.waited[held] = wait[~refused]
            mine.held += len(held)
            mine.waits.extend(float(w) for w in wait[~refused])
            model = figures[name]
            model.requests += int(refused.sum())
            model.refused += int(refused.sum())
            model.output_tokens += int(stream.load.output[positions[refused]].sum())

    def finish(self, span_s: float, figures: Mapping[str, Any]) -> None:
        """Held requests whose replica is READY only after the run's end: counted (they were
        asked for) and missed (not answered within the run)."""
        for name in self.figures:
            stream = self.streams[name]
            late = stream.keep & (stream.at >= span_s) & (stream.load.at < span_s)
            figures[name].requests += int(late.sum())
            figures[name].output_tokens += int(stream.load.output[late].sum())

    def report(self) -> dict[str, dict[str, Any]]:
        """Per model scaled to zero: :meth:`ZeroFigures.summary`."""
        return {name: f.summary() for name, f in self.figures.items()}
