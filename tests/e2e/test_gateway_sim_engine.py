"""The gateway's key behaviours against the project's own sim engine (coral_hpc.engine.sim), which
speaks vLLM's API and requires the replica key from ``VLLM_API_KEY`` like vLLM does."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import httpx
import openai
import pytest

from harness.gateway import (
    Proc,
    start_gateway,
    start_sim_engine,
    write_models_yaml,
    write_table,
)

REPLICA_KEY = "sim-replica-key-51d0"


def _start_sim(tmp, name: str) -> Proc:
    # the key never goes in argv
    return start_sim_engine(tmp, name, "m", "--sim-arch", "qwen3-8b", api_key=REPLICA_KEY)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwsim")
    key_file = tmp / "replica.key"
    key_file.write_text(REPLICA_KEY + "\n")
    key_file.chmod(0o600)
    engines = {n: _start_sim(tmp, n) for n in ("s1", "s2")}
    table = tmp / "table.json"
    write_table(table, 1, {"m": [(n, p.url, 1.0) for n, p in engines.items()]})
    gateway = start_gateway(tmp, write_models_yaml(tmp, ["m"]), table,
                            "--replica-key-file", str(key_file))
    yield {"gw": gateway, "engines": engines}
    gateway.stop()
    for proc in engines.values():
        proc.stop()


def test_openai_client_through_the_gateway_to_sim_engines(sim):
    client = openai.OpenAI(base_url=sim["gw"].url + "/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=sim["engines"]["s1"].url + "/v1", api_key=REPLICA_KEY,
                           max_retries=0)
    messages = [{"role": "user", "content": "Hello"}]
    answer = client.chat.completions.create(model="m", messages=messages, max_tokens=8)
    assert answer.usage.completion_tokens == 8

    def streamed(c) -> str:
        return "".join(chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
            model="m", messages=messages, max_tokens=9, stream=True) if chunk.choices)

    text = streamed(client)
    assert text and text == streamed(direct)        # the sim's filler text is deterministic
    before = httpx.get(sim["gw"].url + "/internal/demand").json()["models"]["m"]
    for chunk in client.chat.completions.create(model="m", messages=messages, max_tokens=5,
                                                stream=True,
                                                stream_options={"include_usage": True}):
        pass
    after = httpx.get(sim["gw"].url + "/internal/demand").json()["models"]["m"]
    assert after["generated_tokens_total"] - before["generated_tokens_total"] == 5


def test_stream_bytes_match_the_engine_but_for_request_ids(sim):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                       "max_tokens": 6, "stream": True})
    mask = lambda raw: re.sub(rb'"(id|created)":("[^"]*"|\d+)', b'"\\1":0', raw)  # noqa: E731
    via = httpx.post(sim["gw"].url + "/v1/chat/completions", content=body, timeout=10)
    direct = httpx.post(sim["engines"]["s2"].url + "/v1/chat/completions", content=body,
                        headers={"Authorization": f"Bearer {REPLICA_KEY}"}, timeout=10)
    assert via.status_code == direct.status_code == 200
    assert mask(via.content) == mask(direct.content)


def test_sim_engine_killed_mid_load_loses_no_plain_request(sim):
    url = sim["gw"].url + "/v1/chat/completions"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def plain(session, i):
        async with session.post(url, json={**chat, "max_tokens": 40, "user": str(i)}) as r:
            return r.status, await r.read()

    async def stream(session):
        async with session.post(url, json={**chat, "max_tokens": 200, "stream": True}) as r:
            return await r.read()

    async def scenario():
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.create_task(stream(session)) for _ in range(4)]
            plains = [asyncio.create_task(plain(session, i)) for i in range(30)]
            await asyncio.sleep(0.4)
            sim["engines"]["s2"].kill9()
            return await asyncio.gather(*plains), await asyncio.gather(*streams)

    plains, streams = asyncio.run(scenario())
    assert [status for status, _ in plains] == [200] * 30
    metrics = httpx.get(sim["gw"].url + "/metrics").text
    retried = re.search(r'^coral_gateway_retries_total\{model="m"\} (\S+)$', metrics, re.M)
    assert retried and float(retried.group(1)) >= 1     # requests on s2 did fail over
    for raw in streams:
        last = [e for e in raw.split(b"\n\n") if e][-1]
        assert last == b"data: [DONE]" or b'"upstream_error"' in last, last[-200:]
