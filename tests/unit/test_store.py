"""coral_hpc.store: schema and migrations, WAL, plain columns, and every record round-trips."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from coral_hpc.errors import PermanentError
from coral_hpc.store import (
    DemandInterval,
    Exclusion,
    ReplicaRecord,
    StartupObservation,
    migrate,
    open_store,
)
from coral_hpc.store import migrations as migrations_module
from coral_hpc.types import (
    ExclusionKind,
    ReplicaLayout,
    ShapeExclusion,
    StageLayout,
    TemplateExclusion,
)


def _replica(rid: str = "r1", **extra) -> ReplicaRecord:
    base = {
        "id": rid,
        "model": "qwen3-8b",
        "template_id": "t-a100x2",
        "layout": ReplicaLayout(2, (StageLayout("a100", "a100", 36),), "auto"),
        "partitions": ("a100",),
        "throughput": 3.5,
        "cost_per_hour": 4.0,
        "created_at": 100.0,
    }
    base.update(extra)
    return ReplicaRecord(**base)


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(tmp_path / "daemon" / "coral.db")
    yield s
    s.close()


def test_fresh_database_is_migrated_to_the_latest_version_in_wal_mode(tmp_path):
    s = open_store(tmp_path / "a.db")
    assert s.schema_version() == migrations_module.SCHEMA_VERSION
    mode = sqlite3.connect(tmp_path / "a.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    s.close()


def test_reopening_applies_nothing_twice(tmp_path):
    open_store(tmp_path / "a.db").close()
    connection = sqlite3.connect(tmp_path / "a.db")
    assert migrate(connection) == []
    versions = [v for (v,) in connection.execute("SELECT version FROM schema_migrations")]
    assert versions == [v for v, _ in migrations_module.MIGRATIONS]


def test_a_later_migration_upgrades_an_older_database_and_keeps_its_rows(tmp_path, monkeypatch):
    s = open_store(tmp_path / "a.db")
    s.add_replica(_replica())
    s.close()
    extra = (migrations_module.SCHEMA_VERSION + 1, "ALTER TABLE replicas ADD COLUMN note TEXT;")
    monkeypatch.setattr(migrations_module, "MIGRATIONS", migrations_module.MIGRATIONS + (extra,))
    monkeypatch.setattr(migrations_module, "SCHEMA_VERSION", extra[0])
    s = open_store(tmp_path / "a.db")
    assert s.schema_version() == extra[0]
    assert s.replica("r1") == _replica()
    s.close()


def test_a_failing_migration_leaves_the_previous_version_intact(tmp_path, monkeypatch):
    open_store(tmp_path / "a.db").close()
    bad = (
        migrations_module.SCHEMA_VERSION + 1,
        "CREATE TABLE half_done (x INTEGER);\nINSERT INTO no_such_table VALUES (1);",
    )
    monkeypatch.setattr(migrations_module, "MIGRATIONS", migrations_module.MIGRATIONS + (bad,))
    monkeypatch.setattr(migrations_module, "SCHEMA_VERSION", bad[0])
    with pytest.raises(sqlite3.OperationalError):
        open_store(tmp_path / "a.db")
    connection = sqlite3.connect(tmp_path / "a.db")
    tables = {n for (n,) in connection.execute("SELECT name FROM sqlite_master")}
    assert "half_done" not in tables
    assert connection.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0] == (
        bad[0] - 1
    )


def test_a_database_from_a_newer_coral_hpc_is_refused_not_misread(tmp_path):
    open_store(tmp_path / "a.db").close()
    connection = sqlite3.connect(tmp_path / "a.db")
    with connection:
        connection.execute("INSERT INTO schema_migrations VALUES (999, 0)")
    connection.close()
    with pytest.raises(PermanentError, match="999 is newer"):
        open_store(tmp_path / "a.db")
    with pytest.raises(PermanentError, match="999 is newer"):
        open_store(tmp_path / "a.db", readonly=True)


def test_readonly_open_of_a_missing_database_says_so_and_creates_nothing(tmp_path):
    with pytest.raises(PermanentError, match="no coral-hpc database"):
        open_store(tmp_path / "none.db", readonly=True)
    assert not (tmp_path / "none.db").exists()


def test_readonly_store_reads_but_cannot_write(tmp_path):
    s = open_store(tmp_path / "a.db")
    s.add_replica(_replica())
    ro = open_store(tmp_path / "a.db", readonly=True)
    assert [r.id for r in ro.replicas()] == ["r1"]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        ro.add_event(1.0, "x", "y")
    ro.close()
    s.close()


def test_replica_round_trips_and_only_facts_can_change(store):
    store.add_replica(_replica())
    assert store.replica("r1") == _replica()
    updated = store.update_replica("r1", job_id="42", submitted_at=101.0, slurm_state="PENDING")
    assert (updated.job_id, updated.submitted_at, updated.slurm_state) == ("42", 101.0, "PENDING")
    assert store.replica_by_job("42") == updated
    with pytest.raises(ValueError, match="model"):
        store.update_replica("r1", model="other")
    with pytest.raises(KeyError):
        store.update_replica("nope", ready_at=1.0)


def test_two_replicas_cannot_claim_the_same_job(store):
    store.add_replica(_replica("r1", job_id="7"))
    with pytest.raises(sqlite3.IntegrityError):
        store.add_replica(_replica("r2", job_id="7"))
    with pytest.raises(sqlite3.IntegrityError):
        store.add_replica(_replica("r1"))


def test_live_replicas_exclude_ended_ones(store):
    store.add_replica(_replica("r1", created_at=1.0))
    store.add_replica(_replica("r2", created_at=2.0, model="phi-4"))
    store.update_replica("r1", ended_at=50.0, end_state="CANCELLED")
    assert [r.id for r in store.replicas()] == ["r2"]
    assert [r.id for r in store.replicas(live_only=False)] == ["r1", "r2"]
    assert [r.id for r in store.replicas(live_only=False, model="phi-4")] == ["r2"]
    assert [r.id for r in store.ended_replicas_since(40.0)] == ["r1"]
    assert store.ended_replicas_since(60.0) == []


def test_layout_is_stored_as_plain_json_text_not_a_pickle(store, tmp_path):
    store.add_replica(_replica())
    raw = sqlite3.connect(store.path).execute(
        "SELECT layout_json, partitions FROM replicas"
    ).fetchone()
    assert json.loads(raw[0]) == _replica().layout.to_dict()  # one JSON round trip
    assert raw[1] == "a100"
    assert store.replica("r1").layout == _replica().layout
    store.add_replica(_replica("r2", layout=None))  # adopted without a spec: layout unknown
    assert store.replica("r2").layout is None


def test_multi_stage_partitions_round_trip(store):
    store.add_replica(_replica("h", partitions=("a100", "v100")))
    assert store.replica("h").partitions == ("a100", "v100")


def test_plans_latest_wins(store):
    assert store.latest_plan() is None
    store.add_plan(10.0, 5.0, [{"template": "t1", "partitions": ["a100"], "count": 1}], {"m": 1.0})
    plan_id = store.add_plan(20.0, 7.5, [{"template": "t2", "count": 2}], {"m": 2.0}, solve_s=0.3)
    latest = store.latest_plan()
    assert latest.id == plan_id
    assert (latest.time, latest.cost_per_hour, latest.solve_s) == (20.0, 7.5, 0.3)
    assert latest.rows == [{"template": "t2", "count": 2}]
    assert latest.demand == {"m": 2.0}
    with pytest.raises(ValueError):
        store.add_plan(30.0, 1.0, [], {"m": float("nan")})


def test_events_newest_first_with_filters(store):
    store.add_event(1.0, "submit", "submitted r1", model="m", replica_id="r1")
    store.add_event(2.0, "cooldown", "template t1 cools down")
    store.add_event(3.0, "submit", "submitted r2", model="m", replica_id="r2")
    assert [e.time for e in store.events()] == [3.0, 2.0, 1.0]
    assert [e.replica_id for e in store.events(kind="submit")] == ["r2", "r1"]
    assert [e.time for e in store.events(since=2.0)] == [3.0, 2.0]
    assert len(store.events(limit=1)) == 1


def test_demand_intervals_round_trip_and_filter(store):
    rows = [
        DemandInterval(0.0, 10.0, "m", 5, 500, 100, 1, api_key="k1"),
        DemandInterval(10.0, 20.0, "m", 7, 700, 140, 0),
        DemandInterval(10.0, 20.0, "other", 1, 10, 2, 0),
    ]
    store.add_demand(rows)
    assert store.demand_since(0.0) == rows
    assert store.demand_since(10.0, model="m") == [rows[1]]
    with pytest.raises(sqlite3.IntegrityError):
        store.add_demand([DemandInterval(5.0, 5.0, "m", 1, 1, 1, 0)])
    with pytest.raises(sqlite3.IntegrityError):
        store.add_demand([DemandInterval(5.0, 6.0, "m", -1, 1, 1, 0)])


def test_startup_observations_newest_first(store):
    store.add_startup(StartupObservation(1.0, "r1", "t1", "a100", 30.0))
    store.add_startup(StartupObservation(2.0, "r2", "t2", "v100", 50.0))
    assert [o.seconds for o in store.startups()] == [50.0, 30.0]
    assert [o.replica_id for o in store.startups(template_id="t1")] == ["r1"]


def test_exclusions_expire_and_replace(store):
    t1, shape = TemplateExclusion("t1"), ShapeExclusion("t2", ("a100", "v100"))
    store.set_exclusion(Exclusion(t1, ExclusionKind.CRASH_COOLDOWN, 0.0, 100.0, "3 crashes"))
    store.set_exclusion(Exclusion(shape, ExclusionKind.PENDING_TIMEOUT, 0.0, 50.0, "pending"))
    assert {(e.target, e.kind) for e in store.exclusions(now=10.0)} == {
        (t1, ExclusionKind.CRASH_COOLDOWN), (shape, ExclusionKind.PENDING_TIMEOUT)}
    assert [e.target for e in store.exclusions(now=60.0)] == [t1]
    store.set_exclusion(Exclusion(t1, ExclusionKind.CRASH_COOLDOWN, 70.0, 300.0, "again"))
    (only,) = store.exclusions(now=200.0)
    assert (only.since, only.until, only.reason) == (70.0, 300.0, "again")


def test_rows_survive_a_killed_writer(tmp_path):
    """A daemon killed with -9 mid-run loses nothing it committed (WAL + synchronous NORMAL)."""
    db = tmp_path / "k.db"
    code = (
        "import os, signal\n"
        "from coral_hpc.store import open_store, ReplicaRecord\n"
        f"s = open_store({str(db)!r})\n"
        "s.add_replica(ReplicaRecord(id='r1', model='m', template_id='t', layout=None, "
        "partitions=('p',), throughput=1.0, cost_per_hour=1.0, created_at=1.0))\n"
        "s.add_event(1.0, 'submit', 'x')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True
    )
    assert result.returncode == -9, result.stderr
    s = open_store(db)
    assert [r.id for r in s.replicas()] == ["r1"]
    assert s.counts()["events"] == 1
    s.close()
