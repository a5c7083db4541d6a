"""The database's schema: numbered migrations and the code that applies them.

An explicit schema, changed only by numbered migrations recorded in ``schema_migrations``; a
database newer than this code is refused rather than misread (../shared/ARCHITECTURE.md,
"State").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from time import time as _wall_clock

from coral_hpc.errors import PermanentError

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
    (
        5,
        """
        -- per model: the mean rate, the rate the plan was sized for (policy.plan_for) and why
        ALTER TABLE plans ADD COLUMN demand_basis_json TEXT;
        """,
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1][0]


def migrate(connection: sqlite3.Connection, name: str = "<db>") -> list[int]:
    """Apply every migration not yet applied, in order; returns the versions applied."""
    with connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
    current = applied_version(connection)
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


def refuse_newer(connection: sqlite3.Connection, name: str) -> None:
    """Raise :class:`PermanentError` when the database at ``name`` was written by a newer
    coral-hpc (for a read-only open, which must not migrate)."""
    version = applied_version(connection)
    if version > SCHEMA_VERSION:
        raise PermanentError(_too_new(name, version))


def applied_version(connection: sqlite3.Connection) -> int:
    """The highest migration applied to the database (0 for an empty one)."""
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
