"""Publish the routing table: every configured model with its READY replicas, weight = planned
throughput. Written atomically (``coral_hpc.gateway.table``) and only when it changes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from coral_hpc.gateway.table import (
    ReplicaRoute,
    RoutingTable,
    RoutingTableError,
    WakeInfo,
    read_routing_table,
    write_routing_table,
)
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, ReplicaStatus


def ready_routes(
    models: Iterable[str],
    facts: Sequence[ReplicaFacts],
    statuses: dict[str, ReplicaStatus],
) -> dict[str, tuple[ReplicaRoute, ...]]:
    """Model → READY replicas (sorted by id, so an unchanged set compares equal)."""
    routes: dict[str, list[ReplicaRoute]] = {m: [] for m in models}
    for item in facts:
        record = item.record
        status = statuses.get(record.id)
        if status is None or status.state is not ReplicaState.READY or not record.endpoint:
            continue
        if record.model in routes:
            routes[record.model].append(
                ReplicaRoute(record.id, record.endpoint.rstrip("/"), max(record.throughput, 1e-6),
                             record.layout.role if record.layout else "both", record.job_id)
            )
    return {m: tuple(sorted(r, key=lambda x: x.id)) for m, r in routes.items()}


class TablePublisher:
    """Keeps the routing table file in step with READY replicas; versions only go up, across
    restarts too (the first version continues the file's)."""

    def __init__(self, path: Path):
        self.path = path
        self._version: int | None = None
        self._last: tuple[dict[str, tuple[ReplicaRoute, ...]], dict[str, WakeInfo]] | None = None

    def publish(self, routes: dict[str, tuple[ReplicaRoute, ...]],
                wake: dict[str, WakeInfo] | None = None) -> bool:
        """Write the table when ``routes`` (or the cold models' ``wake`` states) differ from what
        was last written; True if written."""
        wake = dict(wake or {})
        if self._version is None:
            try:
                existing = read_routing_table(self.path)
                self._version = existing.version
                self._last = (dict(existing.models), dict(existing.wake))
            except (FileNotFoundError, RoutingTableError):
                self._version = 0
        if (routes, wake) == self._last:
            return False
        self._version += 1
        write_routing_table(self.path, RoutingTable(version=self._version, models=routes,
                                                    wake=wake))
        self._last = (dict(routes), wake)
        return True

    @property
    def version(self) -> int:
        return self._version or 0
