"""Scale to zero on the REAL engine: ``coral-hpc serve`` (the real planner, daemon and gateway) of
one generated model with ``idle_after`` and no ``min_replicas`` on the local cluster, vLLM's CPU
build in the replica job.

1. The model starts cold: no request on record, no job.
2. Two requests arrive together through the gateway: both are held while one wake runs (one
   job submitted, not two) and both are answered by vLLM (its own ``system_fingerprint``).
3. Idle for ``idle_after``: the replica drains, its job ends by itself and the model is cold
   again — its GPUs back with Slurm.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from tests.conftest import wait_until
from tests.support.serve_harness import ServeProcess, live_jobs, status
from tests.vllm import example

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

MODEL = "tiny-llama"
IDLE_AFTER_S = 60
#: submit → READY of one engine on a loaded 2-core host (test_replace_vllm.py measured 135 s for
#: two at once); the requests are held at most this long
WAKE_TIMEOUT_S = 420


def write_config(tmp_path: Path, venv: Path, models: Path) -> Path:
    """One tiny Llama on the v100 partition, cold until asked, with short intervals."""
    return example.write_config(
        tmp_path, venv, "vllmwake", time_limit="00:30:00",
        # a wake must not wait for the next epoch
        policy={"replan_interval_s": 600, "idle_after": f"{IDLE_AFTER_S}s",
                "wake_timeout": f"{WAKE_TIMEOUT_S}s"},
        models=[{"name": MODEL, "source": str(models / "coral-tiny-llama"),
                 "architecture": "coral-tiny-llama", "demand": {"requests_per_s": 0.2},
                 "min_replicas": 0}])


def _scale(env: dict, config: Path) -> dict:
    return status(env, config)["models"][0].get("scale") or {}


def test_a_cold_model_is_woken_by_requests_answered_by_vllm_then_gives_its_job_back(
        tmp_path, vllm_env, vllm_venv, test_models):
    env = {**os.environ, **vllm_env}
    config = write_config(tmp_path, vllm_venv, test_models)
    deployment = load_deployment(config)
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        address = wait_until(lambda: (read_info(info_path(deployment)) or {}).get("gateway"),
                             120, "the gateway's address")
        wait_until(lambda: _scale(env, config).get("state") == "cold", 120, "the model cold")
        assert live_jobs(env, deployment) == []

        answers: list[httpx.Response | Exception] = []

        def ask(prompt: str) -> None:
            try:
                answers.append(httpx.post(f"http://{address}/v1/completions", json={
                    "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True}, timeout=WAKE_TIMEOUT_S + 60))
            except httpx.HTTPError as exc:
                answers.append(exc)

        began = time.monotonic()
        askers = [threading.Thread(target=ask, args=(p,)) for p in ("Once upon", "Hello")]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(WAKE_TIMEOUT_S + 90)
        waited = time.monotonic() - began
        for answer in answers:
            assert isinstance(answer, httpx.Response) and answer.status_code == 200, (
                answer if isinstance(answer, Exception) else answer.text)
            body = answer.json()
            assert body["system_fingerprint"].startswith("vllm-"), body  # not the sim engine
            assert body["usage"]["completion_tokens"] == 8
        assert len(answers) == 2
        jobs = live_jobs(env, deployment)
        assert len(jobs) == 1, f"one wake for both requests: {jobs}"
        assert _scale(env, config)["state"] == "warm"
        print(f"woken and answered after {waited:.0f} s")

        # idle for idle_after: the replica drains and its job ends by itself
        wait_until(lambda: live_jobs(env, deployment) == [], IDLE_AFTER_S + 240,
                   "the idle model's job gone")
        assert _scale(env, config)["state"] == "cold"
    finally:
        serve.close(down_grace=30)
