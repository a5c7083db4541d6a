"""Daemon parts that need no Slurm: demand scrape deltas, routing-table publishing, loops, lock."""

from __future__ import annotations

import threading
import time

import pytest

from coral_hpc.daemon.loop import Loop
from coral_hpc.daemon.process import AlreadyRunning, DaemonLock, lock_is_held
from coral_hpc.daemon.routing import TablePublisher, ready_routes
from coral_hpc.daemon.scrape import ALL_MODELS, DemandScraper
from coral_hpc.gateway.table import read_routing_table
from coral_hpc.reconcile import ReconcileSettings, replica_status
from tests.unit.reconcile_facts import facts, rec


def _snap(models: dict, keys: dict | None = None) -> dict:
    def totals(values):
        r, p, g, x = values
        return {"requests_total": r, "prompt_tokens_total": p, "generated_tokens_total": g,
                "rejected_total": x}
    return {"models": {m: totals(v) for m, v in models.items()},
            "keys": {k: totals(v) for k, v in (keys or {}).items()}}


def test_first_scrape_is_a_baseline_then_deltas_with_zeros_for_quiet_models():
    scraper = DemandScraper()
    assert scraper.intervals(_snap({"a": (10, 100, 50, 1)}), 100.0, ["a", "b"]) == []
    rows = scraper.intervals(_snap({"a": (15, 160, 70, 3)}, {"k1": (5, 60, 20, 2)}), 110.0,
                             ["a", "b"])
    by = {(r.model, r.api_key): r for r in rows}
    a = by[("a", "")]
    assert (a.start, a.end, a.requests, a.prompt_tokens, a.generated_tokens, a.rejected) == (
        100.0, 110.0, 5, 60, 20, 2)
    assert by[("b", "")].requests == 0
    assert by[(ALL_MODELS, "k1")].requests == 5


def test_a_gateway_restart_counts_its_new_totals_not_a_negative_delta():
    scraper = DemandScraper()
    scraper.intervals(_snap({"a": (100, 1000, 500, 0)}), 0.0, ["a"])
    (row,) = scraper.intervals(_snap({"a": (3, 30, 10, 0)}), 5.0, ["a"])
    assert (row.requests, row.prompt_tokens, row.generated_tokens) == (3, 30, 10)


def test_routing_table_lists_every_model_and_only_ready_replicas(tmp_path):
    records = [rec("a"), rec("s", "starting"), rec("d", drain_requested_at=50.0),
               rec("u", health_failures=9), rec("x", model="other", throughput=3.0)]
    items = facts(*records)
    settings = ReconcileSettings()
    statuses = {f.record.id: replica_status(f, 100.0, settings) for f in items}
    routes = ready_routes(["m", "other", "idle"], items, statuses)
    assert {m: [r.id for r in reps] for m, reps in routes.items()} == {
        "m": ["a"], "other": ["x"], "idle": []}
    assert routes["other"][0].weight == 3.0
    publisher = TablePublisher(tmp_path / "t.json")
    assert publisher.publish(routes)
    assert not publisher.publish(dict(routes))  # unchanged: not rewritten
    table = read_routing_table(tmp_path / "t.json")
    assert table.version == 1 and set(table.models) == {"m", "other", "idle"}


def test_versions_continue_across_restarts(tmp_path):
    path = tmp_path / "t.json"
    first = TablePublisher(path)
    first.publish({"m": ()})
    items = facts(rec("a"))
    statuses = {f.record.id: replica_status(f, 100.0, ReconcileSettings()) for f in items}
    first.publish(ready_routes(["m"], items, statuses))
    restarted = TablePublisher(path)
    assert not restarted.publish(ready_routes(["m"], items, statuses))  # same content
    assert restarted.publish({"m": ()})
    assert read_routing_table(path).version == 3


def test_loop_catches_errors_at_its_boundary_and_stops_on_the_event():
    stop = threading.Event()
    calls, errors = [], []

    def step():
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("boom")
        if len(calls) >= 4:
            stop.set()

    loop = Loop("t", 0.01, step, stop, on_error=errors.append)
    thread = loop.start()
    thread.join(5)
    assert not thread.is_alive()
    assert len(calls) == 4 and errors == ["t"]


def test_a_loop_sleeping_a_long_interval_stops_at_once():
    stop = threading.Event()
    loop = Loop("t", 3600, lambda: None, stop)
    thread = loop.start()
    time.sleep(0.05)
    began = time.monotonic()
    stop.set()
    thread.join(5)
    assert time.monotonic() - began < 1.0


def test_one_daemon_per_deployment(tmp_path):
    path = tmp_path / "d.lock"
    first = DaemonLock(path)
    first.acquire()
    assert lock_is_held(path)
    with pytest.raises(AlreadyRunning):
        DaemonLock(path).acquire()
    first.release()
    assert not lock_is_held(path)
    DaemonLock(path).acquire()


def test_exclusion_keys_parse_back():
    from coral_hpc.types import ShapeExclusion, TemplateExclusion, excluded_from_key

    for target in (ShapeExclusion("m.tp2.a100-32", ("a100",)),
                   ShapeExclusion("t", ("a100", "v100")), TemplateExclusion("m.tp1.v100-36")):
        assert excluded_from_key(target.key) == target
    assert excluded_from_key("shape:t@a100,v100") == ShapeExclusion("t", ("a100", "v100"))
    for bad in ("t1", "template:", "shape:no-partitions", "node:a100-01"):
        with pytest.raises(ValueError, match="not an exclusion key"):
            excluded_from_key(bad)
