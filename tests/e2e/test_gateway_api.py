"""The gateway as users meet it: real processes, real HTTP, the official ``openai`` client.

One gateway (with API keys, a small body limit and a replica key) in front of one stub replica that
requires that replica key; every bad input is answered with the documented status.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import httpx
import openai
import pytest

from coral_hpc.gateway.auth import add_key
from harness.gateway import (
    CORAL_HPC,
    start_gateway,
    start_stub,
    stub_stats,
    write_models_yaml,
    write_table,
)

MAX_BODY = 4096


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwapi")
    replica_key = tmp / "replica.key"
    replica_key.write_text("replica-secret-7f3a9c\n")
    replica_key.chmod(0o600)
    stub = start_stub(tmp, "r1", "--api-key-file", str(replica_key))
    keys = tmp / "api-keys"
    alice = add_key(keys, "alice")
    bob = add_key(keys, "bob")
    models = write_models_yaml(tmp, ["m", "empty"], api_keys_file=keys, max_body_bytes=MAX_BODY)
    table = tmp / "routing-table.json"
    write_table(table, 1, {"m": [("r1", stub.url, 1.0)], "empty": []})
    gateway = start_gateway(tmp, models, table, "--replica-key-file", str(replica_key))
    yield {"tmp": tmp, "stub": stub, "gw": gateway, "alice": alice, "bob": bob, "keys": keys,
           "replica_key": "replica-secret-7f3a9c", "models": models, "table": table}
    gateway.stop()
    stub.stop()


def _get(env, path: str, key: str = "alice") -> httpx.Response:
    """GET with a client key: /metrics and /internal/* need one on loopback too."""
    return httpx.get(env["gw"].url + path, headers={"Authorization": f"Bearer {env[key]}"},
                     timeout=10)


def _post(env, path: str, body, key: str | None = "alice", **kw) -> httpx.Response:
    headers = kw.pop("headers", {})
    if key is not None:
        headers["Authorization"] = f"Bearer {env[key] if key in env else key}"
    content = body if isinstance(body, (bytes, str)) or hasattr(body, "__next__") else json.dumps(
        body)
    return httpx.post(env["gw"].url + path, content=content, headers=headers, timeout=10, **kw)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6}


def test_streamed_and_plain_answers_are_byte_identical_to_the_replica(env):
    auth = {"Authorization": f"Bearer {env['replica_key']}"}
    for body in (CHAT, {**CHAT, "stream": True},
                 {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
                 {"model": "m", "prompt": "once upon", "max_tokens": 5, "stream": True},
                 {"model": "m", "input": "embed me"}):
        path = ("/v1/embeddings" if "input" in body else
                "/v1/chat/completions" if "messages" in body else "/v1/completions")
        raw = json.dumps(body)
        direct = httpx.post(env["stub"].url + path, content=raw, headers=auth, timeout=10)
        via = _post(env, path, raw)
        assert direct.status_code == via.status_code == 200
        assert via.content == direct.content, body
        assert via.headers["content-type"] == direct.headers["content-type"]


def test_openai_client_works_streaming_included(env):
    client = openai.OpenAI(base_url=env["gw"].url + "/v1", api_key=env["alice"], max_retries=0)
    direct = openai.OpenAI(base_url=env["stub"].url + "/v1", api_key=env["replica_key"],
                           max_retries=0)
    assert [m.id for m in client.models.list()] == ["empty", "m"]
    messages = [{"role": "user", "content": "Hello"}]
    answer = client.chat.completions.create(model="m", messages=messages, max_tokens=5)
    assert answer.choices[0].message.content == direct.chat.completions.create(
        model="m", messages=messages, max_tokens=5).choices[0].message.content
    assert answer.usage.completion_tokens == 5

    def streamed(c):
        parts = [chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
            model="m", messages=messages, max_tokens=7, stream=True) if chunk.choices]
        return "".join(parts)

    text = streamed(client)
    assert text == streamed(direct) and len(text.split()) == 7
    completion = client.completions.create(model="m", prompt="abc", max_tokens=3)
    assert completion.choices[0].text.strip()
    embedding = client.embeddings.create(model="m", input="vector please")
    assert len(embedding.data[0].embedding) == 8
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=messages)
    # one model by id (issue 29: it was a 404), and whether it can answer now
    model = client.models.retrieve("m")
    assert (model.id, model.object, model.owned_by) == ("m", "model", "coral-hpc")
    assert model.model_extra["ready"] is True and model.model_extra["ready_replicas"] == 1
    assert client.models.retrieve("empty").model_extra["ready"] is False
    assert {m.id: m.model_extra["ready"] for m in client.models.list()} == {"empty": False,
                                                                         "m": True}
    with pytest.raises(openai.NotFoundError) as unknown:
        client.models.retrieve("nope")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env["gw"].url + "/v1", api_key="coral-wrong",
                      max_retries=0).models.list()


def test_bad_inputs_get_their_status(env):
    ok = _post(env, "/v1/chat/completions", CHAT)
    assert ok.status_code == 200
    assert _post(env, "/v1/chat/completions", CHAT, key=None).status_code == 401
    assert _post(env, "/v1/chat/completions", CHAT, key="coral-not-a-key").status_code == 401
    wrong_scheme = _post(env, "/v1/chat/completions", CHAT, key=None,
                         headers={"Authorization": f"Basic {env['alice']}"})
    assert wrong_scheme.status_code == 401
    assert httpx.get(env["gw"].url + "/v1/models").status_code == 401

    big = {**CHAT, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    assert _post(env, "/v1/chat/completions", big).status_code == 413

    def chunked():
        yield json.dumps(big).encode()

    # no Content-Length: the limit is enforced while reading
    assert _post(env, "/v1/chat/completions", chunked()).status_code == 413

    for bad in (b"{not json", b"[1, 2]", b'{"messages": []}', b'{"model": 3}',
                b'{"model": "m", "stream": "yes"}', b"\xff\xfe"):
        response = _post(env, "/v1/chat/completions", bad)
        assert response.status_code == 400, bad
        assert response.json()["error"]["type"] == "invalid_request_error"

    missing = _post(env, "/v1/chat/completions", {**CHAT, "model": "not-configured"})
    assert missing.status_code == 404
    assert "not-configured" in missing.json()["error"]["message"]

    before = _get(env, "/internal/demand").json()["models"]["empty"]
    no_replica = _post(env, "/v1/chat/completions", {**CHAT, "model": "empty"})
    assert no_replica.status_code == 503
    assert int(no_replica.headers["Retry-After"]) > 0
    after = _get(env, "/internal/demand").json()["models"]["empty"]
    # turned away for lack of capacity, still demand
    assert after["requests_total"] == before["requests_total"] + 1
    assert after["rejected_total"] == before["rejected_total"] + 1
    assert after["ready_replicas"] == 0


def test_upstream_requests_carry_the_replica_key_and_it_is_never_logged(env):
    assert _post(env, "/v1/completions", {"model": "m", "prompt": "p"}).status_code == 200
    stats = stub_stats(env["stub"])
    assert stats["unauthorized"] == 0 and stats["requests"] > 0
    log = env["gw"].log.read_text()
    assert env["replica_key"] not in log
    assert env["alice"] not in log and env["bob"] not in log


def test_metrics_and_demand_count_per_model_and_key(env):
    def metric(text: str, name: str, **labels) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        match = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    before = _get(env, "/metrics").text
    for _ in range(3):
        assert _post(env, "/v1/chat/completions", CHAT, key="bob").status_code == 200
    streamed = _post(env, "/v1/chat/completions",
                     {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
                     key="bob")
    assert streamed.status_code == 200
    after = _get(env, "/metrics").text
    count = lambda t, n: metric(t, n, key="bob", model="m")  # noqa: E731
    assert count(after, "coral_gateway_requests_total") - count(
        before, "coral_gateway_requests_total") == 4
    # the stub reports 6 completion tokens per answer, in usage
    assert count(after, "coral_gateway_generated_tokens_total") - count(
        before, "coral_gateway_generated_tokens_total") == 24
    assert metric(after, "coral_gateway_ready_replicas", model="m") == 1
    assert metric(after, "coral_gateway_ready_replicas", model="empty") == 0
    assert "coral_gateway_request_seconds_bucket" in after
    demand = _get(env, "/internal/demand").json()
    assert demand["keys"]["bob"]["generated_tokens_total"] >= 24
    assert demand["models"]["m"]["mean_generated_tokens"] > 0


def test_client_disconnect_cancels_the_upstream_request(env, tmp_path):
    slow = start_stub(tmp_path, "slow", "--token-delay", "0.05",
                      "--api-key-file", str(env["tmp"] / "replica.key"))
    try:
        write_table(env["table"], 2, {"m": [("slow", slow.url, 1.0)], "empty": []})
        _wait_routing(env, lambda r: [s["id"] for s in r["models"]["m"]] == ["slow"])

        async def abandon(stream: bool) -> None:
            import aiohttp

            async with aiohttp.ClientSession() as session:
                body = {**CHAT, "max_tokens": 200, "stream": stream}
                response = await session.post(
                    env["gw"].url + "/v1/chat/completions", json=body,
                    headers={"Authorization": f"Bearer {env['alice']}"})
                if stream:
                    await response.content.readany()   # the stream has started
                else:
                    await asyncio.sleep(0.3)
                response.close()                       # walk away mid-answer

        for n, stream in enumerate((False, True), start=1):
            try:
                asyncio.run(asyncio.wait_for(abandon(stream), 2.0))
            except asyncio.TimeoutError:
                pass
            deadline = time.monotonic() + 3
            while stub_stats(slow)["cancelled"] < n and time.monotonic() < deadline:
                time.sleep(0.05)
            stats = stub_stats(slow)
            assert stats["cancelled"] == n, stats      # the replica saw the request go away
            assert stats["in_flight"] == 0
    finally:
        write_table(env["table"], 3, {"m": [("r1", env["stub"].url, 1.0)], "empty": []})
        _wait_routing(env, lambda r: [s["id"] for s in r["models"]["m"]] == ["r1"])
        slow.stop()


def _wait_routing(env, predicate, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        routing = _get(env, "/internal/routing").json()
        if predicate(routing):
            return routing
        if time.monotonic() > deadline:
            raise AssertionError(f"routing never matched; last {routing}")
        time.sleep(0.05)


def test_refuses_to_listen_beyond_loopback_without_keys(tmp_path):
    models = write_models_yaml(tmp_path, ["m"], listen="0.0.0.0:8000")
    result = subprocess.run([CORAL_HPC, "gateway", str(models), "--listen", "0.0.0.0:0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "api_keys_file" in result.stderr and "0.0.0.0" in result.stderr


def test_a_bad_keys_file_stops_the_start_naming_the_line(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice not-a-hash\n")
    models = write_models_yaml(tmp_path, ["m"], api_keys_file=keys)
    result = subprocess.run([CORAL_HPC, "gateway", str(models), "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"{keys}:1:" in result.stderr


def test_keys_cli_shows_a_key_once_and_lists_names(tmp_path):
    keys = tmp_path / "keys"
    added = subprocess.run([CORAL_HPC, "keys", "add", str(keys), "carol"],
                           capture_output=True, text=True, timeout=30)
    assert added.returncode == 0
    key = added.stdout.strip()
    assert key.startswith("coral-") and key not in keys.read_text()
    listed = subprocess.run([CORAL_HPC, "keys", "list", str(keys), "--json"],
                            capture_output=True, text=True, timeout=30)
    assert [row["name"] for row in json.loads(listed.stdout)] == ["carol"]
    assert key not in listed.stdout
