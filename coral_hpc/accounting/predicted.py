"""What the plans predicted over a range, and why Slurm's books differ. Pure.

Predicted cost = ∫ plan cost per hour dt: each stored plan is in force from its time until the
next plan, or until the deployment stopped (``coral-hpc down``, the daemon stopping: the database's
``down``/``stop`` events), whichever comes first. A stopped deployment plans nothing, so its last
plan must not keep adding to the prediction while nothing is served. Booked cost (sacct) differs
from it for reasons with names, computed from the daemon's replica history at each replica's
planned cost per hour:

- ``pending`` — a plan counts a new replica from its submission; Slurm books it from its start.
  Net of the replica it replaces, which Slurm keeps booking while the successor pends:
  −(successor pending time) + (old replica's time while its successor pended).
- ``startup`` — make-before-break: the old replica runs (booked, not in the plan) while its
  successor starts up (job start → READY).
- ``overlap`` — the old replica still runs after its successor is READY, until it has drained
  and ended.
- ``other`` — the rest: scale-down drain tails, jobs that ran outside any plan, rounding.

``difference = booked − predicted = pending + startup + overlap + other``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coral_hpc.store import PlanRecord, ReplicaRecord


@dataclass(frozen=True)
class Comparison:
    """Booked against predicted cost over one range, the difference in named parts."""

    predicted: float
    booked: float
    pending: float
    startup: float
    overlap: float

    @property
    def difference(self) -> float:
        return self.booked - self.predicted

    @property
    def other(self) -> float:
        return self.difference - self.pending - self.startup - self.overlap

    def to_dict(self) -> dict[str, float | dict[str, float]]:
        return {
            "predicted_cost": self.predicted,
            "booked_cost": self.booked,
            "difference": self.difference,
            "parts": {
                "pending": self.pending,
                "startup": self.startup,
                "overlap": self.overlap,
                "other": self.other,
            },
        }


#: event kinds (``Store.add_event``) after which no plan is in force until the next one
STOP_EVENT_KINDS = ("down", "stop")


def predicted_cost(
    plans: Sequence[PlanRecord], since: float, until: float, stops: Sequence[float] = ()
) -> float:
    """∫ cost per hour over ``[since, until)``, each plan in force until the next one or the
    first of ``stops`` (times the deployment was brought down or its daemon stopped) after it."""
    ordered = sorted(plans, key=lambda p: (p.time, p.id))
    stop_times = sorted(stops)
    total = 0.0
    for index, plan in enumerate(ordered):
        end = ordered[index + 1].time if index + 1 < len(ordered) else until
        end = min([end, *(s for s in stop_times if s >= plan.time)])
        total += plan.cost_per_hour * _overlap(plan.time, end, since, until) / 3600.0
    return total


def compare(
    booked: float,
    plans: Sequence[PlanRecord],
    replicas: Sequence[ReplicaRecord],
    since: float,
    until: float,
    now: float,
    stops: Sequence[float] = (),
) -> Comparison:
    """Booked cost against the plans' prediction over ``[since, min(until, now))``; no plan is
    in force after one of ``stops`` until the next plan (:func:`predicted_cost`)."""
    end_of_range = min(until, now)
    by_id = {r.id: r for r in replicas}
    pending = startup = overlap = 0.0
    for replica in replicas:
        rate = replica.cost_per_hour / 3600.0
        if replica.submitted_at is not None:
            started = replica.started_at
            pend_end = started if started is not None else _end(replica, now)
            pending -= rate * _overlap(replica.submitted_at, pend_end, since, end_of_range)
        old = by_id.get(replica.replaces) if replica.replaces else None
        if old is None or old.started_at is None or replica.submitted_at is None:
            continue
        old_rate = old.cost_per_hour / 3600.0
        old_start, old_end = old.started_at, _end(old, now)
        started = replica.started_at if replica.started_at is not None else _end(replica, now)
        ready = replica.ready_at if replica.ready_at is not None else _end(replica, now)

        window = (old_rate, old_start, old_end, since, end_of_range)
        pending += _booked_old(window, replica.submitted_at, started)
        startup += _booked_old(window, started, ready)
        overlap += _booked_old(window, ready, old_end)
    return Comparison(
        predicted=predicted_cost(plans, since, end_of_range, stops),
        booked=booked,
        pending=pending,
        startup=startup,
        overlap=overlap,
    )


def _booked_old(window: tuple[float, float, float, float, float], a: float, b: float) -> float:
    """Cost of the old replica (rate, alive from start to end) within [a, b) and the range."""
    rate, old_start, old_end, since, until = window
    return rate * _overlap(max(a, old_start), min(b, old_end), since, until)


def _end(replica: ReplicaRecord, now: float) -> float:
    return replica.ended_at if replica.ended_at is not None else now


def _overlap(start: float, end: float, since: float, until: float) -> float:
    return max(0.0, min(end, until) - max(start, since))
