"""Wake on request through a real gateway process and the project's sim engine: a request for
a model scaled to zero asks the daemon for a wake (a file in the private state folder, once
for many requests) and is held until a replica is READY, or answered 503 with Retry-After
(reject mode, or the client's ``Coral-Wake: reject``, or a hold that timed out), or refused at
once when no partition can run the model. The daemon's part (the routing table it publishes)
is written here as the daemon writes it."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
import yaml

from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, WakeInfo, write_routing_table
from coral_hpc.gateway.wake import pending_wakes
from harness.gateway import start_gateway, start_sim_engine, write_models_yaml

REPLICA_KEY = "sim-replica-key-wake-7f3"
BODY = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def _models_yaml(tmp):
    path = write_models_yaml(tmp, ["hold", "rej", "short", "never", "plain"])
    data = yaml.safe_load(path.read_text())
    extra = {"hold": {"idle_after": "5m", "wake_timeout": "30s"},
             "rej": {"idle_after": "5m", "wake": "reject"},
             "short": {"idle_after": "5m", "wake_timeout": "2s"},
             "never": {"idle_after": "5m"}}
    for model in data["models"]:
        model.update(extra.get(model["name"], {}))
    path.write_text(yaml.safe_dump(data))
    return path, tmp / "state" / "gwtest" / "wake"


def _table(path, version, routes=None, wake=None):
    write_routing_table(path, RoutingTable(
        version=version,
        models={m: tuple((routes or {}).get(m, ())) for m in
                ("hold", "rej", "short", "never", "plain")},
        wake=wake or {}))


def _metric(gw, name: str, model: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def stack(tmp_path):
    key = tmp_path / "replica.key"
    key.write_text(REPLICA_KEY + "\n")
    key.chmod(0o600)
    models, wakes = _models_yaml(tmp_path)
    table = tmp_path / "table.json"
    cold = WakeInfo("cold", 40.0)
    _table(table, 1, wake={"hold": cold, "rej": WakeInfo("waking", 40.0, time.time() + 120),
                           "short": cold,
                           "never": WakeInfo("cold", 40.0, None,
                                             "no partition can ever run it (needs 8 GPUs)")})
    gateway = start_gateway(tmp_path, models, table, "--replica-key-file", str(key))
    procs = [gateway]
    yield {"gw": gateway, "table": table, "wakes": wakes, "tmp": tmp_path, "procs": procs}
    for proc in procs:
        proc.stop()


def _post(gw, model, stream=False, headers=None, timeout=60):
    return httpx.post(gw.url + "/v1/chat/completions", json={"model": model, "stream": stream,
                                                            **BODY},
                      headers=headers or {}, timeout=timeout)


def test_held_requests_share_one_wake_and_are_answered_once_a_replica_is_ready(stack):
    gw = stack["gw"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        began = time.monotonic()
        held = [pool.submit(_post, gw, "hold", stream=(i % 2 == 1)) for i in range(8)]
        deadline = time.monotonic() + 10
        while "hold" not in pending_wakes(stack["wakes"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "hold" in pending_wakes(stack["wakes"]), "the gateway asked for no wake"
        time.sleep(1.5)  # the requests are held meanwhile, none answered
        assert not any(f.done() for f in held)
        engine = start_sim_engine(stack["tmp"], "e1", "hold", "--sim-arch", "qwen3-8b",
                                  api_key=REPLICA_KEY)
        stack["procs"].append(engine)
        _table(stack["table"], 2, routes={"hold": [ReplicaRoute("r1", engine.url, 1.0)]})
        answers = [f.result() for f in held]
    assert [a.status_code for a in answers] == [200] * 8, [a.text[:200] for a in answers]
    # held streams: the 200 head and a comment line at once, then the engine's own stream
    assert all(a.text.startswith(": waking hold\n\n") and "data: [DONE]" in a.text
               for a in answers[1::2])
    assert all(a.json()["usage"]["completion_tokens"] == 4 for a in answers[0::2])
    assert time.monotonic() - began >= 1.5
    assert _metric(gw, "coral_gateway_wakes_total", "hold") == 1
    assert _metric(gw, "coral_gateway_wake_held_total", "hold") == 8
    assert _metric(gw, "coral_gateway_wake_wait_seconds_count", "hold") == 8


def test_reject_mode_answers_503_with_retry_after_from_the_expected_ready_time(stack):
    answer = _post(stack["gw"], "rej", timeout=5)
    assert answer.status_code == 503
    assert 100 <= int(answer.headers["Retry-After"]) <= 121
    assert "waking" in answer.json()["error"]["message"]
    assert "rej" in pending_wakes(stack["wakes"])  # the wake starts either way
    # a client may ask for the 503 itself; the model's own start-up time when nothing is queued
    header = _post(stack["gw"], "hold", headers={"Coral-Wake": "reject"}, timeout=5)
    assert header.status_code == 503 and header.headers["Retry-After"] == "40"
    assert _metric(stack["gw"], "coral_gateway_wake_refused_total", "rej") == 1


def test_a_hold_that_times_out_is_503_with_retry_after(stack):
    began = time.monotonic()
    answer = _post(stack["gw"], "short", timeout=10)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "40"
    assert 1.8 <= time.monotonic() - began < 6
    assert "did not wake within 2 s" in answer.json()["error"]["message"]


def test_a_held_stream_that_times_out_ends_with_an_error_event(stack):
    answer = _post(stack["gw"], "short", stream=True, timeout=10)
    assert answer.status_code == 200  # the head went out with the first comment line
    assert answer.text.startswith(": waking short\n\n")
    assert "did not wake within 2 s" in answer.text and '"code": 503' in answer.text


def test_the_openai_client_reads_a_held_stream(stack):
    import openai

    engine = start_sim_engine(stack["tmp"], "e2", "hold", "--sim-arch", "qwen3-8b",
                              api_key=REPLICA_KEY)
    stack["procs"].append(engine)

    def publish_soon():
        time.sleep(1.0)
        _table(stack["table"], 2, routes={"hold": [ReplicaRoute("r1", engine.url, 1.0)]})

    client = openai.OpenAI(base_url=stack["gw"].url + "/v1", api_key="unused", max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(publish_soon)
        chunks = list(client.chat.completions.create(model="hold", stream=True, **BODY))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_model_no_partition_can_run_is_refused_at_once_saying_why(stack):
    began = time.monotonic()
    answer = _post(stack["gw"], "never", timeout=10)
    assert time.monotonic() - began < 1.5
    assert answer.status_code == 503 and "Retry-After" not in answer.headers
    assert "cannot be woken: no partition can ever run it" in answer.json()["error"]["message"]


def test_a_model_not_scaled_to_zero_keeps_its_plain_503(stack):
    answer = _post(stack["gw"], "plain", timeout=5)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "10"
    assert "plain" not in pending_wakes(stack["wakes"])


def test_a_model_woken_on_prefill_and_decode_replicas_answers_held_requests(stack):
    kv = '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}'
    engines = {name: start_sim_engine(stack["tmp"], name, "hold", "--sim-arch", "qwen3-8b",
                                      "--kv-transfer-config", kv, api_key=REPLICA_KEY)
               for name in ("p1", "d1")}
    stack["procs"].extend(engines.values())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(_post, stack["gw"], "hold")
        streamed = pool.submit(_post, stack["gw"], "hold", stream=True)
        time.sleep(1.0)
        assert not held.done() and not streamed.done()
        _table(stack["table"], 2, routes={"hold": [
            ReplicaRoute("p1", engines["p1"].url, 1.0, "prefill"),
            ReplicaRoute("d1", engines["d1"].url, 1.0, "decode")]})
        answer, stream = held.result(), streamed.result()
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["usage"]["completion_tokens"] == 4
    # the held stream: its head and a comment line during the wake, then the decode
    # replica's own events in the same answer (not an error asking the client to retry)
    assert stream.status_code == 200
    assert stream.text.startswith(": waking hold\n\n"), stream.text[:300]
    assert "data: [DONE]" in stream.text and '"error"' not in stream.text, stream.text[:600]
    decoded = [line for line in httpx.get(stack["gw"].url + "/metrics", timeout=5).text
               .splitlines() if line.startswith("coral_gateway_phase_requests_total{")
               and 'model="hold"' in line and 'phase="decode"' in line]
    assert decoded and float(decoded[0].rsplit(" ", 1)[1]) == 2  # both through prefill→decode
