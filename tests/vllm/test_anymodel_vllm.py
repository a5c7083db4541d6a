"""Any model a site has, on the REAL engine: a deployment that names its models by path alone
(no ``architecture:``) — a mixture of experts no catalogue knows (Qwen3-MoE), a small decoder and
an embedding model (a BERT encoder), all from scripts/make-test-models — validates, plans and
serves on the local cluster with vLLM's CPU build, in one serve:

1. ``coral-hpc validate`` shows what it derived from each config.json: the MoE's experts, the
   encoder's task, and that a V100 cannot run the MoE (fused-MoE kernels);
2. ``coral-hpc serve`` plans from those derivations (no load phases, no profiles of these
   models) and starts every engine at once: the MoE on an a100 node;
3. through the gateway: a chat completion and a streamed chat completion from the MoE and the
   decoder, answered by vLLM; ``/v1/embeddings`` from the encoder, one vector of its hidden size
   per input, its prompt tokens counted as the engine's tokenizer counts them;
4. ``coral-hpc down`` leaves no job.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.store import open_store
from tests.conftest import wait_until
from tests.support.serve_harness import ServeProcess, cli, live_jobs, wait_every_model_ready
from tests.vllm import example

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

#: submit → READY of three engines loading at once on a 2-core host (one took about 90 s alone)
READY_S = 600
#: coral-tiny-bert's hidden_size (scripts/make-test-models): the length of each embedding
EMBED_DIM = 128
GENERATORS = ("moe", "chat")


def write_config(tmp_path, venv, models):
    """Three models by path alone, each planned from its config.json."""
    return example.write_config(
        tmp_path, venv, "vllmany", time_limit="00:30:00", partitions=("v100", "a100"),
        policy={"replan_interval_s": 600},
        models=[
            {"name": "moe", "source": str(models / "coral-tiny-qwen3moe"),
             "demand": {"requests_per_s": 0.2}},
            {"name": "chat", "source": str(models / "coral-tiny-qwen2"),
             "demand": {"requests_per_s": 0.2}},
            {"name": "embed", "source": str(models / "coral-tiny-bert"),
             "mix": {"input_tokens": 32}, "slo": {"latency_ms": 500},
             "demand": {"requests_per_s": 0.2}},
        ])


def _assert_validate_shows_what_it_derived(env: dict, config) -> None:
    out = cli(env, "validate", str(config), "--json")
    assert out.returncode == 0, out.stderr
    facts = {f["name"]: f for f in json.loads(out.stdout)["model_facts"]}
    assert all(f["estimate"] == "family" for f in facts.values()), facts
    assert (facts["moe"]["model_type"], facts["moe"]["experts"],
            facts["moe"]["active_experts"]) == ("qwen3_moe", 4, 2)
    assert "fused-MoE" in facts["moe"]["excluded_gpus"]["v100"]
    assert (facts["chat"]["model_type"], facts["chat"]["experts"]) == ("qwen2", 0)
    assert (facts["embed"]["model_type"], facts["embed"]["task"]) == ("bert", "embed")


def _assert_chat(address: str, model: str) -> None:
    """A chat completion and a streamed one through the gateway, answered by vLLM."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(f"http://{address}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, (model, resp.text)
    answer = resp.json()
    assert answer["system_fingerprint"].startswith("vllm-0.32.0"), answer  # not the sim engine
    assert answer["model"] == model and answer["usage"]["completion_tokens"] == 6

    chunks, usage, done = 0, None, False
    with httpx.stream("POST", f"http://{address}/v1/chat/completions", timeout=120, json={
            **body, "stream": True, "stream_options": {"include_usage": True}}) as stream:
        assert stream.status_code == 200, model
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: "):])
                assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == model
                chunks += 1
                usage = chunk.get("usage") or usage
    # the role chunk, tokens as they come, then the usage chunk: six tokens generated
    assert done and chunks >= 3 and usage and usage["completion_tokens"] == 6, (model, usage)


def _assert_embeddings(address: str, endpoint: str) -> None:
    """``/v1/embeddings`` through the gateway: one vector a input, and the prompt tokens the
    engine's own tokenizer counts (its /tokenize, asked directly)."""
    inputs = ["Hello! How are you today?", "The quick brown fox jumps over the lazy dog."]
    resp = httpx.post(f"http://{address}/v1/embeddings", timeout=120,
                      json={"model": "embed", "input": inputs})
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["model"] == "embed"
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert all(len(d["embedding"]) == EMBED_DIM for d in answer["data"]), answer["data"][0]
    assert answer["data"][0]["embedding"] != answer["data"][1]["embedding"]
    base = endpoint if endpoint.startswith("http") else f"http://{endpoint}"
    counted = sum(httpx.post(f"{base}/tokenize", json={"model": "embed", "prompt": text},
                             timeout=30).json()["count"] for text in inputs)
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] == counted

    # an embedding model generates nothing
    chat = httpx.post(f"http://{address}/v1/chat/completions", timeout=60, json={
        "model": "embed", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2})
    assert chat.status_code in (400, 404), chat.text


def test_models_by_path_alone_moe_and_embedding_serve_on_the_real_engine(
        tmp_path, vllm_env, vllm_venv, test_models):
    env = {**os.environ, **vllm_env}
    config = write_config(tmp_path, vllm_venv, test_models)
    deployment = load_deployment(config)
    _assert_validate_shows_what_it_derived(env, config)
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        ready = wait_every_model_ready(env, config, READY_S)
        store = open_store(deployment.db_path, readonly=True)
        plan = store.latest_plan()
        store.close()
        partitions = {row["model"]: {s["partition"] for s in row["layout"]["stages"]}
                      for row in plan.rows}
        assert partitions["moe"] == {"a100"}, partitions  # no fused-MoE kernels on Volta
        address = read_info(info_path(deployment))["gateway"]
        for model in GENERATORS:
            _assert_chat(address, model)
        (embed,) = [r for r in ready["replicas"] if r["model"] == "embed" and r["endpoint"]]
        _assert_embeddings(address, embed["endpoint"])

        assert serve.stop() == 0
        out = cli(env, "down", str(config), "--grace", "30")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: not live_jobs(env, deployment), 120, "no job left after down")
    finally:
        serve.close()
