"""Typed reads and writes of the daemon's tables: :class:`Store`, one short transaction a call.

No pickles. Columns hold plain values; the few JSON text columns hold small plain data (a
replica's layout, a plan's rows) that is written and read through :mod:`json` only. A
replica's layout is a :class:`~coral_hpc.types.ReplicaLayout` in and out (``layout_json`` holds
its ``to_dict()``, ``{}`` when unknown). A replica row stores *facts*; its status is derived from
them by ``coral_hpc.reconcile.replica_status``, never stored. Every timestamp is passed in by
the caller (seconds since the epoch), so tests use a fake clock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from typing import Any

from coral_hpc.records import (
    DemandInterval,
    Event,
    Exclusion,
    PlanRecord,
    ReplicaRecord,
    StartupObservation,
)
from coral_hpc.store.migrations import applied_version
from coral_hpc.types import ExclusionKind, ReplicaLayout, excluded_from_key

#: Fields :meth:`Store.update_replica` may change; identity and what was asked for stay fixed.
_MUTABLE_REPLICA_FIELDS = frozenset(
    {
        "job_id", "time_limit_s", "submitted_at", "started_at", "ready_at", "endpoint",
        "slurm_state", "slurm_reason", "nodes", "last_seen_at", "health_ok_at",
        "health_failures", "drain_requested_at", "cancelled_at", "ended_at", "end_state",
        "reason", "expected_start", "failure",
    }
)
_REPLICA_COLUMNS = tuple(
    "layout_json" if f.name == "layout" else f.name for f in fields(ReplicaRecord)
)


# --------------------------------------------------------------------------- store

class Store:
    """Typed access to the daemon's database. Build with :func:`open_store`.

    One connection shared by the daemon's loops behind a lock: SQLite serialises writers anyway,
    and each method is one short transaction.
    """

    def __init__(self, connection: sqlite3.Connection, path: str):
        self._db = connection
        self._lock = threading.RLock()
        self.path = path

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        with self._lock:
            self._db.close()

    def _write(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        with self._lock, self._db:
            return self._db.execute(sql, params)

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def schema_version(self) -> int:
        """The highest migration applied to this database."""
        return applied_version(self._db)

    # ----------------------------------------------------------------- replicas

    def add_replica(self, replica: ReplicaRecord) -> None:
        """Insert a new replica. Raises ``sqlite3.IntegrityError`` when the id or job id exists."""
        row = _replica_to_row(replica)
        names = ", ".join(row)
        marks = ", ".join(f":{name}" for name in row)
        self._write(f"INSERT INTO replicas ({names}) VALUES ({marks})", row)

    def update_replica(self, replica_id: str, **changes: Any) -> ReplicaRecord:
        """Set some facts of a replica; returns the updated record. KeyError if none."""
        unknown = set(changes) - _MUTABLE_REPLICA_FIELDS
        if unknown:
            raise ValueError(f"cannot update replica field(s) {sorted(unknown)}")
        if changes:
            assignments = ", ".join(f"{name} = :{name}" for name in changes)
            cursor = self._write(
                f"UPDATE replicas SET {assignments} WHERE id = :_id", {**changes, "_id": replica_id}
            )
            if cursor.rowcount == 0:
                raise KeyError(replica_id)
        found = self.replica(replica_id)
        if found is None:
            raise KeyError(replica_id)
        return found

    def replica(self, replica_id: str) -> ReplicaRecord | None:
        """The replica with this id, or None."""
        rows = self._read(f"SELECT {', '.join(_REPLICA_COLUMNS)} FROM replicas WHERE id = ?",
                          (replica_id,))
        return _row_to_replica(rows[0]) if rows else None

    def replica_by_job(self, job_id: str) -> ReplicaRecord | None:
        """The replica running as Slurm job ``job_id``, or None."""
        rows = self._read(
            f"SELECT {', '.join(_REPLICA_COLUMNS)} FROM replicas WHERE job_id = ?", (job_id,)
        )
        return _row_to_replica(rows[0]) if rows else None

    def replicas(self, live_only: bool = True, model: str | None = None) -> list[ReplicaRecord]:
        """Replicas in creation order; by default only those whose end is not yet recorded."""
        where, params = [], []
        if live_only:
            where.append("ended_at IS NULL")
        if model is not None:
            where.append("model = ?")
            params.append(model)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT {', '.join(_REPLICA_COLUMNS)} FROM replicas {clause} "
            "ORDER BY created_at, id",
            params,
        )
        return [_row_to_replica(row) for row in rows]

    def ended_replicas_since(self, since: float) -> list[ReplicaRecord]:
        """Replicas whose end was recorded at or after ``since`` (crash counting, history)."""
        rows = self._read(
            f"SELECT {', '.join(_REPLICA_COLUMNS)} FROM replicas "
            "WHERE ended_at IS NOT NULL AND ended_at >= ? ORDER BY ended_at",
            (since,),
        )
        return [_row_to_replica(row) for row in rows]

    # ----------------------------------------------------------------- plans

    def add_plan(
        self,
        time: float,
        cost_per_hour: float,
        rows: list[dict[str, Any]],
        demand: dict[str, float],
        solve_s: float = 0.0,
        status: str = "optimal",
        demand_basis: dict[str, dict[str, Any]] | None = None,
    ) -> int:
        """Record a plan; returns its id. ``rows`` must be plain JSON data; ``demand_basis``
        (:func:`coral_hpc.demand.demand_basis`) says per model what the plan was sized for."""
        cursor = self._write(
            "INSERT INTO plans (time, cost_per_hour, solve_s, status, rows_json, demand_json, "
            "demand_basis_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (time, cost_per_hour, solve_s, status, _dumps(rows), _dumps(demand),
             _dumps(demand_basis or {})),
        )
        return _row_id(cursor)

    def latest_plan(self) -> PlanRecord | None:
        """The most recent plan, or None before the first."""
        rows = self._read("SELECT * FROM plans ORDER BY id DESC LIMIT 1")
        return _row_to_plan(rows[0]) if rows else None

    def plans_between(self, since: float, until: float) -> list[PlanRecord]:
        """The plans in force over ``[since, until)``, oldest first: the plan in force at
        ``since`` (the last one made at or before it), then every plan made after ``since`` and
        before ``until``. A range before the first plan holds only the later ones."""
        in_force = self._read(
            "SELECT * FROM plans WHERE time <= ? ORDER BY time DESC, id DESC LIMIT 1", (since,))
        later = self._read(
            "SELECT * FROM plans WHERE time > ? AND time < ? ORDER BY time, id", (since, until))
        return [_row_to_plan(row) for row in [*in_force, *later]]

    # ----------------------------------------------------------------- events

    def add_event(
        self,
        time: float,
        kind: str,
        message: str,
        model: str | None = None,
        replica_id: str | None = None,
    ) -> int:
        """Record an event for people to read (``coral-hpc status``); returns its id."""
        cursor = self._write(
            "INSERT INTO events (time, kind, model, replica_id, message) VALUES (?, ?, ?, ?, ?)",
            (time, kind, model, replica_id, message),
        )
        return _row_id(cursor)

    def events(
        self, limit: int = 50, since: float | None = None, kind: str | None = None
    ) -> list[Event]:
        """The newest events first, at most ``limit``."""
        where: list[str] = []
        params: list[Any] = []
        if since is not None:
            where.append("time >= ?")
            params.append(since)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT * FROM events {clause} ORDER BY time DESC, id DESC LIMIT ?",
            [*params, limit],
        )
        return [
            Event(
                id=r["id"], time=r["time"], kind=r["kind"], message=r["message"],
                model=r["model"], replica_id=r["replica_id"],
            )
            for r in rows
        ]

    # ----------------------------------------------------------------- demand

    def add_demand(self, intervals: Iterable[DemandInterval]) -> None:
        """Record metered counter deltas (one transaction for the whole scrape)."""
        rows = [asdict(i) for i in intervals]
        if not rows:
            return
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO demand_intervals (start, end, model, api_key, requests, "
                "prompt_tokens, generated_tokens, rejected) VALUES (:start, :end, :model, "
                ":api_key, :requests, :prompt_tokens, :generated_tokens, :rejected)",
                rows,
            )

    def demand_since(self, since: float, model: str | None = None) -> list[DemandInterval]:
        """Metered intervals ending after ``since``, oldest first."""
        params: list[Any] = [since]
        clause = ""
        if model is not None:
            clause = "AND model = ?"
            params.append(model)
        rows = self._read(
            "SELECT start, end, model, api_key, requests, prompt_tokens, generated_tokens, "
            f"rejected FROM demand_intervals WHERE end > ? {clause} ORDER BY end, id",
            params,
        )
        return [DemandInterval(**dict(r)) for r in rows]

    # ----------------------------------------------------------------- start-up history

    def add_startup(self, observation: StartupObservation) -> None:
        """Record how long one replica took from submission to READY."""
        self._write(
            "INSERT INTO startup_observations (time, replica_id, template_id, gpu_type, seconds) "
            "VALUES (:time, :replica_id, :template_id, :gpu_type, :seconds)",
            asdict(observation),
        )

    def startups(self, limit: int = 50, template_id: str | None = None) -> list[StartupObservation]:
        """The newest start-up observations first (optionally of one template)."""
        clause, params = "", []
        if template_id is not None:
            clause, params = "WHERE template_id = ?", [template_id]
        rows = self._read(
            "SELECT time, replica_id, template_id, gpu_type, seconds FROM startup_observations "
            f"{clause} ORDER BY time DESC, id DESC LIMIT ?",
            [*params, limit],
        )
        return [StartupObservation(**dict(r)) for r in rows]

    # ----------------------------------------------------------------- exclusions

    def set_exclusion(self, exclusion: Exclusion) -> None:
        """Keep a template or shape out of plans until ``exclusion.until`` (replaces any)."""
        self._write(
            "INSERT INTO exclusions (key, kind, since, until, reason) "
            "VALUES (:key, :kind, :since, :until, :reason) "
            "ON CONFLICT(key) DO UPDATE SET kind = excluded.kind, since = excluded.since, "
            "until = excluded.until, reason = excluded.reason",
            {"key": exclusion.key, "kind": ExclusionKind(exclusion.kind).value,
             "since": exclusion.since, "until": exclusion.until, "reason": exclusion.reason},
        )

    def exclusions(self, now: float) -> list[Exclusion]:
        """Exclusions still in force at ``now``."""
        rows = self._read(
            "SELECT key, kind, since, until, reason FROM exclusions WHERE until > ? ORDER BY key",
            (now,),
        )
        return [Exclusion(excluded_from_key(r["key"]), ExclusionKind(r["kind"]), r["since"],
                          r["until"], r["reason"]) for r in rows]

    # ----------------------------------------------------------------- retention

    def prune(self, *, events_before: float, history_before: float) -> dict[str, int]:
        """Delete what retention no longer keeps, in one transaction; rows deleted per table.

        ``events_before``: events older than that. ``history_before``: plans (but never the
        plan still in force at that time, which cost reports start from), replicas that ended
        before it, metered demand intervals that ended before it, start-up observations, and
        exclusions that expired before it. Live replicas are never touched."""
        statements = {
            "events": ("DELETE FROM events WHERE time < ?", (events_before,)),
            "plans": (
                ("DELETE FROM plans WHERE time < ? AND id < (SELECT COALESCE(MAX(id), 0) FROM "
                 "plans WHERE time <= ?)"), (history_before, history_before)),
            "replicas": ("DELETE FROM replicas WHERE ended_at IS NOT NULL AND ended_at < ?",
                         (history_before,)),
            "demand_intervals": ("DELETE FROM demand_intervals WHERE end < ?",
                                 (history_before,)),
            "startup_observations": ("DELETE FROM startup_observations WHERE time < ?",
                                     (history_before,)),
            "exclusions": ("DELETE FROM exclusions WHERE until < ?", (history_before,)),
        }
        deleted = {}
        with self._lock, self._db:
            for table, (sql, params) in statements.items():
                deleted[table] = self._db.execute(sql, params).rowcount
        return deleted

    def compact_demand(self, before: float, bucket_s: float = 3600.0) -> int:
        """Merge metered intervals that ended before ``before`` into one row per model, API key
        and ``bucket_s`` bucket (sums of requests and tokens; start and end of the bucket's
        first and last interval), so years of per-scrape rows stay small while cost per token
        keeps an hourly resolution. Returns how many rows were removed."""
        with self._lock, self._db:
            groups = self._db.execute(
                "SELECT model, api_key, CAST(start / ? AS INTEGER) AS bucket, COUNT(*) AS n, "
                "MIN(start) AS start, MAX(end) AS end, SUM(requests) AS requests, "
                "SUM(prompt_tokens) AS prompt_tokens, SUM(generated_tokens) AS generated_tokens, "
                "SUM(rejected) AS rejected FROM demand_intervals WHERE end < ? "
                "GROUP BY model, api_key, bucket HAVING COUNT(*) > 1",
                (bucket_s, before),
            ).fetchall()
            removed = 0
            for g in groups:
                low, high = g["bucket"] * bucket_s, (g["bucket"] + 1) * bucket_s
                removed += self._db.execute(
                    "DELETE FROM demand_intervals WHERE model = ? AND api_key = ? AND end < ? "
                    "AND start >= ? AND start < ?",
                    (g["model"], g["api_key"], before, low, high),
                ).rowcount - 1
                self._db.execute(
                    "INSERT INTO demand_intervals (start, end, model, api_key, requests, "
                    "prompt_tokens, generated_tokens, rejected) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (g["start"], g["end"], g["model"], g["api_key"], g["requests"],
                     g["prompt_tokens"], g["generated_tokens"], g["rejected"]),
                )
        return removed

    # ----------------------------------------------------------------- misc

    def query_plan(self, sql: str, params: Sequence[Any] = ()) -> list[str]:
        """SQLite's ``EXPLAIN QUERY PLAN`` of ``sql`` (the index a query uses), for tests and
        for an operator wondering why a query is slow."""
        rows = self._read(f"EXPLAIN QUERY PLAN {sql}", params)
        return [str(r["detail"]) for r in rows]

    def counts(self) -> dict[str, int]:
        """Rows per table."""
        out = {}
        for table in ("replicas", "plans", "events", "demand_intervals",
                      "startup_observations", "exclusions"):
            out[table] = self._read(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"]
        return out


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id SQLite gave the row an INSERT just wrote."""
    assert cursor.lastrowid is not None
    return int(cursor.lastrowid)


def _dumps(data: Any) -> str:
    """JSON text of small plain data; anything else (objects, NaN) is a programming error."""
    return json.dumps(data, sort_keys=True, allow_nan=False, separators=(",", ":"))


def _row_to_plan(row: sqlite3.Row) -> PlanRecord:
    return PlanRecord(
        id=row["id"],
        time=row["time"],
        cost_per_hour=row["cost_per_hour"],
        solve_s=row["solve_s"],
        status=row["status"],
        rows=json.loads(row["rows_json"]),
        demand=json.loads(row["demand_json"]),
        demand_basis=json.loads(row["demand_basis_json"] or "{}"),
    )


def _replica_to_row(replica: ReplicaRecord) -> dict[str, Any]:
    row = asdict(replica)
    row.pop("layout")
    row["layout_json"] = _dumps(replica.layout.to_dict() if replica.layout else {})
    row["partitions"] = ",".join(replica.partitions)
    return {name: row[name] for name in _REPLICA_COLUMNS}


def _row_to_replica(row: sqlite3.Row) -> ReplicaRecord:
    data = dict(row)
    layout = json.loads(data.pop("layout_json"))
    data["layout"] = ReplicaLayout.from_dict(layout) if layout else None
    data["partitions"] = tuple(p for p in data["partitions"].split(",") if p)
    return ReplicaRecord(**data)
