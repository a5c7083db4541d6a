"""Disaggregated serving between two sim processes, as vLLM's proxy drives two vLLM servers:
the prefill server answers ``max_tokens: 1`` with ``kv_transfer_params``, the decode server
continues from them, loading the prompt's KV after the transfer time the planner prices."""

from __future__ import annotations

import time

import httpx

from coral_replica_sim.replica import Layout, StepModel
from tests.e2e.test_engine_sim import _value, sim

KV = ("--kv-transfer-config", '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}')
LAYOUT = ("llama-3.1-8b", "--sim-gpu-types", "a100")
PROMPT = [7] * 2000  # 2000 token ids: a prompt whose prefill step is long next to its transfer


def _post(url: str, body: dict) -> tuple[dict, float]:
    began = time.monotonic()
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json(), time.monotonic() - began


def test_prefill_hands_the_kv_to_decode_which_continues_without_recomputing_the_prompt():
    with sim(*LAYOUT, *KV) as prefill, sim(*LAYOUT, *KV) as decode:
        body = {"model": "llama-3.1-8b", "prompt": PROMPT, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                       "remote_engine_id": None, "remote_block_ids": None,
                                       "remote_host": None, "remote_port": None}}
        first, _ = _post(prefill.url, body)
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_port"] == prefill.port
        assert first["usage"]["completion_tokens"] == 1
        hit, hit_s = _post(decode.url, {"model": "llama-3.1-8b", "prompt": PROMPT,
                                        "max_tokens": 4, "kv_transfer_params": params})
        assert hit["usage"] == {"prompt_tokens": 2000, "completion_tokens": 4, "total_tokens": 2004}
        assert "kv_transfer_params" not in hit  # a decode answer hands nothing on
        m = decode.metrics()
        assert _value(m, "vllm:external_prefix_cache_hits_total") == 1999
        assert _value(m, "vllm:external_prefix_cache_queries_total") == 2000
        # the same request without params is prefilled on the decode server: it takes longer
        _, miss_s = _post(decode.url, {"model": "llama-3.1-8b", "prompt": PROMPT,
                                          "max_tokens": 4})
        assert _value(decode.metrics(), "vllm:external_prefix_cache_hits_total") == 1999
        step = StepModel(Layout("llama-3.1-8b", 1, ("a100",), (32,)))
        transfer = step.kv_transfer_s(2000)
        prompt_step = step.stage_times(0, 2000, 2000)[0]
        assert transfer < prompt_step  # so the difference below is the model's, not noise
        assert hit_s >= transfer
        assert miss_s - hit_s > 0.5 * (prompt_step - transfer)


def test_without_a_kv_connector_the_params_are_ignored_like_vllm():
    with sim(*LAYOUT) as plain:
        body = {"model": "llama-3.1-8b", "prompt": PROMPT, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}}
        answer, _ = _post(plain.url, body)
        assert "kv_transfer_params" not in answer
        names = {k.split("{")[0] for k in plain.metrics()}
        assert "vllm:external_prefix_cache_hits_total" in names  # exported, and zero
        assert _value(plain.metrics(), "vllm:external_prefix_cache_hits_total") == 0
