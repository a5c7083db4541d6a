"""Model weights without Slurm: the token file is checked when models.yaml is validated, replicas
carry its path (never its content) and HF_HOME for every environment kind, Apptainer binds the
shared cache at the same path, and the staging script parses and holds no secret."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from coral_hpc.config import hf_home_of, load_deployment
from coral_hpc.errors import ConfigError
from coral_hpc.launch.entrypoint import _engine_env
from coral_hpc.launch.render import render_engine_script
from coral_hpc.launch.spec import replica_spec
from coral_hpc.launch.stage import render_stage_script
from coral_hpc.types import ReplicaLayout, StageLayout

TOKEN = "hf_unitToken_31f0"
ENVIRONMENTS = {
    "venv": {"kind": "venv", "path": "/shared/envs/vllm-0.33.0", "modules": ["cuda/12.8"]},
    "module": {"kind": "module", "modules": ["cuda/12.8", "vllm/0.33.0"]},
    "apptainer": {"kind": "apptainer", "image": "/shared/images/vllm-0.33.0.sif",
                  "modules": ["apptainer"]},
}


def deployment_file(tmp_path: Path, env_kind: str, token_mode: int = 0o600,
                    hf_home: str | None = None) -> Path:
    token = tmp_path / "hf.token"
    token.write_text(TOKEN)
    token.chmod(token_mode)
    engine = {"kind": "sim"} if env_kind == "sim" else {"kind": "vllm"}
    engine["hf_token_file"] = str(token)
    if hf_home:
        engine["hf_home"] = hf_home
    partition = {"name": "a100", "gpu_types": ["a100"]}
    if env_kind != "sim":
        partition["environment"] = ENVIRONMENTS[env_kind]
    config = {
        "deployment": "w", "state_dir": str(tmp_path / "shared"),
        "db_path": str(tmp_path / "db" / "w.db"),
        "cluster": {"partitions": [partition]}, "engine": engine,
        "models": [{"name": "m", "source": "Qwen/Qwen3-8B", "architecture": "qwen3-8b",
                    "mix": {"input_tokens": 256, "output_tokens": 64},
                    "demand": {"requests_per_s": 1}, "slo": {"ttft_s": 2, "tpot_s": 0.1}}],
    }
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_token_file_others_can_read_is_refused_at_validate_naming_the_field(tmp_path):
    path = deployment_file(tmp_path, "venv", token_mode=0o644)
    with pytest.raises(ConfigError) as caught:
        load_deployment(path)
    text = "\n".join(caught.value.problems)
    assert "engine.hf_token_file" in text and "chmod 600" in text and f"{path}:" in text
    assert TOKEN not in text


@pytest.mark.parametrize("env_kind", ["venv", "module", "apptainer", "sim"])
def test_every_environment_kind_gets_hf_home_and_the_token_only_in_its_environment(
        tmp_path, env_kind, monkeypatch):
    deployment = load_deployment(deployment_file(tmp_path, env_kind))
    assert hf_home_of(deployment) == str((tmp_path / "shared" / "huggingface").resolve())
    spec = replica_spec(deployment, "m", "r1", "t0",
                        ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto"),
                        api_key_file=None)
    assert spec.hf_home == hf_home_of(deployment)
    assert TOKEN not in spec.to_json() and spec.hf_token_file == str(tmp_path / "hf.token")
    script = render_engine_script(spec, rank=0, port=23456)
    assert TOKEN not in script
    if env_kind == "apptainer":
        assert f"--bind {spec.hf_home} " in script  # the same path inside, for any user
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_daemon_shell")
    env = _engine_env(spec)
    assert env["HF_TOKEN"] == TOKEN and env["HF_HOME"] == spec.hf_home


@pytest.mark.parametrize("env_kind", ["venv", "module", "apptainer", "sim"])
def test_the_staging_script_parses_runs_in_the_partitions_environment_and_holds_no_secret(
        tmp_path, env_kind):
    deployment = load_deployment(deployment_file(tmp_path, env_kind,
                                                 hf_home="/scratch/shared/hf-cache"))
    script = render_stage_script(deployment, "a100", tmp_path / "r.json", tmp_path / "r.log",
                                 python="/opt/coral/venv/bin/python")
    assert TOKEN not in script
    assert "export HF_HOME=/scratch/shared/hf-cache" in script
    assert "#SBATCH --partition=a100" in script and "--gres" not in script
    assert "Qwen/Qwen3-8B" in script
    for module in (ENVIRONMENTS.get(env_kind) or {}).get("modules", []):
        assert f"module load {module}" in script
    expected = {"venv": "source /shared/envs/vllm-0.33.0/bin/activate",
                "module": "PYTHON=(python3)",
                "apptainer": 'apptainer exec --bind "$HF_HOME" /shared/images/vllm-0.33.0.sif',
                "sim": "PYTHON=(/opt/coral/venv/bin/python)"}[env_kind]
    assert expected in script
    path = tmp_path / "stage.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
