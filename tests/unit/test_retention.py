"""Retention on a fake clock: the database keeps what reports need and drops the rest, old
demand intervals merge into hourly rows without losing a request or a token, recent demand is
read through an index, ended replicas' files go after their days while live ones stay, and logs
rotate at their size."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coral_hpc.cli._logging import configure_logging
from coral_hpc.config import RetentionConfig, load_deployment
from coral_hpc.daemon.retention import DAY_S, RetentionStep
from coral_hpc.store import (
    MIGRATIONS,
    DemandInterval,
    Exclusion,
    ReplicaRecord,
    StartupObservation,
    migrate,
    open_store,
)
from coral_hpc.types import ExclusionKind, ReplicaLayout, StageLayout, TemplateExclusion

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0  # the fake clock
LAYOUT = ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto")


def deployment_file(tmp_path: Path, retention: dict | None = None) -> Path:
    config = yaml.safe_load((REPO / "examples" / "models.yaml").read_text())
    config["state_dir"] = str(tmp_path / "shared")
    config["db_path"] = str(tmp_path / "daemon" / "demo.db")
    if retention is not None:
        config["retention"] = retention
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def replica(replica_id: str, job_id: str, created: float, ended: float | None) -> ReplicaRecord:
    return ReplicaRecord(id=replica_id, model="qwen3-8b", template_id="t0", layout=LAYOUT,
                         partitions=("a100",), throughput=1.0, cost_per_hour=1.0,
                         created_at=created, job_id=job_id, ended_at=ended,
                         end_state="COMPLETED" if ended else None)


def test_the_defaults_are_stated_and_models_yaml_may_change_them(tmp_path):
    assert load_deployment(deployment_file(tmp_path)).retention == RetentionConfig()
    custom = load_deployment(deployment_file(tmp_path, {"replica_files_days": 3}))
    assert custom.retention.replica_files_days == 3
    for name, field in RetentionConfig.model_fields.items():
        assert field.description, f"retention.{name} says what it is for"


def test_pruning_keeps_what_reports_need_and_drops_the_rest(tmp_path):
    deployment = load_deployment(deployment_file(tmp_path))
    store = open_store(deployment.db_path)
    day = DAY_S
    for age in (500, 95, 10):
        store.add_event(NOW - age * day, "submit", f"{age} days ago")
    old_plan = store.add_plan(NOW - 500 * day, 1.0, [], {"qwen3-8b": 1.0})
    in_force = store.add_plan(NOW - 450 * day, 2.0, [], {"qwen3-8b": 1.0})
    recent_plan = store.add_plan(NOW - 1 * day, 3.0, [], {"qwen3-8b": 1.0})
    store.add_replica(replica("rold", "1", NOW - 460 * day, NOW - 450 * day))
    store.add_replica(replica("rlive", "2", NOW - 500 * day, None))  # never ended: kept
    store.add_replica(replica("rrecent", "3", NOW - 20 * day, NOW - 10 * day))
    old = NOW - 420 * day
    store.add_demand([DemandInterval(old, old + 6, "qwen3-8b", 5, 50, 60, 0),
                      DemandInterval(NOW - 6, NOW, "qwen3-8b", 3, 30, 40, 0)])
    store.add_startup(StartupObservation(NOW - 401 * day, "rold", "t0", "a100", 120.0))
    store.set_exclusion(Exclusion(TemplateExclusion("t0"), ExclusionKind.CRASH_COOLDOWN,
                                  NOW - 450 * day, NOW - 449 * day, "crashed"))
    result = RetentionStep(lambda: deployment, store, lambda: NOW)()
    assert [e.message for e in store.events()] == ["10 days ago"]
    plans = store.plans_between(NOW - 600 * day, NOW)
    assert [p.id for p in plans] == [in_force, recent_plan]  # the plan in force at the cutoff stays
    assert old_plan not in [p.id for p in plans]
    assert {r.id for r in store.replicas(live_only=False)} == {"rlive", "rrecent"}
    assert [d.requests for d in store.demand_since(0)] == [3]
    assert store.startups() == [] and store.exclusions(0) == []
    assert result["events"] == 2 and result["replicas"] == 1 and result["plans"] == 1
    again = RetentionStep(lambda: deployment, store, lambda: NOW)()
    assert not any(again.values())  # nothing left to do: idempotent
    store.close()


def test_old_demand_merges_into_hourly_rows_without_losing_a_request_or_token(tmp_path):
    store = open_store(tmp_path / "d.db")
    start = NOW - 5 * DAY_S - (NOW % 3600)  # an hour boundary five days ago
    rows = [DemandInterval(start + i * 6, start + i * 6 + 6, model, 1 + i % 3, 10, 20, i % 2,
                           api_key="k1")
            for i in range(1800) for model in ("qwen3-8b", "phi-4")]  # 3 hours × 2 models
    recent = [DemandInterval(NOW - 60 + i * 6, NOW - 54 + i * 6, "qwen3-8b", 1, 1, 1, 0,
                             api_key="k1") for i in range(5)]
    store.add_demand(rows + recent)

    def totals():
        return [(m, sum(d.requests for d in ds), sum(d.prompt_tokens for d in ds),
                 sum(d.generated_tokens for d in ds), sum(d.rejected for d in ds))
                for m in ("qwen3-8b", "phi-4")
                for ds in [store.demand_since(0, model=m)]]

    before = totals()
    removed = store.compact_demand(NOW - 2 * DAY_S)
    assert removed == len(rows) - 6  # one row per model and hour remains
    assert totals() == before
    hourly = [d for d in store.demand_since(0) if d.end < NOW - 2 * DAY_S]
    assert len(hourly) == 6 and all(d.end - d.start <= 3600 for d in hourly)
    assert len([d for d in store.demand_since(NOW - 120)]) == 5  # recent rows untouched
    assert store.compact_demand(NOW - 2 * DAY_S) == 0
    store.close()


def test_recent_demand_and_pruning_read_through_indexes(tmp_path):
    store = open_store(tmp_path / "i.db")
    for sql, params in [
        ("SELECT * FROM demand_intervals WHERE end > ? ORDER BY end, id", (NOW,)),
        ("DELETE FROM demand_intervals WHERE end < ?", (NOW,)),
        ("DELETE FROM events WHERE time < ?", (NOW,)),
        ("SELECT * FROM plans WHERE time <= ? ORDER BY time DESC, id DESC LIMIT 1", (NOW,)),
        ("DELETE FROM replicas WHERE ended_at IS NOT NULL AND ended_at < ?", (NOW,)),
    ]:
        plan = " ".join(store.query_plan(sql, params))
        assert "USING" in plan and "INDEX" in plan, (sql, plan)
    store.close()


def test_a_version_1_database_gains_the_indexes(tmp_path):
    path = tmp_path / "v1.db"
    connection = sqlite3.connect(path)
    connection.executescript(MIGRATIONS[0][1])
    connection.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                       "applied_at REAL NOT NULL)")
    connection.execute("INSERT INTO schema_migrations VALUES (1, 0)")
    connection.commit()
    applied = migrate(connection, str(path))
    names = {r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    connection.close()
    assert 2 in applied and {"demand_end", "plans_time"} <= names


def test_ended_replicas_files_go_after_their_days_and_live_ones_stay(tmp_path):
    deployment = load_deployment(deployment_file(tmp_path, {"replica_files_days": 14}))
    state = deployment.state_path
    store = open_store(deployment.db_path)
    store.add_replica(replica("rlive", "900", NOW - 40 * DAY_S, None))
    files = {
        "old": ["replicas/rold/spec.json", "logs/rold.800.rank0.log", "logs/800_0_log.out",
                "run/800/head.json", "endpoints/rold.json", "stage/stage-1.json"],
        "live": ["replicas/rlive/spec.json", "logs/rlive.900.rank0.log", "logs/900_0_log.out",
                 "run/900/head.json"],
        "recent": ["replicas/rnew/spec.json", "logs/rnew.901.rank0.log"],
        "other": ["routing-table.json", "replica.key"],
    }
    for group, names in files.items():
        for name in names:
            path = state / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(group)
            age = 1 * DAY_S if group == "recent" else 30 * DAY_S
            os.utime(path, (NOW - age, NOW - age))
            os.utime(path.parent, (NOW - age, NOW - age))
    result = RetentionStep(lambda: deployment, store, lambda: NOW)()
    for group, names in files.items():
        for name in names:
            assert (state / name).exists() == (group != "old"), (group, name)
    assert not (state / "replicas" / "rold").exists() and not (state / "run" / "800").exists()
    assert result["files"] == 6
    store.close()


def test_logs_rotate_at_their_size(tmp_path):
    path = tmp_path / "daemon.log"
    retention = RetentionConfig(log_max_mb=0.01, log_backups=2)  # 10 KiB, for the test
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("info", path, retention)
        for i in range(2000):
            logging.getLogger("coral_hpc.test").info("line %05d %s", i, "x" * 40)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], root.level = saved[0], saved[1]
    rotated = sorted(p.name for p in tmp_path.iterdir())
    assert rotated == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    assert all((tmp_path / n).stat().st_size <= 0.01 * 1024 * 1024 for n in rotated)
    assert "line 01999" in path.read_text()


def test_the_gateway_process_writes_its_own_rotated_log(tmp_path):
    config = deployment_file(tmp_path)
    log_file, ready = tmp_path / "gw.log", tmp_path / "gw.addr"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "gateway", str(config),
         "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--log-file", str(log_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.1)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert log_file.read_text().strip(), "the gateway logged to its file"
    assert b"INFO" not in out  # and not to stdout/stderr


@pytest.mark.parametrize("bad", [{"log_max_mb": 0}, {"history_days": -1}, {"keep": 3}])
def test_bad_retention_values_are_refused_naming_the_field(tmp_path, bad):
    from coral_hpc.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_deployment(deployment_file(tmp_path, bad))
    assert "retention" in "\n".join(caught.value.problems)
