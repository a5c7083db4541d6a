"""An embedding model through the gateway: the sim engine started as a replica job starts an
embedding model (``--runner pooling``, the model named by its folder, whose config.json says
BertModel) answers ``/v1/embeddings`` behind the gateway, whose meter counts its prompt tokens,
as it counts a chat model's."""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest
import yaml

from harness.gateway import Proc, start_gateway, start_sim_engine, write_table
from tests.conftest import REPO

REPLICA_KEY = "sim-replica-key-e3b1"
BGE = REPO / "tests" / "data" / "hf_configs" / "bge-small-en-v1.5.json"


def _models_yaml(tmp, bge_folder) -> str:
    data = {
        "deployment": "gwembed", "state_dir": str(tmp / "state"),
        "db_path": str(tmp / "db.sqlite"), "cluster": {"partitions": [{"name": "gpu"}]},
        "engine": {"kind": "sim"},
        "gateway": {"listen": "127.0.0.1:8000", "open_on_loopback": True},
        "models": [
            # named by its folder alone: its config.json makes it an embedding model
            {"name": "emb", "source": str(bge_folder), "mix": {"input_tokens": 64},
             "demand": "auto", "slo": {"latency_ms": 50}},
            {"name": "chat", "source": "Qwen/Qwen3-8B", "architecture": "qwen3-8b",
             "mix": {"input_tokens": 100, "output_tokens": 20}, "demand": "auto",
             "slo": {"ttft_s": 2, "tpot_s": 0.1}},
        ],
    }
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwembed")
    bge = tmp / "bge-small"
    bge.mkdir()
    shutil.copy(BGE, bge / "config.json")
    key_file = tmp / "replica.key"
    key_file.write_text(REPLICA_KEY + "\n")
    key_file.chmod(0o600)
    engines: dict[str, Proc] = {
        "e1": start_sim_engine(tmp, "e1", "emb", "--sim-arch", str(bge), "--runner", "pooling",
                               api_key=REPLICA_KEY),
        "c1": start_sim_engine(tmp, "c1", "chat", "--sim-arch", "qwen3-8b",
                               api_key=REPLICA_KEY),
    }
    table = tmp / "table.json"
    write_table(table, 1, {"emb": [("e1", engines["e1"].url, 1.0)],
                           "chat": [("c1", engines["c1"].url, 1.0)]})
    gateway = start_gateway(tmp, _models_yaml(tmp, bge), table,
                            "--replica-key-file", str(key_file))
    yield {"gw": gateway, "engines": engines}
    gateway.stop()
    for proc in engines.values():
        proc.stop()


def _demand(gw, model: str) -> dict:
    return httpx.get(gw["gw"].url + "/internal/demand", timeout=5).json()["models"][model]


def test_embeddings_answered_through_the_gateway_and_metered(gw):
    client = openai.OpenAI(base_url=gw["gw"].url + "/v1", api_key="unused", max_retries=0)
    before = _demand(gw, "emb")
    answer = client.embeddings.create(model="emb", input=["hello world", "a second text"])
    assert [d.index for d in answer.data] == [0, 1]
    assert len(answer.data[0].embedding) == 384  # bge-small's hidden size, from its config.json
    assert answer.data[0].embedding != answer.data[1].embedding
    assert answer.usage.prompt_tokens > 0
    after = _demand(gw, "emb")
    assert after["requests_total"] - before["requests_total"] == 1
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == \
        answer.usage.prompt_tokens
    assert after["generated_tokens_total"] == before["generated_tokens_total"]
    # the same vectors for the same text: the engine's filler is deterministic
    again = client.embeddings.create(model="emb", input="hello world")
    assert again.data[0].embedding == answer.data[0].embedding


def test_each_model_answers_only_what_its_runner_serves(gw):
    url = gw["gw"].url
    chat = httpx.post(url + "/v1/chat/completions", timeout=10, json={
        "model": "emb", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 404, chat.text  # as vLLM's pooling runner: no completions route
    embed = httpx.post(url + "/v1/embeddings", timeout=10, json={"model": "chat", "input": "x"})
    assert embed.status_code == 404, embed.text  # a generating model has no /v1/embeddings
    ok = httpx.post(url + "/v1/chat/completions", timeout=10, json={
        "model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_a_too_long_input_is_refused_as_vllm_does(gw):
    r = httpx.post(gw["gw"].url + "/v1/embeddings", timeout=10,
                   json={"model": "emb", "input": list(range(600))})
    assert r.status_code == 400
    assert "maximum context length is 512" in r.text
