"""``coral-hpc serve examples/vllm-cpu.yaml`` on the local cluster with the REAL engine: the
solver's plan is submitted as vLLM (CPU build) replica jobs through the ``venv`` environment;
every model becomes READY, and completions, chat and SSE streaming through the one gateway are
answered by vLLM (its own ``system_fingerprint``; no sim engine header); ``coral-hpc down``
drains and cancels every replica, none requeued."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import httpx
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.slurm import make_client
from tests.conftest import wait_until
from tests.support.serve_cli import cli, live_jobs, start_serve, wait_every_model_ready
from tests.vllm.example import example_copy

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

SIM_HEADER = "x-coral-engine"


def test_serve_the_vllm_example_on_the_real_engine(tmp_path, vllm_env, vllm_venv, test_models):
    env = {**os.environ, **vllm_env}
    config = example_copy(tmp_path, vllm_venv, test_models)
    deployment = load_deployment(config)
    models = [m.name for m in deployment.models]
    serve = start_serve(env, config, tmp_path)
    try:
        data = wait_every_model_ready(env, config, 600)
        address = read_info(info_path(deployment))["gateway"]
        for model in models:
            resp = httpx.post(f"http://{address}/v1/completions", timeout=120, json={
                "model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
                "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            assert SIM_HEADER not in resp.headers, "answered by the sim engine"
            answer = resp.json()
            assert answer["system_fingerprint"].startswith("vllm-0.32.0"), answer
            assert answer["model"] == model and answer["usage"]["completion_tokens"] == 8

            chat = httpx.post(f"http://{address}/v1/chat/completions", timeout=120, json={
                "model": model, "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 6, "temperature": 0})
            assert chat.status_code == 200, chat.text
            assert chat.json()["system_fingerprint"].startswith("vllm-")
            assert chat.json()["usage"]["completion_tokens"] >= 1

            chunks, done = 0, False
            with httpx.stream("POST", f"http://{address}/v1/completions", timeout=120, json={
                    "model": model, "prompt": "Hello", "max_tokens": 10, "temperature": 0,
                    "ignore_eos": True, "stream": True}) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                assert SIM_HEADER not in stream.headers
                for line in stream.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        payload = json.loads(line[len("data: "):])
                        # vLLM's stream chunks carry no fingerprint; its ids do ("cmpl-…")
                        assert payload["model"] == model and payload["id"].startswith("cmpl-")
                        chunks += 1
            assert done and chunks >= 2, (model, chunks)

        running = sorted(r["job_id"] for r in data["replicas"] if r["state"] == "READY")
        assert running
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
        out = cli(env, "down", str(config), "--grace", "60", "--json")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: not live_jobs(env, deployment.deployment), 120,
                   "no live job of the deployment after down")
        sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-D", "-o", "JobID,State",
                                "-S", "now-1day", "-j", ",".join(running)],
                               check=False, capture_output=True, text=True, env=env,
                               timeout=30).stdout
        runs = [line.split("|") for line in sacct.strip().splitlines()]
        # one line per job (a hetjob: per component, JOBID+N), none repeated by a requeue
        assert sorted({job.split("+")[0] for job, _ in runs}) == running, runs
        assert len({job for job, _ in runs}) == len(runs), f"a job ran twice: {runs}"
        for _job, state in runs:
            assert state == "COMPLETED" or state.startswith("CANCELLED"), runs
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
        leftover = live_jobs(env, deployment.deployment)
        if leftover:
            make_client("cli", env=env).cancel(leftover)
