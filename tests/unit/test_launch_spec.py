"""ReplicaSpec: layouts, validation, JSON round trip, building from models.yaml; secret files;
the atomic endpoint file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from coral_hpc.config import ModuleEnvironment, VenvEnvironment, parse_deployment
from coral_hpc.launch.endpoint import Endpoint, read_endpoint, write_endpoint
from coral_hpc.launch.secrets import SecretFileError, engine_secrets, read_secret
from coral_hpc.launch.spec import ReplicaSpec, SpecError, StageSpec, replica_spec
from coral_hpc.plan.layout import layout_dtype
from coral_hpc.types import ReplicaLayout, StageLayout
from tests.unit.launch_cases import ENVIRONMENTS, LAYOUTS, case_spec


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("env_kind", list(ENVIRONMENTS))
def test_json_round_trip_keeps_every_field(layout, env_kind):
    spec = case_spec(layout, env_kind)
    again = ReplicaSpec.from_json(spec.to_json())
    assert again == spec
    assert again.layout == spec.layout and again.layout.kind == layout
    assert again.env_kind == env_kind


def test_layout_follows_the_stages():
    assert case_spec("single", "venv").layout.kind == "single"
    multinode = case_spec("multinode", "venv")
    assert (multinode.layout.kind, multinode.pp, multinode.total_gpus) == ("multinode", 2, 4)
    hetero = case_spec("hetero", "venv")
    assert hetero.layout.kind == "hetero" and hetero.layer_partition == "48,32"
    # same GPU type, different partitions: Slurm needs a hetjob
    stages = (StageSpec("a100", "a100", 2, 40), StageSpec("gpu", "a100", 2, 40))
    assert replace(case_spec("multinode", "sim"), stages=stages).layout.kind == "hetero"


def test_invalid_specs_name_the_problem():
    spec = case_spec("multinode", "venv")
    with pytest.raises(SpecError, match="stage 1 has 4 GPUs but tp is 2"):
        replace(spec, stages=(spec.stages[0], replace(spec.stages[1], gpus_per_node=4)))
    with pytest.raises(SpecError, match="no vLLM environment"):
        replace(spec, stages=tuple(replace(s, environment=None) for s in spec.stages))
    with pytest.raises(SpecError, match="different vLLM environments"):
        other = ModuleEnvironment(modules=("vllm/0.19.1",))
        replace(spec, stages=(spec.stages[0], replace(spec.stages[1], environment=other)))
    with pytest.raises(SpecError, match="at least one stage"):
        replace(spec, stages=())
    with pytest.raises(ValueError, match="replica_id"):
        replace(spec, replica_id="bad id;rm")


def test_time_limit_rounds_up_to_whole_minutes():
    spec = case_spec("single", "sim")
    assert replace(spec, time_limit_s=7200).time_limit_min == 120
    assert replace(spec, time_limit_s=7201).time_limit_min == 121


def test_dtype_is_half_when_any_stage_lacks_bf16():
    assert layout_dtype("llama-3.1-70b", ["a100"]) == "auto"
    assert layout_dtype("llama-3.1-70b", ["a100", "v100"]) == "half"
    assert layout_dtype("qwen3-8b", ["t4"]) == "half"
    with pytest.raises(KeyError):
        layout_dtype("qwen3-8b", ["no-such-gpu"])  # the planner never plans an unknown GPU


YAML = """
deployment: demo
state_dir: {state}
db_path: /tmp/demo.db
cluster:
  account: lab
  qos: high
  time_limit: "01:30:00"
  cpus_per_gpu: 6
  mem_per_gpu_gb: 40
  partitions:
    - name: a100
      environment: {{kind: venv, path: /envs/vllm, modules: [cuda/12.8]}}
    - name: v100
      environment: {{kind: venv, path: /envs/vllm, modules: [cuda/12.8]}}
engine:
  kind: vllm
  args: [--enable-prefix-caching]
models:
  - name: llama-70b
    source: meta-llama/Llama-3.1-70B-Instruct
    architecture: llama-3.1-70b
    mix: {{input_tokens: 1024, output_tokens: 256}}
    demand: {{requests_per_s: 1}}
    slo: {{ttft_s: 5, tpot_s: 0.15}}
    max_model_len: 8192
    vllm_args: [--enforce-eager]
"""


def test_replica_spec_from_the_deployment(tmp_path):
    deployment = parse_deployment(YAML.format(state=tmp_path))
    layout = ReplicaLayout(2, (StageLayout("a100", "a100", 48), StageLayout("v100", "v100", 32)),
                           "half")
    spec = replica_spec(
        deployment, "llama-70b", "r7", "tpl-3", layout,
        api_key_file=tmp_path / "key", python="/venv/bin/python",
    )  # fmt: skip
    assert spec.layout == layout  # carried unchanged
    assert ReplicaSpec.from_json(spec.to_json()).layout == layout  # and back from spec.json
    assert spec.layout.kind == "hetero" and spec.pp == 2 and spec.tp == 2
    assert spec.dtype == "half"  # the layout's
    assert spec.engine_args == ("--enable-prefix-caching", "--enforce-eager")
    assert spec.stages[1].environment == VenvEnvironment(path="/envs/vllm", modules=("cuda/12.8",))
    assert (spec.account, spec.qos, spec.cpus_per_gpu, spec.mem_per_gpu_gb) == ("lab", "high", 6, 40)
    assert spec.time_limit_s == 5400 and spec.max_model_len == 8192
    assert spec.state_path == str(tmp_path / "demo")
    assert spec.endpoint_file == tmp_path / "demo" / "endpoints" / "r7.json"
    assert spec.tag.comment() == "coral:deployment=demo;model=llama-70b;replica=r7;template=tpl-3"
    with pytest.raises(SpecError, match="partition 'h100', not in cluster.partitions"):
        replica_spec(deployment, "llama-70b", "r8", "t",
                     ReplicaLayout(4, (StageLayout("h100", "h100", 80),), "auto"), api_key_file=None)


def test_spec_file_is_written_atomically(tmp_path):
    spec = case_spec("single", "sim", state_path=str(tmp_path))
    path = spec.write()
    assert path == tmp_path / "replicas" / "single-1" / "spec.json"
    assert ReplicaSpec.from_json(path.read_text()) == spec
    assert [p.name for p in path.parent.iterdir()] == ["spec.json"]  # no temp file left


# ------------------------------------------------------------------ secrets


def test_secret_files_must_be_private(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-abc\n")
    key.chmod(0o644)
    with pytest.raises(SecretFileError, match="chmod 600"):
        read_secret(key, "API key")
    key.chmod(0o600)
    assert read_secret(key, "API key") == "sk-abc"
    token = tmp_path / "hf"
    token.write_text("  \n")
    token.chmod(0o600)
    with pytest.raises(SecretFileError, match="empty"):
        engine_secrets(str(key), str(token))
    token.write_text("hf_xyz")
    assert engine_secrets(str(key), str(token)) == {"VLLM_API_KEY": "sk-abc", "HF_TOKEN": "hf_xyz"}
    with pytest.raises(SecretFileError, match="cannot read"):
        read_secret(tmp_path / "missing", "API key")


# ------------------------------------------------------------------ endpoint file


def test_endpoint_round_trip_and_partial_files(tmp_path):
    path = tmp_path / "endpoints" / "r1.json"
    assert read_endpoint(path) is None
    endpoint = Endpoint("r1", "42", "http://n1:24001", "n1", 24001, "m", 99, 1.0, 2.0)
    write_endpoint(path, endpoint)
    assert read_endpoint(path) == endpoint
    assert json.loads(path.read_text())["url"] == "http://n1:24001"
    assert [p.name for p in path.parent.iterdir()] == ["r1.json"]
    path.write_text('{"replica_id": "r1", "job_')  # a torn write from something else
    assert read_endpoint(path) is None


def test_endpoint_folder_is_created(tmp_path: Path):
    path = tmp_path / "a" / "b" / "r.json"
    write_endpoint(path, Endpoint("r", "1", "http://h:1", "h", 1, "m", 1, 0.0, 0.0))
    assert path.exists()
