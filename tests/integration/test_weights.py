"""Model weights on the real local cluster: the Hugging Face token reaches the engine's
environment and nowhere else, and ``coral-hpc stage`` downloads each model into HF_HOME once.

No hub is reachable here. The staging test serves the hub's endpoints on loopback
(tests/support/hub_standin.py) and points ``HF_ENDPOINT`` at it: what runs is the real job path —
sbatch, a ``venv`` engine environment (this checkout's venv, which holds huggingface_hub),
``snapshot_download`` into HF_HOME on the shared folder — and what it proves is that every file
arrives, once, with the token from the token file, and that a local model folder is checked from
the compute node. It proves nothing about the real hub beyond those endpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coral_hpc.config import load_deployment
from coral_hpc.launch.endpoint import read_endpoint
from coral_hpc.launch.spec import replica_spec
from coral_hpc.launch.stop import stop_replicas
from coral_hpc.launch.submit import submit_replica
from coral_hpc.slurm import make_client
from coral_hpc.types import ReplicaLayout, StageLayout
from tests.conftest import wait_until
from tests.support.hub_standin import HubStandIn

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_opsTestToken_9c1d5e"


def write_config(tmp_path: Path, token_file: Path, engine: dict, sources: list[str],
                 partition: dict) -> Path:
    config = {
        "deployment": "ops-weights",
        "state_dir": str(tmp_path / "shared"),
        "db_path": str(tmp_path / "daemon" / "ops.db"),
        "cluster": {"time_limit": "00:20:00", "partitions": [partition]},
        "engine": {**engine, "hf_token_file": str(token_file),
                   "hf_home": str(tmp_path / "shared" / "hf-home")},
        "models": [
            {"name": f"m{i}", "source": source, "architecture": "qwen3-8b",
             "mix": {"input_tokens": 256, "output_tokens": 64},
             "demand": {"requests_per_s": 1}, "slo": {"ttft_s": 2.0, "tpot_s": 0.1}}
            for i, source in enumerate(sources)
        ],
    }
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "hf.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


def assert_token_absent(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), f"the token leaked into {path}"


def test_the_hf_token_reaches_only_the_engines_environment(slurm, tmp_path, token_file,
                                                           monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("HF_TOKEN", "hf_inherited_from_the_daemon_shell")
    path = write_config(tmp_path, token_file, {"kind": "sim"}, ["Qwen/Qwen3-8B"],
                        {"name": "a100", "gpu_types": ["a100"]})
    deployment = load_deployment(path)  # validate checks the token file's mode
    spec = replica_spec(deployment, "m0", "tok-1", "t0",
                        ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto"),
                        api_key_file=None)
    assert spec.hf_token_file == str(token_file) and spec.hf_home.endswith("hf-home")
    client = make_client("cli", env=slurm.env)
    job_id = submit_replica(spec, client)
    slurm.track(job_id)
    endpoint = wait_until(lambda: read_endpoint(spec.endpoint_file), 90,
                          f"endpoint file of job {job_id}")
    engine_env = environ_of(endpoint.pid)
    assert engine_env.get("HF_TOKEN") == TOKEN
    assert engine_env.get("HF_HOME") == spec.hf_home
    assert TOKEN not in Path(f"/proc/{endpoint.pid}/cmdline").read_text()
    # the job-side entrypoint (the engine's parent) never holds it, nor the inherited one
    parent = int(Path(f"/proc/{endpoint.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    parent_env = environ_of(parent)
    assert "HF_TOKEN" not in parent_env
    assert TOKEN not in Path(f"/proc/{parent}/cmdline").read_text()
    stop_replicas(client, [job_id], grace_s=20)
    # nor any file the job wrote: spec, rendered scripts, logs, submitit's pickles
    assert_token_absent(deployment.state_path)


def test_stage_downloads_each_model_into_hf_home_once(slurm, tmp_path, token_file):
    model = tmp_path / "hub" / "org-tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(os.urandom(256 * 1024))
    local = tmp_path / "shared" / "models" / "local-model"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    venv = Path(sys.prefix)  # this checkout's venv (make venv): huggingface_hub is a dev extra
    assert (venv / "bin" / "activate").exists(), f"{sys.prefix} is not a venv"
    path = write_config(tmp_path, token_file, {"kind": "vllm"}, ["org/tiny", str(local)],
                        {"name": "v100", "gpu_types": ["v100"],
                         "environment": {"kind": "venv", "path": str(venv)}})
    with HubStandIn({"org/tiny": model}, token=TOKEN) as hub:
        env = {**os.environ, **slurm.env, "HF_ENDPOINT": hub.url, "COLUMNS": "80"}
        env.pop("HF_TOKEN", None)

        def stage() -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-c", "from coral_hpc.cli import main; main()", "stage",
                 str(path), "--json", "--timeout", "240"],
                capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)

        first = stage()
        assert first.returncode == 0, first.stderr
        doc = json.loads(first.stdout)
        slurm.track(doc["job_id"])
        hf_home = tmp_path / "shared" / "hf-home"
        assert doc["hf_home"] == str(hf_home)
        assert doc["results"]["org/tiny"]["status"] == "downloaded"
        assert doc["results"][str(local)]["status"] == "local"
        snapshot = Path(doc["results"]["org/tiny"]["path"])
        assert snapshot.is_relative_to(hf_home)
        for name in ("config.json", "model.safetensors"):
            assert (snapshot / name).read_bytes() == (model / name).read_bytes()
        downloads = hub.file_requests()
        assert sorted(p.rsplit("/", 1)[1] for p in downloads) == ["config.json",
                                                                  "model.safetensors"]
        assert all(auth == f"Bearer {TOKEN}" for _, _, auth in hub.requests)

        second = stage()
        assert second.returncode == 0, second.stderr
        again = json.loads(second.stdout)
        slurm.track(again["job_id"])
        assert again["results"]["org/tiny"]["status"] == "cached"
        assert hub.file_requests() == downloads  # nothing fetched twice

        # a model the hub does not have: named, exit 2 (invalid input), nothing half-written
        missing = write_config(tmp_path, token_file, {"kind": "vllm"}, ["org/missing"],
                               {"name": "v100", "gpu_types": ["v100"],
                                "environment": {"kind": "venv", "path": str(venv)}})
        refused = subprocess.run(
            [sys.executable, "-c", "from coral_hpc.cli import main; main()", "stage",
             str(missing), "--timeout", "240"],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "org/missing" in refused.stdout and "refused" in refused.stdout
    assert_token_absent(tmp_path / "shared")
