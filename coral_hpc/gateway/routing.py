"""Routing policy: which READY replica of a model takes the next request. Pure; no I/O.

Rule: the replica with the fewest outstanding requests *relative to its weight* (weight = planned
throughput), i.e. the smallest ``outstanding / weight``. Ties — which is every pick when traffic is
light — go to the replica furthest behind its weight share, tracked by smooth weighted round-robin
credits (nginx's SWRR). So at low load the shares equal the weights exactly (not just on average,
as random draws would), and under load a slow or stalled replica gets less work.

Why not power-of-two-choices: P2C exists for many balancers that each see stale load. This gateway
is one process that sees every outstanding count exactly, and a model has a handful of replicas,
so a full scan is both cheaper than two random draws and strictly better informed.

Table swaps compute the difference first, then build the new mapping reusing the surviving
:class:`ReplicaState` objects, so their outstanding counters and health survive a reload and
removed replicas are dropped (SkyPilot replaced the list first and kept stale counters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from coral_hpc.gateway.table import ReplicaRoute, RoutingTable


class ReplicaState:
    """Live state of one replica of one model, kept across table reloads."""

    __slots__ = ("model", "id", "url", "weight", "outstanding", "healthy", "credit", "removed",
                 "served", "failures", "role", "job_id")

    def __init__(self, model: str, route: ReplicaRoute) -> None:
        self.model = model
        self.id = route.id
        self.url = route.url
        self.weight = route.weight
        self.outstanding = 0          # requests sent and not yet finished
        self.healthy = True           # False from a failed request until /health answers again
        self.credit = 0.0             # SWRR credit: how far behind its weight share it is
        self.removed = False          # set when a table reload dropped it
        self.served = 0               # requests routed here (for /internal/routing)
        self.failures = 0             # transport failures seen
        self.role = route.role        # "both", or "prefill"/"decode" of a disaggregated model
        self.job_id = route.job_id    # its Slurm job (None in a table without it)

    def describe(self) -> dict:
        """A JSON-ready view for ``/internal/routing``."""
        return {
            "id": self.id,
            "url": self.url,
            "weight": self.weight,
            "outstanding": self.outstanding,
            "healthy": self.healthy,
            "routed": self.served,
            "failures": self.failures,
            "role": self.role,
            "job_id": self.job_id,    # which Slurm job to look at (squeue, sacct, its logs)
        }


@dataclass
class TableDiff:
    """What a new table changes, computed before anything is mutated."""

    added: list[tuple[str, ReplicaRoute]] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    reweighted: list[tuple[str, str, float, float]] = field(default_factory=list)
    models_added: list[str] = field(default_factory=list)
    models_removed: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.reweighted or self.models_added
                    or self.models_removed)


def diff_tables(
    current: Mapping[str, Iterable[ReplicaState]], new: RoutingTable
) -> TableDiff:
    """What changes between the live replicas and ``new``. A replica is identified by (model, id,
    url): the same id at a new url is another process, so it is removed and added."""
    diff = TableDiff()
    for model in new.models:
        if model not in current:
            diff.models_added.append(model)
    for model in current:
        if model not in new.models:
            diff.models_removed.append(model)
    for model, states in current.items():
        new_routes = {r.id: r for r in new.models.get(model, ())}
        for state in states:
            route = new_routes.get(state.id)
            # the same id at another url, or in another role, is another process: start afresh
            if route is None or route.url != state.url or route.role != state.role:
                diff.removed.append((model, state.id))
            elif route.weight != state.weight:
                diff.reweighted.append((model, state.id, state.weight, route.weight))
    for model, routes in new.models.items():
        old = {s.id: (s.url, s.role) for s in current.get(model, ())}
        for route in routes:
            if old.get(route.id) != (route.url, route.role):
                diff.added.append((model, route))
    return diff


class Router:
    """The live replica sets of every model and the pick rule."""

    def __init__(self) -> None:
        self._models: dict[str, tuple[ReplicaState, ...]] = {}
        self.version: int | None = None

    @property
    def models(self) -> Mapping[str, tuple[ReplicaState, ...]]:
        return self._models

    def replicas(self, model: str) -> tuple[ReplicaState, ...]:
        """Every replica of ``model`` in the current table (healthy or not)."""
        return self._models.get(model, ())

    def ready_count(self, model: str) -> int:
        """How many replicas of ``model`` can take a request now."""
        return sum(1 for s in self._models.get(model, ()) if s.healthy)

    def apply(self, table: RoutingTable) -> tuple[TableDiff, list[ReplicaState]]:
        """Swap to ``table``. Returns the diff and the dropped :class:`ReplicaState` objects (the
        caller closes their connection pools once their outstanding requests finish)."""
        diff = diff_tables(self._models, table)
        dropped_keys = set(diff.removed) | {
            (m, s.id) for m in diff.models_removed for s in self._models[m]
        }
        survivors = {
            (m, s.id): s for m, states in self._models.items() for s in states
            if (m, s.id) not in dropped_keys
        }
        dropped = [
            s for m, states in self._models.items() for s in states if (m, s.id) in dropped_keys
        ]
        new_models: dict[str, tuple[ReplicaState, ...]] = {}
        for model, routes in table.models.items():
            states = []
            for route in routes:
                state = survivors.get((model, route.id))
                if state is None:
                    state = ReplicaState(model, route)
                else:
                    state.weight = route.weight
                states.append(state)
            new_models[model] = tuple(states)
        for state in dropped:
            state.removed = True
        # One assignment: a request sees the old mapping or the new one, never a mix.
        self._models = new_models
        self.version = table.version
        return diff, dropped

    def choose(
        self, model: str, exclude: Iterable[ReplicaState] = (), role: str = "both"
    ) -> ReplicaState | None:
        """The replica of ``model`` for the next request, or None when none is healthy (or all
        healthy ones are in ``exclude``, the replicas this request already failed on). ``role``:
        aggregated replicas (``both``), or one phase of a disaggregated model."""
        best: ReplicaState | None = None
        total = 0.0
        for state in self._models.get(model, ()):
            if not state.healthy or state in exclude or state.role != role:
                continue
            total += state.weight
            state.credit += state.weight
            if best is None:
                best = state
                continue
            # outstanding/weight compared without division; equal load → larger credit wins
            lhs = state.outstanding * best.weight
            rhs = best.outstanding * state.weight
            if lhs < rhs or (lhs == rhs and state.credit > best.credit):
                best = state
        if best is not None:
            best.credit -= total
            best.served += 1
        return best
