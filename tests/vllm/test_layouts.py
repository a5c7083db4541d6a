"""Every layout coral-hpc submits, served by real vLLM (CPU build) in Slurm jobs on the local
cluster, through the ordinary launch path (``replica_spec`` → ``submit_replica`` → entrypoint →
``vllm serve`` from the venv environment): a single node, a pipeline over two nodes of one
partition (vLLM's own multi-node flags, rank 1 headless) and a two-partition hetjob with an
uneven ``VLLM_PP_LAYER_PARTITION``.

- each becomes READY (endpoint file) and answers completions, chat and SSE streaming as vLLM
  (its own ``system_fingerprint``);
- the same prompt at temperature 0 gives the same token ids on the pipelines as on PP 1: the
  split and the hetjob wiring are right;
- the daemon's drain (:func:`coral_hpc.launch.stop_replicas`) lets a request in flight finish,
  then the job ends by itself, COMPLETED, never requeued.

One engine job at a time (each ~2-4 GB), so the machine keeps room for everything else.
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import pytest

from coral_hpc.config import VenvEnvironment
from coral_hpc.launch import read_endpoint, stop_replicas, submit_replica
from coral_hpc.launch.spec import ReplicaSpec, StageSpec
from coral_hpc.slurm import make_client
from tests.conftest import wait_until
from tests.vllm.engine_client import chat, completion, streamed_completion, token_ids
from tests.vllm.example import example_engine_env

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

MODEL = "coral-tiny-qwen2"  # 5 layers: every two-stage split is uneven
PROMPT = "The planner picks layouts for every replica of the model"
LAYOUTS = {
    "single": (("v100", "v100", 5),),
    "multinode": (("v100", "v100", 2), ("v100", "v100", 3)),
    "hetero": (("a100", "a100", 3), ("v100", "v100", 2)),
}
READY_TIMEOUT_S = 420


def _spec(tmp_path: Path, venv: Path, models: Path, layout: str) -> ReplicaSpec:
    environment = VenvEnvironment(path=str(venv), env=example_engine_env())
    stages = LAYOUTS[layout]
    return ReplicaSpec(
        deployment=f"vllmtest{secrets.token_hex(2)}", model="tiny", model_source=str(models / MODEL),
        replica_id=f"{layout}-1", template_id=f"t-{layout}",
        stages=tuple(StageSpec(p, g, 1, n, environment) for p, g, n in stages), tp=1,
        engine_kind="vllm", state_path=str(tmp_path / "state"), time_limit_s=900,
        max_model_len=512, cpus_per_gpu=1, mem_per_gpu_gb=4, health_timeout_s=READY_TIMEOUT_S,
        drain_timeout_s=60.0,
    )


@pytest.fixture(scope="module")
def reference_tokens(request) -> dict[str, list[int]]:
    """Token ids the PP-1 replica gave for PROMPT: filled by the single-node case, which runs
    first; kept in pytest's cache too, so one pipelined case can be rerun on its own."""
    cached = request.config.cache.get("coral-vllm/pp1-tokens", None)
    return {"pp1": cached} if cached else {}


def _sacct_runs(env: dict, job_id: str) -> list[str]:
    """``JOBID|STATE`` of every run of the job (``-D``: a requeued job shows once per run; a
    hetjob shows once per component, ``JOBID+N``)."""
    import subprocess

    out = subprocess.run(["sacct", "-X", "-n", "-P", "-D", "-j", job_id, "-o", "JobID,State",
                          "-S", "now-1day"], check=False, capture_output=True, text=True, env=env,
                         timeout=30)
    return out.stdout.split()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_serves_same_tokens_and_drains(layout, request, tmp_path, vllm_env, vllm_venv,
                                              test_models, reference_tokens):
    spec = _spec(tmp_path, vllm_venv, test_models, layout)
    client = make_client("cli", env=vllm_env)
    job_id = submit_replica(spec, client)
    try:
        endpoint = wait_until(lambda: read_endpoint(spec.endpoint_file), READY_TIMEOUT_S,
                              f"{layout} replica (job {job_id}) READY")
        url = endpoint.url
        if layout == "hetero":
            # one Slurm component per stage, each on its own partition
            (job,) = [j for j in client.snapshot(spec.deployment).jobs if j.job_id == job_id]
            assert sorted(c.partition for c in job.components) == ["a100", "v100"]

        answer = completion(url, "tiny", PROMPT, max_tokens=16)
        assert answer["system_fingerprint"].startswith("vllm-0.32.0"), answer
        tokens = token_ids(answer)
        assert len(tokens) == 16
        if layout == "single":
            reference_tokens["pp1"] = tokens
            request.config.cache.set("coral-vllm/pp1-tokens", tokens)
        else:
            assert "pp1" in reference_tokens, "the single-node case runs first"
            assert tokens == reference_tokens["pp1"], f"{layout} split changed the tokens"
            assert f"-pp{spec.pp}-" in answer["system_fingerprint"]

        reply = chat(url, "tiny", "Hello! How are you today?")
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        assert "x-coral-sim" not in {k.lower() for k in reply.headers}

        chunks = streamed_completion(url, "tiny", PROMPT, max_tokens=12)
        assert chunks[-1] == "[DONE]"
        usage = [c["usage"] for c in chunks[:-1] if c.get("usage")]
        assert usage and usage[-1]["completion_tokens"] == 12
        assert sum(1 for c in chunks[:-1] if c.get("choices")) >= 2  # streamed, not one blob

        # the daemon's drain while a long request is in flight: it finishes, then the job ends
        result: dict = {}

        def long_request() -> None:
            try:
                result["answer"] = completion(url, "tiny", PROMPT, max_tokens=120,
                                              ignore_eos=True)
            except Exception as exc:  # noqa: BLE001 - asserted below
                result["error"] = repr(exc)

        thread = threading.Thread(target=long_request)
        thread.start()
        time.sleep(1.0)
        outcome = stop_replicas(client, [job_id], grace_s=90)
        thread.join(120)
        assert "error" not in result, result
        assert result["answer"]["usage"]["completion_tokens"] == 120
        assert result["answer"]["choices"][0]["finish_reason"] == "length"
        assert outcome == {job_id: "exited"}, "the job must end by itself after the drain"
        def finished() -> list[str] | None:
            runs = _sacct_runs(vllm_env, job_id)
            done = runs and not any(r.endswith(("|RUNNING", "|PENDING")) for r in runs)
            return runs if done else None

        runs = wait_until(finished, 60, f"job {job_id} finished in sacct")
        expected = ([f"{job_id}+{i}|COMPLETED" for i in range(spec.pp)] if layout == "hetero"
                    else [f"{job_id}|COMPLETED"])
        assert sorted(runs) == expected, f"one run, ended by itself, never requeued: {runs}"
        assert not spec.endpoint_file.exists()
    finally:
        client.cancel([job_id])
