"""Disaggregated routing in the gateway: table roles, role-aware picks, the path split, payloads."""

from __future__ import annotations

import pytest

from coral_hpc.gateway.disagg import PREFILL_PARAMS, decode_payload, prefill_payload
from coral_hpc.gateway.proxy import Gateway, GatewaySettings
from coral_hpc.gateway.routing import Router
from coral_hpc.gateway.table import (
    ReplicaRoute,
    RoutingTable,
    RoutingTableError,
    routing_table_from_dict,
)


def _table(routes) -> RoutingTable:
    return RoutingTable(1, {"m": tuple(ReplicaRoute(*r) for r in routes)})


def test_roles_round_trip_and_aggregated_rows_keep_three_keys():
    table = _table([("a", "http://h:1", 2.0), ("p", "http://h:2", 3.0, "prefill"),
                    ("d", "http://h:3", 1.5, "decode")])
    data = table.to_dict()
    assert data["models"]["m"]["replicas"][0] == {"id": "a", "url": "http://h:1", "weight": 2.0}
    assert data["models"]["m"]["replicas"][1]["role"] == "prefill"
    back = routing_table_from_dict(data)
    assert [r.role for r in back.models["m"]] == ["both", "prefill", "decode"]


def test_an_unknown_role_is_named():
    data = {"version": 1, "models": {"m": {"replicas": [
        {"id": "a", "url": "http://h:1", "weight": 1, "role": "encode"}]}}}
    with pytest.raises(RoutingTableError, match=r"models\.m\.replicas\[0\]\.role: .*'encode'"):
        routing_table_from_dict(data, "t.json")


def test_choose_picks_within_a_role_only():
    router = Router()
    router.apply(_table([("a", "http://h:1", 1.0), ("p", "http://h:2", 1.0, "prefill"),
                         ("d", "http://h:3", 1.0, "decode")]))
    assert {router.choose("m").id for _ in range(5)} == {"a"}
    assert router.choose("m", role="prefill").id == "p"
    assert router.choose("m", role="decode").id == "d"


def test_a_replica_that_changes_role_is_a_new_replica():
    router = Router()
    router.apply(_table([("r", "http://h:1", 1.0, "prefill")]))
    old = router.replicas("m")[0]
    old.outstanding = 3
    _, dropped = router.apply(RoutingTable(2, {"m": (ReplicaRoute("r", "http://h:1", 1.0,
                                                                     "decode"),)}))
    assert dropped == [old] and router.replicas("m")[0].role == "decode"
    assert router.replicas("m")[0].outstanding == 0


def _gateway(routes) -> Gateway:
    gw = Gateway(GatewaySettings(models=("m",)))
    gw.router.apply(_table(routes))
    return gw


def test_traffic_splits_between_the_paths_by_capacity():
    # aggregated 3 req/s; disaggregated min(prefill 4, decode 1 + 1) = 2 req/s: 2 of every 5
    gw = _gateway([("a", "http://h:1", 3.0), ("p", "http://h:2", 4.0, "prefill"),
                   ("d1", "http://h:3", 1.0, "decode"), ("d2", "http://h:4", 1.0, "decode")])
    picks = [gw.disagg.wants("m") for _ in range(50)]
    assert sum(picks) == 20
    assert all(sum(picks[i:i + 5]) == 2 for i in range(0, 50, 5))  # smooth, not in bursts


def test_no_disaggregated_path_without_both_phases_healthy():
    gw = _gateway([("a", "http://h:1", 1.0), ("p", "http://h:2", 4.0, "prefill"),
                   ("d", "http://h:3", 1.0, "decode")])
    gw.router.replicas("m")[2].healthy = False
    assert not any(gw.disagg.wants("m") for _ in range(10))
    only = _gateway([("p", "http://h:2", 4.0, "prefill"), ("d", "http://h:3", 1.0, "decode")])
    assert all(only.disagg.wants("m") for _ in range(10))


def test_the_prefill_request_is_one_unstreamed_token_asking_for_a_remote_decode():
    payload = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
               "stream_options": {"include_usage": True}, "max_tokens": 50,
               "max_completion_tokens": 50, "temperature": 0}
    pre = prefill_payload(payload)
    assert pre["max_tokens"] == 1 and pre["max_completion_tokens"] == 1
    assert pre["stream"] is False and "stream_options" not in pre
    assert pre["kv_transfer_params"] == PREFILL_PARAMS and pre["temperature"] == 0
    assert payload["max_tokens"] == 50 and "kv_transfer_params" not in payload  # untouched
    params = {"do_remote_prefill": True, "remote_engine_id": "e"}
    assert decode_payload(payload, params) == {**payload, "kv_transfer_params": params}
    assert decode_payload(payload, None) == payload  # a shared-storage connector returns none
    assert decode_payload(payload, {}) == payload
