"""Prefill/decode disaggregation on the REAL engine: ``coral-hpc serve`` on a deployment with
``policy.disaggregation: on`` plans a prefill and a decode replica of the model, submits them as
two Slurm jobs running vLLM's CPU build with ExampleConnector (the KV cache moves through a
directory under the shared ``state_dir``), and the gateway answers through both:

- at temperature 0 the tokens equal an aggregated replica's (a plain vLLM job, no connector);
- the decode replica loaded the prompt's KV from outside (vLLM's log and its
  ``vllm:external_prefix_cache_hits_total``);
- SIGKILL of the decode replica's job during a burst of non-streaming requests loses none.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from coral_hpc.config import VenvEnvironment, load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.launch import read_endpoint, submit_replica
from coral_hpc.launch.spec import ReplicaSpec, StageSpec
from coral_hpc.slurm import make_client
from tests.conftest import wait_until
from tests.support.serve_harness import ServeProcess, cli, live_jobs, status
from tests.vllm.engine_client import completion, token_ids
from tests.vllm.example import example_copy, example_engine_env

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

MODEL_DIR = "coral-tiny-llama"
#: ~310 tokens: ExampleConnector stores and loads whole KV blocks of the prompt but its last
#: token, so a prompt shorter than a block would move nothing and prove nothing
PROMPT = "Prefill here, decode there, and the same tokens come out of the pipe. " * 8
READY_TIMEOUT_S = 420
MODELS = """
models:
  - name: tiny-llama
    source: {models}/coral-tiny-llama
    architecture: coral-tiny-llama
    max_model_len: 512
    mix: {{input_tokens: 256, output_tokens: 32}}
    demand: {{requests_per_s: 0.5}}
    slo: {{ttft_s: 2.0, tpot_s: 0.2}}
"""


def _disaggregated_copy(tmp_path: Path, venv: Path, models: Path) -> Path:
    """examples/vllm-cpu.yaml with tiny-llama only, disaggregated through ExampleConnector."""
    path = example_copy(tmp_path, venv, models)
    text = path.read_text()
    text = text.replace("engine:\n  kind: vllm\n",
                        "engine:\n  kind: vllm\n  kv_connector: {name: ExampleConnector}\n", 1)
    text = text.replace("policy:\n", "policy:\n  disaggregation: on\n", 1)
    # this test measures no role profiles (`coral-hpc profile --roles` would take minutes):
    # the phases' figures are the model's, which measured_only would refuse
    text, count = re.subn(r"(?m)^  measured_only: true$", "  measured_only: false", text)
    assert count == 1, "examples/vllm-cpu.yaml no longer sets policy.measured_only"
    # one model of our own (two engine jobs at a time), whatever the example's models ask for
    text = text[:text.index("\nmodels:\n")] + MODELS.format(models=models)
    path.write_text(text)
    return path


def _reference_tokens(tmp_path: Path, env: dict, venv: Path, models: Path) -> list[int]:
    """PROMPT's token ids from an aggregated vLLM replica job (no KV connector), then cancelled."""
    environment = VenvEnvironment(path=str(venv), env=example_engine_env())
    spec = ReplicaSpec(
        deployment=f"disaggref{secrets.token_hex(2)}", model="tiny-llama",
        model_source=str(models / MODEL_DIR), replica_id="agg-1", template_id="t-agg",
        stages=(StageSpec("a100", "a100", 1, 4, environment),), tp=1, engine_kind="vllm",
        state_path=str(tmp_path / "ref-state"), time_limit_s=900, max_model_len=512,
        cpus_per_gpu=1, mem_per_gpu_gb=4, health_timeout_s=READY_TIMEOUT_S)
    client = make_client("cli", env=env)
    job_id = submit_replica(spec, client)
    try:
        endpoint = wait_until(lambda: read_endpoint(spec.endpoint_file), READY_TIMEOUT_S,
                              f"aggregated reference replica (job {job_id}) READY")
        return token_ids(completion(endpoint.url, "tiny-llama", PROMPT, max_tokens=16))
    finally:
        client.cancel([job_id])
        wait_until(lambda: job_id not in live_jobs(env, spec.deployment), 120,
                   f"reference job {job_id} gone")


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if re.match(rf"^{re.escape(name)}(\{{| )", line)]
    return sum(values)


def test_prefill_and_decode_jobs_serve_the_same_tokens_and_survive_losing_decode(
        tmp_path, vllm_env, vllm_venv, test_models):
    env = {**os.environ, **vllm_env}
    reference = _reference_tokens(tmp_path, vllm_env, vllm_venv, test_models)
    assert len(reference) == 16

    config = _disaggregated_copy(tmp_path, vllm_venv, test_models)
    deployment = load_deployment(config)
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        def both_roles_ready():
            if not Path(deployment.db_path).exists():
                return None
            ready = [r for r in status(env, config)["replicas"] if r["state"] == "READY"]
            return ready if {r["role"] for r in ready} >= {"prefill", "decode"} else None

        ready = wait_until(both_roles_ready, READY_TIMEOUT_S, "READY prefill and decode replicas")
        by_role = {r["role"]: r for r in ready}
        assert by_role["prefill"]["job_id"] != by_role["decode"]["job_id"]  # two Slurm jobs
        address = read_info(info_path(deployment))["gateway"]
        gateway = f"http://{address}"

        def gateway_routes_both_roles():  # the table follows READY within a poll or two
            routes = httpx.get(gateway + "/internal/routing", timeout=10).json()["models"]
            roles = {r["role"] for r in routes.get("tiny-llama", []) if r["healthy"]}
            return roles >= {"prefill", "decode"}

        wait_until(gateway_routes_both_roles, 60, "the gateway routing to both roles")

        # the same tokens as the aggregated replica, through prefill then decode
        answer = completion(gateway, "tiny-llama", PROMPT, max_tokens=16)
        assert answer["system_fingerprint"].startswith("vllm-"), answer
        assert answer["usage"]["prompt_tokens"] >= 256, answer["usage"]  # several KV blocks
        assert token_ids(answer) == reference
        decode_url = by_role["decode"]["endpoint"]
        hits = _metric(decode_url, "vllm:external_prefix_cache_hits_total")
        print(f"\ndecode replica: {hits:g} prompt tokens loaded from the prefill replica's KV "
              f"of {answer['usage']['prompt_tokens']}")
        decode_log = cli(env, "logs", str(config), by_role["decode"]["id"], "-n", "400").stdout
        assert hits >= 128, f"decode replica reports {hits} external KV hits ({decode_url})"
        assert "External Cache Hit" in decode_log, decode_log[-2000:]
        kv_dir = deployment.state_path / "kv"
        assert kv_dir.is_dir() and any(kv_dir.rglob("*.safetensors")), "no KV under state_dir"
        gw_metrics = httpx.get(gateway + "/metrics", timeout=30).text
        assert re.search(r'coral_gateway_phase_requests_total\{model="tiny-llama",'
                         r'phase="prefill"\} [1-9]', gw_metrics), gw_metrics[-2000:]

        # kill the decode replica's job in the middle of a burst: no request is lost
        results: list[dict] = []
        errors: list[str] = []

        def one(i: int) -> None:
            try:
                results.append(completion(gateway, "tiny-llama", f"#{i} {PROMPT}",
                                          max_tokens=120, ignore_eos=True))
            except Exception as exc:  # noqa: BLE001 - asserted below
                errors.append(repr(exc))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        killed = subprocess.run(["scancel", "--signal=KILL", by_role["decode"]["job_id"]],
                                check=False, capture_output=True, text=True, env=env, timeout=30)
        assert killed.returncode == 0, killed.stderr
        for thread in threads:
            thread.join(300)
        assert errors == [] and len(results) == 8, errors
        gw_metrics = httpx.get(gateway + "/metrics", timeout=30).text
        # on a failure: every answer's usage and finish reason, and which path served it
        assert all(r["usage"]["completion_tokens"] == 120 for r in results), (
            [(r["usage"], [c.get("finish_reason") for c in r["choices"]]) for r in results],
            [line for line in gw_metrics.splitlines() if line.startswith("coral_gateway_phase")])
        print("\n" + "\n".join(line for line in gw_metrics.splitlines()
                               if line.startswith("coral_gateway_phase")))
    finally:
        serve.close(down_grace=30)
        print(json.dumps({"serve_log_tail": (tmp_path / "serve.log").read_text()[-1500:]}))
