"""A disaggregated model through the real gateway to real sim engines: the request goes to a
prefill replica (one token, vLLM's kv_transfer_params), then to a decode replica that continues
from the prompt's KV; the client sees one answer, streamed or not, and loses nothing when a
decode replica dies mid-load or, draining, answers 500 to everything."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import httpx
import pytest

from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, write_routing_table
from harness.gateway import (
    Proc,
    start_gateway,
    start_sim_engine,
    start_stub,
    stub_stats,
    write_models_yaml,
)

REPLICA_KEY = "sim-replica-key-d15a"
KV = '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}'


def _start_sim(tmp, name: str, kv: bool = True) -> Proc:
    args = ["--kv-transfer-config", KV] if kv else []
    return start_sim_engine(tmp, name, "d", *args, api_key=REPLICA_KEY)


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {REPLICA_KEY}"}).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwdisagg")
    key_file = tmp / "replica.key"
    key_file.write_text(REPLICA_KEY + "\n")
    key_file.chmod(0o600)
    roles = {"p1": "prefill", "d1": "decode", "d2": "decode"}
    engines = {n: _start_sim(tmp, n) for n in roles}
    engines["plain"] = _start_sim(tmp, "plain", kv=False)  # an aggregated engine, not routed
    table = tmp / "table.json"
    write_routing_table(table, RoutingTable(1, {"d": tuple(
        ReplicaRoute(n, engines[n].url, 1.0, role) for n, role in roles.items())}))
    gateway = start_gateway(tmp, write_models_yaml(tmp, ["d"]), table,
                            "--replica-key-file", str(key_file))
    yield {"gw": gateway, "engines": engines}
    gateway.stop()
    for proc in engines.values():
        proc.stop()


def _mask(raw: bytes) -> bytes:
    """An SSE body with its request ids and timestamps blanked (they differ per request)."""
    return re.sub(rb'"(id|created)":("[^"]*"|\d+)', b'"\\1":0', raw)


def _chat(max_tokens: int, stream: bool = False, content: str = "Tell me about Slurm") -> dict:
    return {"model": "d", "messages": [{"role": "user", "content": content * 20}],
            "max_tokens": max_tokens, "stream": stream}


def test_prefill_then_decode_answers_like_an_aggregated_engine(stack):
    gw, engines = stack["gw"], stack["engines"]
    hits_before = sum(_metric(engines[n].url, "vllm:external_prefix_cache_hits_total")
                      for n in ("d1", "d2"))
    prefill_tokens = _metric(engines["p1"].url, "vllm:generation_tokens_total")
    via = httpx.post(gw.url + "/v1/chat/completions", json=_chat(12), timeout=30)
    assert via.status_code == 200, via.text
    direct = httpx.post(engines["plain"].url + "/v1/chat/completions", json=_chat(12),
                        headers={"Authorization": f"Bearer {REPLICA_KEY}"}, timeout=30)
    answer, alone = via.json(), direct.json()
    assert answer["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
    assert answer["usage"] == alone["usage"]
    assert "kv_transfer_params" not in answer  # the client sees the decode answer only
    # the prefill replica made exactly one token; a decode replica loaded all but one prompt token
    assert _metric(engines["p1"].url, "vllm:generation_tokens_total") - prefill_tokens == 1
    hits = sum(_metric(engines[n].url, "vllm:external_prefix_cache_hits_total")
               for n in ("d1", "d2")) - hits_before
    assert hits == answer["usage"]["prompt_tokens"] - 1
    assert _metric(gw.url, "coral_gateway_phase_requests_total", model="d", phase="prefill") >= 1
    assert _metric(gw.url, "coral_gateway_phase_tokens_total", model="d", phase="decode") >= 12


def test_a_streamed_request_is_one_stream_from_the_decode_replica(stack):
    gw, engines = stack["gw"], stack["engines"]
    via = httpx.post(gw.url + "/v1/chat/completions", json=_chat(7, stream=True), timeout=30)
    direct = httpx.post(engines["plain"].url + "/v1/chat/completions",
                        json=_chat(7, stream=True),
                        headers={"Authorization": f"Bearer {REPLICA_KEY}"}, timeout=30)
    assert via.status_code == 200 and via.headers["content-type"].startswith("text/event-stream")
    assert _mask(via.content) == _mask(direct.content)
    assert via.content.endswith(b"data: [DONE]\n\n")


def test_a_bad_request_gets_the_prefill_replicas_answer(stack):
    body = {"model": "d", "messages": "not a list", "max_tokens": 3}
    r = httpx.post(stack["gw"].url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_decode_replica_killed_mid_load_loses_no_plain_request(stack):
    gw, engines = stack["gw"], stack["engines"]
    url = gw.url + "/v1/chat/completions"

    async def plain(session, i):
        async with session.post(url, json={**_chat(60), "user": str(i)}) as r:
            return r.status, json.loads(await r.read())

    async def scenario():
        async with aiohttp.ClientSession() as session:
            plains = [asyncio.create_task(plain(session, i)) for i in range(24)]
            await asyncio.sleep(0.5)
            engines["d2"].kill9()
            return await asyncio.gather(*plains)

    results = asyncio.run(scenario())
    assert [status for status, _ in results] == [200] * 24
    assert all(body["usage"]["completion_tokens"] == 60 for _, body in results)
    assert _metric(gw.url, "coral_gateway_phase_failures_total", model="d", phase="decode") >= 1


def _routing(gateway: Proc) -> dict[str, dict]:
    routes = httpx.get(gateway.url + "/internal/routing", timeout=10).json()["models"]["d"]
    return {r["id"]: r for r in routes}


def _gateway_over(tmp_path, routes: list[tuple[str, Proc, str]]) -> Proc:
    key_file = tmp_path / "replica.key"
    key_file.write_text(REPLICA_KEY + "\n")
    key_file.chmod(0o600)
    table = tmp_path / "table.json"
    write_routing_table(table, RoutingTable(1, {"d": tuple(
        ReplicaRoute(n, proc.url, 1.0, role) for n, proc, role in routes)}))
    return start_gateway(tmp_path, write_models_yaml(tmp_path, ["d"]), table,
                         "--replica-key-file", str(key_file))


@pytest.mark.parametrize("draining_role", ["decode", "prefill"])
def test_a_draining_replica_answering_500_is_skipped_and_kept_in_routing(tmp_path, draining_role):
    # real vLLM after a SIGTERM the daemon did not send (scancel of the decode job in
    # tests/vllm/test_disagg_vllm.py): /health 200, every new request 500 until the daemon
    # sees the job gone. Every request must still be answered, by the other replica of that role
    procs = {"p": _start_sim(tmp_path, "p"), "d": _start_sim(tmp_path, "d"),
             "dying": start_stub(tmp_path, "dying", "--fail-status", "500")}
    roles = {"p": "prefill", "d": "decode", "dying": draining_role}
    gateway = _gateway_over(tmp_path, [(n, procs[n], roles[n]) for n in ("dying", "p", "d")])
    try:
        for stream in (False, True):
            for i in range(6):
                r = httpx.post(gateway.url + "/v1/chat/completions",
                               json={**_chat(5, stream=stream), "user": str(i)}, timeout=30)
                assert r.status_code == 200, (stream, r.text)
                if stream:
                    assert r.content.endswith(b"data: [DONE]\n\n")
                else:
                    assert r.json()["usage"]["completion_tokens"] == 5
        assert stub_stats(procs["dying"])["requests"] > 0  # it was chosen; its 500s went elsewhere
        assert _routing(gateway)["dying"]["healthy"] is True  # a 500 is no transport failure
        assert _metric(gateway.url, "coral_gateway_phase_failures_total", model="d",
                       phase=draining_role) >= 1
    finally:
        gateway.stop()
        for proc in procs.values():
            proc.stop()


@pytest.mark.parametrize("decode_gone", ["killed", "draining"])
def test_with_no_decode_replica_left_the_prefill_replica_answers_whole(tmp_path, decode_gone):
    # killed: its connection refused; draining: it answers 500 to everything (a scancel)
    prefill = _start_sim(tmp_path, "p")
    decode = (_start_sim(tmp_path, "d") if decode_gone == "killed"
              else start_stub(tmp_path, "d", "--fail-status", "500"))
    gateway = _gateway_over(tmp_path, [("p", prefill, "prefill"), ("d", decode, "decode")])
    try:
        if decode_gone == "killed":
            decode.kill9()
        r = httpx.post(gateway.url + "/v1/chat/completions", json=_chat(9), timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 9
        assert _metric(gateway.url, "coral_gateway_phase_requests_total", model="d",
                       phase="whole_on_prefill") == 1
    finally:
        gateway.stop()
        prefill.stop()
        decode.stop()


def test_when_every_replica_answers_500_the_client_gets_the_last_answer(tmp_path):
    procs = {n: start_stub(tmp_path, n, "--fail-status", "500") for n in ("p", "d")}
    gateway = _gateway_over(tmp_path, [("p", procs["p"], "prefill"), ("d", procs["d"], "decode")])
    try:
        r = httpx.post(gateway.url + "/v1/chat/completions", json=_chat(3), timeout=30)
        assert r.status_code == 500 and "after shutdown" in r.text, r.text
        assert all(s["healthy"] for s in _routing(gateway).values())
    finally:
        gateway.stop()
        for proc in procs.values():
            proc.stop()
