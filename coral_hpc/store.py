"""The daemon's SQLite database: replicas, plans, events, metered demand, start-up history.

One file on the daemon host's local disk (``db_path`` in ``models.yaml``), never on a network
filesystem: SQLite's locking is not safe there. WAL mode, so ``coral-hpc status`` can read while
the daemon writes.

Design rules (../shared/ARCHITECTURE.md, "State"):

- An explicit schema, changed only by numbered migrations recorded in ``schema_migrations``;
  a database newer than this code is refused rather than misread.
- No pickles. Columns hold plain values; the few JSON text columns hold small plain data
  (a replica's layout, a plan's rows) that is written and read through :mod:`json` only. A
  replica's layout is a :class:`~coral_hpc.types.ReplicaLayout` in and out
  (``layout_json`` holds its ``to_dict()``, ``{}`` when unknown).
- A replica row stores *facts* (times something happened, the last Slurm state seen); its
  status is derived from them by ``coral_hpc.reconcile.replica_status``, never stored.
- Constructing a :class:`Store` opens nothing: :func:`open_store` opens the file and migrates.
  Every timestamp is passed in by the caller (seconds since the epoch), so tests use a fake clock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from time import time as _wall_clock
from typing import Any

from coral_hpc.atomic import PRIVATE_FILE_MODE, private_dir
from coral_hpc.errors import PermanentError
from coral_hpc.records import (
    DemandInterval,
    Event,
    Exclusion,
    PlanRecord,
    ReplicaRecord,
    StartupObservation,
)
from coral_hpc.types import ExclusionKind, ReplicaLayout, excluded_from_key

__all__ = [
    "DemandInterval", "Event", "Exclusion", "PlanRecord", "ReplicaRecord", "StartupObservation",
    "Store", "migrate", "open_store",
]  # fmt: skip

# --------------------------------------------------------------------------- schema

#: Numbered migrations, applied in order, each once, each in its own transaction. Append only:
#: never edit a migration that has shipped — add the next number instead.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE replicas (
            id                  TEXT PRIMARY KEY,
            model               TEXT NOT NULL,
            template_id         TEXT NOT NULL,
            layout_json         TEXT NOT NULL,      -- small plain dict: stages, tp, pp, gpus
            partitions          TEXT NOT NULL,      -- comma-separated, one per stage
            throughput          REAL NOT NULL,      -- planned requests/s: the routing weight
            cost_per_hour       REAL NOT NULL,
            replaces            TEXT,               -- id of the replica this one takes over from
            reason              TEXT NOT NULL DEFAULT '',
            job_id              TEXT,
            time_limit_s        REAL,
            submitted_at        REAL,
            started_at          REAL,
            ready_at            REAL,
            endpoint            TEXT,
            slurm_state         TEXT,
            slurm_reason        TEXT,
            nodes               TEXT,
            last_seen_at        REAL,               -- last time Slurm reported the job
            health_ok_at        REAL,
            health_failures     INTEGER NOT NULL DEFAULT 0,
            drain_requested_at  REAL,
            cancelled_at        REAL,
            ended_at            REAL,
            end_state           TEXT,
            created_at          REAL NOT NULL
        );
        CREATE INDEX replicas_live ON replicas (ended_at);
        CREATE UNIQUE INDEX replicas_job ON replicas (job_id) WHERE job_id IS NOT NULL;

        CREATE TABLE plans (
            id              INTEGER PRIMARY KEY AUTOINCREMENT,
            time            REAL NOT NULL,
            cost_per_hour   REAL NOT NULL,
            solve_s         REAL NOT NULL,
            status          TEXT NOT NULL,
            rows_json       TEXT NOT NULL,     -- list of plain plan rows
            demand_json     TEXT NOT NULL      -- {model: requests/s planned for}
        );

        CREATE TABLE events (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            time        REAL NOT NULL,
            kind        TEXT NOT NULL,
            model       TEXT,
            replica_id  TEXT,
            message     TEXT NOT NULL
        );
        CREATE INDEX events_time ON events (time);

        CREATE TABLE demand_intervals (
            id                  INTEGER PRIMARY KEY AUTOINCREMENT,
            start               REAL NOT NULL,
            end                 REAL NOT NULL,
            model               TEXT NOT NULL,
            api_key             TEXT NOT NULL DEFAULT '',   -- key id/hash prefix, never the key
            requests            INTEGER NOT NULL,
            prompt_tokens       INTEGER NOT NULL,
            generated_tokens    INTEGER NOT NULL,
            rejected            INTEGER NOT NULL,
            CHECK (end > start),
            CHECK (requests >= 0 AND prompt_tokens >= 0 AND generated_tokens >= 0
                   AND rejected >= 0)
        );
        CREATE INDEX demand_model_end ON demand_intervals (model, end);

        CREATE TABLE startup_observations (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            time        REAL NOT NULL,
            replica_id  TEXT NOT NULL,
            template_id TEXT NOT NULL,
            gpu_type    TEXT NOT NULL,
            seconds     REAL NOT NULL CHECK (seconds >= 0)
        );

        CREATE TABLE exclusions (
            key         TEXT PRIMARY KEY,      -- 'template:<id>' or 'shape:<partition>/<gpu>:<n>'
            kind        TEXT NOT NULL,         -- 'crash_cooldown' | 'pending_timeout'
            since       REAL NOT NULL,
            until       REAL NOT NULL,
            reason      TEXT NOT NULL
        );
        """,
    ),
    (
        2,
        # Retention (coral_hpc.daemon.retention) deletes by time, and the daemon reads recent
        # demand of every model each cycle (``demand_since`` without a model): both need an
        # index on time, or each cycle and each pruning scans the whole table.
        """
        CREATE INDEX demand_end ON demand_intervals (end);
        CREATE INDEX plans_time ON plans (time);
        CREATE INDEX startup_time ON startup_observations (time);
        CREATE INDEX exclusions_until ON exclusions (until);
        """,
    ),
    (
        3,
        """
        -- when Slurm expects a pending replica's job to start (squeue --start), for status and
        -- for moving a queued replica whose start recedes past the horizon
        ALTER TABLE replicas ADD COLUMN expected_start REAL;
        """,
    ),
    (
        4,
        """
        -- why a replica's job failed unasked (the last error line of its logs), for status and
        -- the cool-down of a layout that crashes at start
        ALTER TABLE replicas ADD COLUMN failure TEXT;
        """,
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1][0]


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
        return _applied_version(self._db)

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
    ) -> int:
        """Record a plan; returns its id. ``rows`` must be plain JSON data."""
        cursor = self._write(
            "INSERT INTO plans (time, cost_per_hour, solve_s, status, rows_json, demand_json) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (time, cost_per_hour, solve_s, status, _dumps(rows), _dumps(demand)),
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

    # ----------------------------------------------------------------- misc

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


# --------------------------------------------------------------------------- opening, migrating


def open_store(path: str | Path, readonly: bool = False) -> Store:
    """Open (creating when absent) the database at ``path``, migrate it, and return a Store.

    ``readonly`` opens an existing database without migrating or writing (``coral-hpc status``
    must not change a database a running daemon owns). Raises :class:`PermanentError` when the
    database was written by a newer coral-hpc or is not a coral-hpc database.
    """
    file = Path(path).expanduser()
    if readonly:
        if not file.exists():
            raise PermanentError(f"{file}: no coral-hpc database here (has `coral-hpc serve` run?)")
        connection = sqlite3.connect(
            f"file:{file}?mode=ro", uri=True, check_same_thread=False, timeout=10
        )
    else:
        private_dir(file.parent)
        if not file.exists():
            _create(file)
        # the WAL and shared-memory files SQLite makes take the database's mode
        os.chmod(file, PRIVATE_FILE_MODE)
        connection = sqlite3.connect(str(file), check_same_thread=False, timeout=10)
    connection.row_factory = sqlite3.Row
    try:
        connection.execute("PRAGMA foreign_keys = ON")
        if not readonly:
            # WAL: readers (status) never block the writer (daemon); NORMAL sync is durable
            # across application crashes, which is what a kill -9 of the daemon is.
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise PermanentError(f"{file}: SQLite refused WAL mode (got {mode!r})")
            connection.execute("PRAGMA synchronous = NORMAL")
            migrate(connection, str(file))
        else:
            version = _applied_version(connection)
            if version > SCHEMA_VERSION:
                raise PermanentError(_too_new(str(file), version))
    except Exception:
        connection.close()
        raise
    return Store(connection, str(file))


def _create(file: Path) -> None:
    """Make a new database beside ``file`` and move it into place once migrated, so a reader
    (``coral-hpc status`` while the daemon starts) never opens one without its tables."""
    tmp = file.with_name(f".{file.name}.{os.getpid()}.new")
    connection = sqlite3.connect(str(tmp))
    try:
        migrate(connection, str(file))
    finally:
        connection.close()
    os.replace(tmp, file)


def migrate(connection: sqlite3.Connection, name: str = "<db>") -> list[int]:
    """Apply every migration not yet applied, in order; returns the versions applied."""
    with connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
    current = _applied_version(connection)
    if current > SCHEMA_VERSION:
        raise PermanentError(_too_new(name, current))
    applied = []
    for version, sql in MIGRATIONS:
        if version <= current:
            continue
        # executescript commits first; run the statements inside one explicit transaction so a
        # failing migration leaves the database at the previous version.
        try:
            connection.execute("BEGIN IMMEDIATE")
            for statement in _statements(sql):
                connection.execute(statement)
            connection.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                (version, _wall_clock()),
            )
            connection.execute("COMMIT")
        except Exception:
            connection.execute("ROLLBACK")
            raise
        applied.append(version)
    return applied


def _statements(script: str) -> Iterator[str]:
    """Split a migration script into complete statements (sqlite3.complete_statement)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statement = buffer.strip()
            if statement.rstrip(";").strip():
                yield statement
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buffer.strip()[:80]}")


def _applied_version(connection: sqlite3.Connection) -> int:
    exists = connection.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return 0
    row = connection.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)


def _too_new(name: str, version: int) -> str:
    return (
        f"{name}: database schema version {version} is newer than this coral-hpc understands "
        f"(≤ {SCHEMA_VERSION}); upgrade coral-hpc or point db_path at another file"
    )


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
