"""Routing under load with real replica processes: weight shares, a replica killed mid-load,
a replica coming back, and table reloads that keep the counters of surviving replicas."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import httpx
import pytest

from harness.gateway import (
    start_gateway,
    start_stub,
    stub_stats,
    write_models_yaml,
    write_table,
)


def _routing(gw) -> dict:
    return httpx.get(gw.url + "/internal/routing", timeout=5).json()


def _wait(predicate, what: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last {last!r}")


async def _load(url: str, bodies: list[dict], concurrency: int) -> list[tuple[int, bytes]]:
    """Send ``bodies`` with ``concurrency`` in flight; returns (status, body) in order."""
    results: list[tuple[int, bytes]] = [(0, b"")] * len(bodies)
    queue = list(enumerate(bodies))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            while queue:
                index, body = queue.pop()
                async with session.post(url, json=body) as response:
                    results[index] = (response.status, await response.read())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


@pytest.fixture
def stubs(tmp_path):
    started = []

    def start(name: str, *args: str, port: int = 0):
        proc = start_stub(tmp_path, name, *args, port=port)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def gateway(tmp_path):
    started = []

    def start(table):
        proc = start_gateway(tmp_path, write_models_yaml(tmp_path, ["m"]), table)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_each_replica_gets_its_weight_share_of_2000_requests(tmp_path, stubs, gateway):
    # Sequential picks follow the weights exactly (tests/unit/test_gateway_routing.py); here 12
    # requests are in flight at all times, the case where load-awareness could skew the shares.
    concurrency = 12
    weights = {"a": 1.0, "b": 2.0, "c": 3.0}
    # The router is load-aware: a replica that answers slower gets less. Replica time is made
    # mostly waiting (10 ms), not CPU, so the three stubs are equally fast even on a small busy
    # machine and the shares measure the policy, not the CPU scheduler.
    procs = {name: stubs(name, "--token-delay", "0.01") for name in weights}
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": [(n, procs[n].url, w) for n, w in weights.items()]})
    gw = gateway(table)
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    results = asyncio.run(_load(gw.url + "/v1/completions", [body] * 2000, concurrency))
    assert all(status == 200 for status, _ in results)
    counts = {n: stub_stats(p)["requests"] for n, p in procs.items()}
    assert sum(counts.values()) == 2000
    total = sum(weights.values())
    for name, weight in weights.items():
        expected = 2000 * weight / total
        assert abs(counts[name] - expected) <= 0.10 * expected, (counts, concurrency)


def test_replica_killed_mid_load_loses_no_request_and_ends_its_streams_cleanly(
        tmp_path, stubs, gateway):
    procs = {n: stubs(n, "--token-delay", "0.02") for n in ("a", "b", "c")}
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": [(n, p.url, 1.0) for n, p in procs.items()]})
    gw = gateway(table)
    url = gw.url + "/v1/chat/completions"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def stream(index: int, started: asyncio.Event, counter: list[int]) -> list[bytes]:
        async with aiohttp.ClientSession() as session:
            body = {**chat, "max_tokens": 60, "stream": True, "user": str(index)}
            async with session.post(url, json=body) as response:
                assert response.status == 200
                raw = b""
                first = True
                async for chunk in response.content.iter_any():
                    raw += chunk
                    if first:
                        first = False
                        counter[0] += 1
                        if counter[0] == 12:
                            started.set()
        return [e for e in raw.split(b"\n\n") if e]

    async def scenario():
        started = asyncio.Event()
        counter = [0]
        streams = [asyncio.create_task(stream(i, started, counter)) for i in range(12)]
        bodies = [{**chat, "max_tokens": 10, "user": str(i)} for i in range(90)]
        plain = asyncio.create_task(_load(url, bodies, 9))
        await started.wait()
        await asyncio.sleep(0.1)
        victim_streams = stub_stats(procs["b"])["streams_in_flight"]
        procs["b"].kill9()                      # kill -9 mid-load
        return victim_streams, await asyncio.gather(*streams), await plain

    victim_streams, streams, plain = asyncio.run(scenario())
    # every non-streaming request answered, by a live replica
    assert [status for status, _ in plain] == [200] * len(plain)
    served = {json.loads(body)["served_by"] for _, body in plain}
    assert served <= {"a", "b", "c"}
    # every stream is whole events only; those on the killed replica end with an error event
    broken = 0
    for events in streams:
        for event in events[:-1]:
            assert event.startswith(b"data: {") and json.loads(event[6:])["choices"] is not None
        if events[-1] == b"data: [DONE]":
            continue
        last = json.loads(events[-1][6:])
        assert last["error"]["type"] == "upstream_error", events[-1]
        broken += 1
    assert victim_streams >= 1 and broken == victim_streams
    metrics = httpx.get(gw.url + "/metrics").text
    retried = [line for line in metrics.splitlines()
               if line.startswith('coral_gateway_retries_total{model="m"}')]
    assert retried and float(retried[0].split()[-1]) >= 1   # some requests failed over
    routing = {s["id"]: s for s in _routing(gw)["models"]["m"]}
    assert routing["b"]["healthy"] is False
    assert all(s["outstanding"] == 0 for s in routing.values())


def test_a_failed_replica_comes_back_when_its_health_answers(tmp_path, stubs, gateway):
    a = stubs("a")
    b = stubs("b")
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": [("a", a.url, 1.0), ("b", b.url, 1.0)]})
    gw = gateway(table)
    port = int(b.address.rsplit(":", 1)[1])
    b.kill9()
    _wait(lambda: not {s["id"]: s for s in _routing(gw)["models"]["m"]}["b"]["healthy"],
          "the prober to take b out")
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    results = asyncio.run(_load(gw.url + "/v1/completions", [body] * 20, 2))
    assert all(status == 200 for status, _ in results)
    b2 = stubs("b2", port=port)                 # the same endpoint answers again
    _wait(lambda: {s["id"]: s for s in _routing(gw)["models"]["m"]}["b"]["healthy"],
          "b back in after /health answers")
    asyncio.run(_load(gw.url + "/v1/completions", [body] * 20, 1))
    assert stub_stats(b2)["requests"] == 10     # its weight share again


def test_table_reload_keeps_counters_of_surviving_replicas(tmp_path, stubs, gateway):
    slow = stubs("slow", "--token-delay", "0.05")
    fast = stubs("fast")
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": [("slow", slow.url, 1.0)]})
    gw = gateway(table)
    body = {"model": "m", "prompt": "x", "max_tokens": 30}    # 1.5 s each

    async def scenario():
        inflight = asyncio.create_task(_load(gw.url + "/v1/completions", [body] * 5, 5))
        await asyncio.to_thread(_wait, lambda: _routing(gw)["models"]["m"][0]["outstanding"] == 5,
                                "5 requests outstanding on slow")
        write_table(table, 2, {"m": [("slow", slow.url, 2.0), ("fast", fast.url, 1.0)]})
        after = await asyncio.to_thread(_wait, lambda: (r := _routing(gw))["version"] == 2 and r,
                                        "version 2 applied")
        states = {s["id"]: s for s in after["models"]["m"]}
        assert states["slow"]["outstanding"] == 5 and states["slow"]["weight"] == 2.0
        assert states["fast"]["outstanding"] == 0
        write_table(table, 3, {"m": [("fast", fast.url, 1.0)]})   # slow removed mid-request
        removed = await asyncio.to_thread(_wait, lambda: (r := _routing(gw))["version"] == 3 and r,
                                          "version 3 applied")
        assert [s["id"] for s in removed["models"]["m"]] == ["fast"]
        return await inflight

    results = asyncio.run(scenario())
    # requests already on the removed replica still finish there
    assert [status for status, _ in results] == [200] * 5
    assert stub_stats(slow)["requests"] == 5
    # an older table is ignored: versions only move forward
    # wait for the gateway to have read it (its log says so), not a fixed 1 s: on a slow host the
    # poller may not have looked yet, and the check below would pass without testing anything
    write_table(table, 2, {"m": [("slow", slow.url, 1.0)]})
    _wait(lambda: "has version 2, not newer than 3; ignored" in gw.log.read_text(errors="replace"),
          "the gateway to read and ignore the version-2 table")
    assert _routing(gw)["version"] == 3


def test_a_replica_answering_500_is_retried_on_another_and_stays_in_routing(
        tmp_path, stubs, gateway):
    # real vLLM after a SIGTERM the daemon did not send (a scancel): /health 200, every new
    # request 500, until the daemon sees the job gone (tests/vllm/test_replace_vllm.py)
    dying, ok = stubs("dying", "--fail-status", "500"), stubs("ok")
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": [("dying", dying.url, 1.0), ("ok", ok.url, 1.0)]})
    gw = gateway(table)
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    for stream in (False, True):
        results = asyncio.run(_load(gw.url + "/v1/completions",
                                    [{**body, "stream": stream}] * 20, 2))
        assert [s for s, _ in results] == [200] * 20, stream
    assert stub_stats(dying)["requests"] > 0  # it was chosen, and its 500s went elsewhere
    routing = {s["id"]: s for s in _routing(gw)["models"]["m"]}
    assert routing["dying"]["healthy"] is True  # a 500 is no transport failure: not taken out


def test_a_request_every_replica_fails_gets_the_last_answer_and_takes_none_out(
        tmp_path, stubs, gateway):
    procs = {n: stubs(n, "--fail-status", "500") for n in ("a", "b")}
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": [(n, p.url, 1.0) for n, p in procs.items()]})
    gw = gateway(table)
    answer = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"},
                        timeout=10)
    assert answer.status_code == 500 and "after shutdown" in answer.text
    assert sum(stub_stats(p)["requests"] for p in procs.values()) == 2  # each tried once
    assert all(s["healthy"] for s in _routing(gw)["models"]["m"])


def test_a_model_first_routed_between_polls_is_served_at_once(tmp_path, stubs, gateway):
    """The daemon routes a model's first replica and `status` calls it READY at that moment: a
    request that comes before the gateway's next poll of the table is served, not answered 503
    (the poller here looks only every 60 s, so only the request itself can have read the table)."""
    a = stubs("a")
    table = tmp_path / "table.json"
    write_table(table, 1, {"m": []})
    gw = start_gateway(tmp_path, write_models_yaml(tmp_path, ["m"]), table,
                       "--poll-interval", "60")
    try:
        body = {"model": "m", "prompt": "x", "max_tokens": 1}
        assert httpx.post(gw.url + "/v1/completions", json=body, timeout=10).status_code == 503
        write_table(table, 2, {"m": [("a", a.url, 1.0)]})
        resp = httpx.post(gw.url + "/v1/completions", json=body, timeout=10)
        assert resp.status_code == 200, resp.text
        assert stub_stats(a)["requests"] == 1
        assert _routing(gw)["version"] == 2
    finally:
        gw.stop()
