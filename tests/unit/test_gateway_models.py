"""``GET /v1/models`` and ``GET /v1/models/{id}`` of the gateway (issue 29): OpenAI's shape, the
readiness fields coral-hpc adds, the key rule, and a 404 in OpenAI's error shape. The gateway
runs in-process behind its own HTTP server on a real socket; no replica is needed."""

from __future__ import annotations

import asyncio
import json

from coral_hpc.gateway.auth import KeyChecker, KeyEntry, hash_key
from coral_hpc.gateway.http_server import HttpServer
from coral_hpc.gateway.proxy import Gateway, GatewaySettings
from coral_hpc.gateway.table import ReplicaRoute, RoutingTable


def _gateway(keys: KeyChecker | None = None) -> Gateway:
    gw = Gateway(GatewaySettings(models=("m", "empty", "org/name", "pd")), keys=keys)
    gw.router.apply(RoutingTable(1, {
        "m": (ReplicaRoute("a", "http://h:1", 1.0), ReplicaRoute("b", "http://h:2", 1.0)),
        "empty": (),
        "org/name": (ReplicaRoute("c", "http://h:3", 1.0),),
        "pd": (ReplicaRoute("p", "http://h:4", 1.0, "prefill"),
               ReplicaRoute("d", "http://h:5", 1.0, "decode")),
    }))
    gw.state.learn_models(gw.router.models)
    return gw


async def _get(port: int, path: str, key: str | None = None) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _serve(gw: Gateway, requests):
    async def main():
        server = HttpServer(gw.server_settings())
        port = await server.start("127.0.0.1", 0)
        try:
            return [await _get(port, *r) for r in requests]
        finally:
            await server.close()

    return asyncio.run(main())


def test_the_list_says_which_models_have_a_ready_replica():
    gw = _gateway()
    gw.router.replicas("org/name")[0].healthy = False   # taken out after a failure
    gw.router.replicas("m")[1].healthy = False
    ((status, body),) = _serve(gw, [("/v1/models",)])
    assert status == 200 and body["object"] == "list"
    by_id = {m["id"]: m for m in body["data"]}
    assert list(by_id) == ["empty", "m", "org/name", "pd"]
    for m in by_id.values():  # OpenAI's required fields, as the SDK's Model type reads them
        assert m["object"] == "model" and isinstance(m["created"], int) and m["owned_by"]
    assert (by_id["m"]["ready"], by_id["m"]["ready_replicas"], by_id["m"]["replicas"]) == (
        True, 1, 2)
    assert (by_id["empty"]["ready"], by_id["empty"]["ready_replicas"]) == (False, 0)
    assert (by_id["org/name"]["ready"], by_id["org/name"]["ready_replicas"]) == (False, 0)
    assert by_id["pd"]["ready"] is True and by_id["pd"]["ready_replicas"] == 2


def test_one_model_by_id_and_an_unknown_one_is_openais_404():
    gw = _gateway()
    (ok, slash, empty, unknown, bare) = _serve(gw, [
        ("/v1/models/m",), ("/v1/models/org%2Fname",), ("/v1/models/empty",),
        ("/v1/models/nope",), ("/v1/models/",)])
    assert ok == (200, {"id": "m", "object": "model", "created": 0, "owned_by": "coral-hpc",
                        "ready": True, "ready_replicas": 2, "replicas": 2})
    assert slash[0] == 200 and slash[1]["id"] == "org/name"
    assert empty[0] == 200 and empty[1]["ready"] is False
    status, body = unknown
    assert status == 404
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    assert "'nope'" in body["error"]["message"]
    assert bare[0] == 404   # no id: no such path


def test_both_need_a_key_when_keys_are_configured():
    gw = _gateway(KeyChecker([KeyEntry("alice", hash_key("coral-good"))]))
    refused = _serve(gw, [("/v1/models",), ("/v1/models/m",), ("/v1/models/nope",),
                          ("/v1/models/m", "coral-wrong")])
    assert [status for status, _ in refused] == [401] * 4  # nothing said unauthenticated
    assert all(b["error"]["type"] == "authentication_error" for _, b in refused)
    allowed = _serve(gw, [("/v1/models", "coral-good"), ("/v1/models/m", "coral-good"),
                          ("/v1/models/nope", "coral-good")])
    assert [status for status, _ in allowed] == [200, 200, 404]
