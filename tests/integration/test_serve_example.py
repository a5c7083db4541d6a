"""``coral-hpc serve`` on a test copy of examples/models.yaml, on the real local cluster with the
sim engine and the real solver planner: every model gets READY replicas matching the stored plan
(checked through ``coral-hpc status --json``), requests for every model are answered through
the gateway with streaming intact, SIGTERM stops the daemon and leaves the replicas running, and
``coral-hpc down`` drains and cancels them."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.store import open_store
from tests.conftest import REPO, wait_until
from tests.support.serve_harness import (
    ServeProcess,
    cli,
    live_jobs,
    status,
    wait_every_model_ready,
)
from tests.support.serve_harness import (
    example_copy as harness_example_copy,
)

pytestmark = pytest.mark.slurm

def example_copy(tmp_path: Path) -> Path:
    """examples/models.yaml as a deployment of its own, with short intervals."""
    return harness_example_copy(tmp_path, REPO / "examples" / "models.yaml", "ex",
                                {r"(?m)^  pending_timeout_s: .*$": "  pending_timeout_s: 120"})


def streamed_chat(address: str, model: str) -> tuple[str, int]:
    """A streamed chat completion through the gateway: (text, content chunks)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12, "stream": True}
    text, chunks, done = "", 0, False
    with httpx.stream("POST", f"http://{address}/v1/chat/completions", json=body,
                      timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            delta = json.loads(payload)["choices"][0]["delta"].get("content") or ""
            if delta:
                chunks += 1
                text += delta
    assert done, "the stream did not end with [DONE]"
    return text, chunks


@pytest.fixture
def env(slurm_cluster):
    return {**os.environ, **slurm_cluster}


def test_serve_the_example_end_to_end(tmp_path, env):
    config = example_copy(tmp_path)
    deployment = load_deployment(config)
    models = [m.name for m in deployment.models]
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        data = wait_every_model_ready(env, config, 240)
        # let the daemon finish what the plan asks (e.g. a second replica of one model)
        def settled():
            current = status(env, config)
            live = [r for r in current["replicas"] if r["state"] != "READY"]
            planned = {m["name"]: m["planned_replicas"] for m in current["models"]}
            ready = {m["name"]: m["ready_replicas"] for m in current["models"]}
            return current if not live and planned == ready else None

        data = wait_until(settled, 120, "every planned replica READY and nothing else live")

        # READY replicas match the plan in the store, row by row
        store = open_store(deployment.db_path, readonly=True)
        try:
            plan = store.latest_plan()
        finally:
            store.close()
        assert plan is not None and plan.status in ("optimal", "feasible")
        planned = Counter()
        for row in plan.rows:
            planned[(row["model"], row["template_id"], ",".join(row["partitions"]))] += row["count"]
        actual = Counter((r["model"], r["template"], r["partition"]) for r in data["replicas"])
        assert actual == planned
        assert {k[0] for k in planned} == set(models)
        for model in data["models"]:
            assert model["served"] == pytest.approx(plan.demand[model["name"]])
        for replica in data["replicas"]:
            assert replica["job_id"] and replica["endpoint"]

        # the gateway routes every READY replica within a poll or two of the daemon's cycle
        address = read_info(info_path(deployment))["gateway"]
        ready_ids = {m: {r["id"] for r in data["replicas"] if r["model"] == m} for m in models}

        def routed() -> dict[str, set[str]]:
            routes = httpx.get(f"http://{address}/internal/routing", timeout=10).json()["models"]
            return {m: {r["id"] for r in routes.get(m, []) if r["healthy"]} for m in models}

        deadline = time.monotonic() + 30
        while (seen := routed()) != ready_ids and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen == ready_ids, (seen, (tmp_path / "serve.log").read_text()[-4000:])

        # every model answers through the gateway, streamed and not
        for model in models:
            text, chunks = streamed_chat(address, model)
            assert text.strip() and chunks >= 2, (model, text, chunks)
            resp = httpx.post(f"http://{address}/v1/completions",
                              json={"model": model, "prompt": "Once", "max_tokens": 6},
                              timeout=120)
            assert resp.status_code == 200, resp.text
            answer = resp.json()
            assert answer["model"] == model and answer["choices"][0]["text"]
            assert answer["usage"]["completion_tokens"] >= 1

        # SIGTERM: the daemon and its gateway stop, the replicas keep running
        running = sorted(r["job_id"] for r in data["replicas"])
        assert serve.stop() == 0
        assert read_info(info_path(deployment)) is None
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://{address}/v1/models", timeout=5)
        time.sleep(2)
        assert live_jobs(env, deployment.deployment) == running

        # down drains and cancels them
        out = cli(env, "down", str(config), "--grace", "15", "--json")
        assert out.returncode == 0, out.stderr
        stopped_jobs = json.loads(out.stdout)["jobs"]
        assert sorted(stopped_jobs) == running
        wait_until(lambda: not live_jobs(env, deployment.deployment), 60,
                   "no live job of the deployment after down")
        assert status(env, config)["replicas"] == []
    finally:
        serve.close()
