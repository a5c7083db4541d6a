"""The routing-table file: atomic writes, strict reads with errors naming the field."""

from __future__ import annotations

import json
import os

import pytest

from coral_hpc.gateway.table import (
    ReplicaRoute,
    RoutingTable,
    RoutingTableError,
    read_routing_table,
    routing_table_from_dict,
    write_routing_table,
)


def _table(version: int = 3) -> RoutingTable:
    return RoutingTable(version=version, models={
        "qwen3-8b": (ReplicaRoute("r1", "http://a100-01:8301", 4.5),
                     ReplicaRoute("r2", "http://v100-02:8302/", 1.0)),
        "phi-4": (),
    })


def test_round_trip_keeps_every_model_and_replica(tmp_path):
    path = tmp_path / "sub" / "routing-table.json"
    write_routing_table(path, _table())
    table = read_routing_table(path)
    assert table.version == 3
    assert set(table.models) == {"qwen3-8b", "phi-4"}
    assert table.models["phi-4"] == ()
    # a trailing slash is normalised so "url + path" never doubles it
    assert [r.url for r in table.models["qwen3-8b"]] == ["http://a100-01:8301",
                                                         "http://v100-02:8302"]
    assert table.models["qwen3-8b"][0].weight == 4.5
    assert table.generated_at  # stamped


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "routing-table.json"
    write_routing_table(path, _table(1))
    inode = os.stat(path).st_ino
    write_routing_table(path, _table(2))
    assert os.stat(path).st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["routing-table.json"]
    assert read_routing_table(path).version == 2
    assert os.stat(path).st_mode & 0o777 == 0o600  # private (issue 28): the gateway is ours


def test_writer_refuses_a_table_the_gateway_would_reject(tmp_path):
    bad = RoutingTable(version=1, models={"m": (ReplicaRoute("r", "ftp://x:1", 1.0),)})
    with pytest.raises(RoutingTableError, match=r"models.m.replicas\[0\].url"):
        write_routing_table(tmp_path / "t.json", bad)
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("data, field", [
    ([], "top level"),
    ({"version": -1, "models": {}}, "version"),
    ({"version": True, "models": {}}, "version"),
    ({"version": 1, "models": []}, "models"),
    ({"version": 1, "models": {}, "extra": 1}, "unknown key"),
    ({"version": 1, "models": {"m": {}}}, "models.m"),
    ({"version": 1, "models": {"m": {"replicas": [{"id": "", "url": "http://h:1", "weight": 1}]}}},
     r"replicas\[0\].id"),
    ({"version": 1, "models": {"m": {"replicas": [{"id": "a", "url": "http://h:1", "weight": 0}]}}},
     r"replicas\[0\].weight"),
    ({"version": 1, "models": {"m": {"replicas": [{"id": "a", "url": "http://h:1",
                                                   "weight": float("nan")}]}}}, "weight"),
    ({"version": 1, "models": {"m": {"replicas": [{"id": "a", "url": "http://h:1/v1",
                                                   "weight": 1}]}}}, "no path"),
    ({"version": 1, "models": {"m": {"replicas": [{"id": "a", "url": "http://h:1", "weight": 1},
                                                  {"id": "a", "url": "http://h:2", "weight": 1}]}}},
     "listed twice"),
])
def test_invalid_tables_name_the_field(data, field):
    with pytest.raises(RoutingTableError, match=field):
        routing_table_from_dict(data, "t.json")


def test_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"version": 1,\n "models": {,}}')
    with pytest.raises(RoutingTableError, match=r"t.json:2: not valid JSON"):
        read_routing_table(path)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_routing_table(tmp_path / "none.json")


def test_file_format_is_the_documented_one(tmp_path):
    path = tmp_path / "t.json"
    write_routing_table(path, _table(7))
    data = json.loads(path.read_text())
    assert set(data) == {"version", "generated_at", "models"}
    assert data["models"]["qwen3-8b"]["replicas"][0] == {
        "id": "r1", "url": "http://a100-01:8301", "weight": 4.5}
