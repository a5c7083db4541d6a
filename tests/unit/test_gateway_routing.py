"""Routing policy: weight shares at low load, load awareness, and reloads that diff before mutating."""

from __future__ import annotations

from collections import Counter

from coral_hpc.gateway.routing import Router, diff_tables
from coral_hpc.gateway.table import ReplicaRoute, RoutingTable


def _table(version: int, **models: list[tuple[str, str, float]]) -> RoutingTable:
    return RoutingTable(version=version, models={
        m: tuple(ReplicaRoute(i, u, w) for i, u, w in reps) for m, reps in models.items()})


def test_sequential_requests_follow_weights_exactly():
    router = Router()
    router.apply(_table(1, m=[("a", "http://a:1", 1.0), ("b", "http://b:1", 2.0),
                              ("c", "http://c:1", 3.5)]))
    picks = Counter()
    for _ in range(1300):
        state = router.choose("m")
        picks[state.id] += 1
    # smooth weighted round-robin: after every 13 picks each has exactly its share (2:4:7)
    assert picks == {"a": 200, "b": 400, "c": 700}


def test_least_outstanding_relative_to_weight_wins():
    router = Router()
    router.apply(_table(1, m=[("a", "http://a:1", 1.0), ("b", "http://b:1", 4.0)]))
    a, b = router.replicas("m")
    a.outstanding, b.outstanding = 1, 3      # a: 1/1, b: 3/4 → b is less loaded
    assert router.choose("m") is b
    b.outstanding = 5                        # b: 5/4 > 1/1 → a
    assert router.choose("m") is a


def test_unhealthy_and_excluded_replicas_are_skipped():
    router = Router()
    router.apply(_table(1, m=[("a", "http://a:1", 1.0), ("b", "http://b:1", 1.0)]))
    a, b = router.replicas("m")
    a.healthy = False
    assert {router.choose("m").id for _ in range(10)} == {"b"}
    assert router.choose("m", exclude=[b]) is None
    assert router.ready_count("m") == 1
    assert router.choose("unknown") is None


def test_reload_keeps_counters_of_survivors_and_drops_removed():
    router = Router()
    router.apply(_table(1, m=[("a", "http://a:1", 1.0), ("b", "http://b:1", 1.0)],
                        gone=[("g", "http://g:1", 1.0)]))
    a, b = router.replicas("m")
    a.outstanding, b.outstanding = 7, 2
    b.healthy = False
    new = _table(2, m=[("a", "http://a:1", 3.0), ("b", "http://b:9", 1.0),
                       ("c", "http://c:1", 1.0)])
    # the diff is computed from the live state before anything changes
    diff = diff_tables(router.models, new)
    assert diff.reweighted == [("m", "a", 1.0, 3.0)]
    assert sorted(diff.removed) == [("gone", "g"), ("m", "b")]   # same id, new url: new process
    assert sorted((m, r.id) for m, r in diff.added) == [("m", "b"), ("m", "c")]
    assert diff.models_removed == ["gone"]
    applied, dropped = router.apply(new)
    assert applied == diff
    a2, b2, c2 = router.replicas("m")
    assert a2 is a and a2.outstanding == 7 and a2.weight == 3.0
    assert b2 is not b and b2.outstanding == 0 and b2.healthy
    assert c2.outstanding == 0
    assert {s.id for s in dropped} == {"b", "g"} and all(s.removed for s in dropped)
    assert router.version == 2 and "gone" not in router.models


def test_equal_table_is_an_empty_diff():
    router = Router()
    table = _table(1, m=[("a", "http://a:1", 1.0)])
    router.apply(table)
    assert diff_tables(router.models, _table(2, m=[("a", "http://a:1", 1.0)])).empty


def test_the_routing_view_names_each_replicas_slurm_job():
    router = Router()
    router.apply(RoutingTable(version=1, models={"m": (
        ReplicaRoute("a", "http://a:1", 1.0, "both", "4711"),
        ReplicaRoute("b", "http://b:1", 1.0))}))   # a table written before job ids
    views = {s.id: s.describe() for s in router.replicas("m")}
    assert views["a"]["job_id"] == "4711" and views["b"]["job_id"] is None
