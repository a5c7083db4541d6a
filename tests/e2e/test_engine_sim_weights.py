"""The sim engine, started as a replica job starts it, for a model named only by its weights: the
job's ``HF_HOME`` holds the model's config.json in the hub cache layout, and the engine sizes the
model from it (no ``--sim-arch``, no catalogue entry)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.e2e.test_engine_sim import FAST, sim

CONFIGS = REPO / "tests" / "data" / "hf_configs"


def _hub(hf_home: Path, repo: str, stem: str) -> None:
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / "r1").mkdir(parents=True)
    shutil.copy(CONFIGS / f"{stem}.json", folder / "snapshots" / "r1" / "config.json")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("r1")


def test_a_model_the_catalogue_never_heard_of_answers_chat(tmp_path):
    _hub(tmp_path, "lab/mistral-finetune", "mistral-7b-v0.1")
    with sim("lab/mistral-finetune", "--sim-gpu-types", "a100", "--served-model-name", "ft",
             *FAST, env={"HF_HOME": str(tmp_path)}) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json={
            "model": "ft", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert "lab/mistral-finetune" in r.json()["system_fingerprint"]


def _start(*args: str, hf_home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coral_hpc.engine.sim", *args, "--port", "0"],
        check=False, capture_output=True, text=True, timeout=30,
        env={"HF_HOME": str(hf_home), "PATH": "/usr/bin:/bin",
             "PYTHONPATH": f"{REPO}:{REPO / 'solver'}"})


def test_gemma2_on_a_v100_refuses_to_start_naming_the_dtype(tmp_path):
    _hub(tmp_path, "google/gemma-2-2b-it", "gemma-2-2b-it")
    out = _start("google/gemma-2-2b-it", "--sim-gpu-types", "v100", hf_home=tmp_path)
    assert out.returncode == 1
    assert "google/gemma-2-2b-it cannot run on v100" in out.stderr
    assert "not supported in float16" in out.stderr and "(have 7.0)" in out.stderr


def test_a_broken_config_json_is_named(tmp_path):
    _hub(tmp_path, "lab/broken", "qwen3-8b")
    config = tmp_path / "hub" / "models--lab--broken" / "snapshots" / "r1" / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers"', '"layers_renamed"'))
    out = _start("lab/broken", "--sim-gpu-types", "a100", hf_home=tmp_path)
    assert out.returncode == 1
    assert f"{config}: missing field 'num_hidden_layers'" in out.stderr
