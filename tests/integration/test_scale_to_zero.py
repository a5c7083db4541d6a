"""Scale to zero on the real local cluster with the sim engine, ``coral-hpc serve`` and its real
planner: a model with ``idle_after`` starts cold (no job), a request through the gateway wakes
it and is answered once its replica is READY, the idle model gives its job back after
``idle_after``, and a request that asks to be refused gets 503 with Retry-After while the next
wake runs."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from tests.conftest import wait_until
from tests.support.serve_harness import ServeProcess, live_jobs, one_model_yaml, status

pytestmark = pytest.mark.slurm

BODY = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}


@pytest.fixture
def env(slurm_cluster):
    return {**os.environ, **slurm_cluster}


def _scale(env, config) -> dict:
    return status(env, config)["models"][0]["scale"]


def test_a_cold_model_wakes_on_a_request_and_gives_its_job_back_when_idle(tmp_path, env):
    config = one_model_yaml(tmp_path, idle_after="1m", wake_timeout="4m",
                            replan_interval_s=600)
    deployment = load_deployment(config)
    model = deployment.models[0].name
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        info = wait_until(lambda: (read_info(info_path(deployment)) or {}).get("gateway"), 120,
                          "the gateway's address")
        url = f"http://{info}/v1/chat/completions"
        wait_until(lambda: (_scale(env, config) or {}).get("state") == "cold", 120,
                   "the model cold (no request on record)")
        assert live_jobs(env, deployment) == []
        began = time.monotonic()
        answer = httpx.post(url, json={"model": model, **BODY}, timeout=300)
        waited = time.monotonic() - began
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8
        assert len(live_jobs(env, deployment)) == 1
        assert _scale(env, config)["state"] == "warm"
        # a wake well within the 600 s re-plan interval: the request planned it at once
        assert waited < 240, waited
        # idle for idle_after: its replica drains and its job ends
        wait_until(lambda: live_jobs(env, deployment) == [], 240, "the idle model's job gone")
        assert _scale(env, config)["state"] == "cold"
        refused = httpx.post(url, json={"model": model, **BODY},
                             headers={"Coral-Wake": "reject"}, timeout=30)
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        wait_until(lambda: _scale(env, config)["state"] in ("waking", "warm"), 60,
                   "the refused request's wake")
    finally:
        serve.close(down_grace=10)
