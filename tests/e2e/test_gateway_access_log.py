"""The gateway's access log as a site admin reads it (issue 28): a real ``coral-hpc gateway``
process in front of real stub replicas, real HTTP; then the lines in
``<state_dir>/<deployment>/access/`` say who used which model on which replica with how many
tokens, and nothing of what was asked or answered."""

from __future__ import annotations

import json
import stat
import time

import httpx
import pytest
import yaml

from coral_hpc.gateway.auth import add_key
from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, write_routing_table
from harness.gateway import start_gateway, start_stub, write_models_yaml

SECRET = "confidential-prompt-9d2f41"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwaccess")
    fast = start_stub(tmp, "fast")
    slow = start_stub(tmp, "slow", "--token-delay", "0.2")
    broken = start_stub(tmp, "broken", "--break-after", "3")   # dies mid-stream
    keys = tmp / "api-keys"
    alice = add_key(keys, "alice", lab="astro")
    bob = add_key(keys, "bob")
    models = write_models_yaml(tmp, ["m", "slow", "broken"], api_keys_file=keys)
    config = yaml.safe_load(models.read_text())
    config["retention"] = {"access_log_days": 30}
    models.write_text(yaml.safe_dump(config))
    folder = tmp / "state" / "gwtest" / "access"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "access-2020-01-01.jsonl").write_text("{}\n")   # years old: pruned at start
    today = time.strftime("%Y-%m-%d", time.gmtime())
    table = tmp / "routing-table.json"
    write_routing_table(table, RoutingTable(version=1, models={
        "m": (ReplicaRoute("r1", fast.url, 1.0, job_id="4242"),),
        "slow": (ReplicaRoute("r2", slow.url, 1.0),),   # a table without job ids still works
        "broken": (ReplicaRoute("r3", broken.url, 1.0, job_id="4343"),)}))
    gateway = start_gateway(tmp, models, table)
    env = {"gw": gateway, "alice": alice, "bob": bob, "folder": folder, "today": today,
           "fast": fast}
    try:
        env["answers"] = _traffic(env)
    finally:
        gateway.stop()              # SIGTERM: the gateway writes what is pending, then exits
        fast.stop()
        slow.stop()
        broken.stop()
    yield env


def _traffic(env) -> list[str]:
    """Requests of every outcome; returns the answers' text (which must not be logged)."""
    url = env["gw"].url

    def auth(key):
        return {"Authorization": f"Bearer {env[key] if key in env else key}"}

    answers = []
    chat = {"model": "m", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 7}
    ok = httpx.post(url + "/v1/chat/completions", json=chat, headers=auth("alice"), timeout=10)
    assert ok.status_code == 200, ok.text
    answers.append(ok.json()["choices"][0]["message"]["content"])
    stream = {"model": "m", "prompt": SECRET, "max_tokens": 5, "stream": True,
              "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=stream, headers=auth("bob"),
                      timeout=10) as streamed:
        assert streamed.status_code == 200
        answers.append(streamed.read().decode())
    refused = httpx.post(url + "/v1/chat/completions", json=chat, headers=auth("coral-wrong"),
                         timeout=10)
    assert refused.status_code == 401
    # a client that gives up on a slow stream after its first chunk
    slow = {"model": "slow", "prompt": SECRET, "max_tokens": 50, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=slow, headers=auth("alice"),
                      timeout=10) as gone:
        next(gone.iter_bytes())
    time.sleep(0.5)                 # the gateway notices the closed connection
    # a replica that dies mid-stream: the client already had its 200, then an SSE error event
    dead = {"model": "broken", "prompt": "x", "max_tokens": 10, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=dead, headers=auth("bob"),
                      timeout=10) as cut:
        assert cut.status_code == 200
        assert "incomplete" in cut.read().decode()
    return answers


def _lines(env) -> list[dict]:
    path = env["folder"] / f"access-{env['today']}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_line_per_request_with_who_what_where_and_how_many_tokens(env):
    lines = _lines(env)
    assert [(x["key"], x["lab"], x["path"], x["model"], x["status"]) for x in lines] == [
        ("alice", "astro", "/v1/chat/completions", "m", 200),
        ("bob", None, "/v1/completions", "m", 200),
        (None, None, "/v1/chat/completions", None, 401),
        ("alice", "astro", "/v1/completions", "slow", 499),
        ("bob", None, "/v1/completions", "broken", 200),
    ]
    chat, stream, refused, gone, cut = lines
    assert [x["error"] for x in lines] == [None] * 4 + ["replica_failed_mid_stream"]
    assert (cut["replica"], cut["job_id"]) == ("r3", "4343")
    assert (chat["prompt_tokens"], chat["output_tokens"], chat["tokens_estimated"]) == (
        len(json.dumps([{"role": "user", "content": SECRET}])) // 4, 7, False)
    assert (chat["stream"], chat["replica"], chat["job_id"], chat["replica_url"]) == (
        False, "r1", "4242", env["fast"].url)
    assert (stream["stream"], stream["output_tokens"], stream["prompt_tokens"]) == (
        True, 5, len(json.dumps(SECRET)) // 4)
    assert (gone["replica"], gone["job_id"]) == ("r2", None)
    assert refused["replica"] is None and refused["prompt_tokens"] is None
    assert gone["latency_s"] >= 0.2 and all(0 < x["latency_s"] < 10 for x in lines)
    for line in lines:
        assert time.time() - 120 < time.mktime(time.strptime(
            line["time"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone <= time.time()


def test_no_prompt_no_answer_and_no_key_in_the_log(env):
    text = "".join(p.read_text() for p in env["folder"].iterdir())
    assert SECRET not in text
    for answer in env["answers"]:
        for word in answer.split():
            if word.startswith("w"):      # the stub's generated tokens
                assert word not in text
    assert env["alice"] not in text and env["bob"] not in text


def test_the_log_is_private_and_old_days_are_pruned_by_retention(env):
    folder = env["folder"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == [f"access-{env['today']}.jsonl"]
    assert stat.S_IMODE((folder / f"access-{env['today']}.jsonl").stat().st_mode) == 0o600
