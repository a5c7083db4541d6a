"""The pieces of the real-engine SLO check that decide what is measured (bench/slo_vllm.py,
tests/vllm/test_slo_vllm.py): which measured figure is a model's capacity, how its demand is
written into the deployment, and how long a phase runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.slo_vllm import measured_capacity, phase_seconds, with_demand
from coral_hpc.config import load_deployment
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "vllm-cpu.yaml"
PROFILES = REPO / "examples" / "vllm-cpu.profiles"
LAYOUT_FILES = ("coral-tiny-llama__a100__tp1.yaml",
                "pipelines/coral-tiny-llama-long__v100__tp1__pp2.yaml",
                "pipelines/coral-tiny-qwen2-long__v100+a100__tp1__pp2.yaml")


def test_capacity_is_the_point_at_the_models_mix_and_slo(tmp_path):
    deployment = load_deployment(EXAMPLE)
    files = [PROFILES / name for name in LAYOUT_FILES]
    expected = {yaml.safe_load(f.read_text())["model"]:
                yaml.safe_load(f.read_text())["throughput"][0]["requests_per_s"] for f in files}
    assert measured_capacity(files, deployment) == expected
    # a point at another SLO (or mix) is not the model's capacity, wherever it stands
    profile = yaml.safe_load(files[0].read_text())
    other = dict(profile["throughput"][0], tpot_s=0.05, requests_per_s=1000.0)
    profile["throughput"] = [other, *profile["throughput"]]
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    assert measured_capacity([path], deployment) == {profile["model"]: expected[profile["model"]]}


def test_a_profile_without_the_models_point_is_an_error(tmp_path):
    deployment = load_deployment(EXAMPLE)
    profile = yaml.safe_load((PROFILES / LAYOUT_FILES[0]).read_text())
    profile["throughput"][0]["input_tokens"] += 1
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    with pytest.raises(ValueError, match=r"profile\.yaml: no throughput point for tiny-chat"):
        measured_capacity([path], deployment)


def test_with_demand_sets_only_the_named_models(tmp_path: Path):
    text = with_demand(EXAMPLE.read_text(), {"tiny-chat": 1.234, "tiny-qwen2": 0.5})
    path = tmp_path / "models.yaml"
    path.write_text(text)
    before, after = load_deployment(EXAMPLE), load_deployment(path)
    assert after.model("tiny-chat").demand_rps == 1.234
    assert after.model("tiny-qwen2").demand_rps == 0.5
    assert after.model("tiny-llama").demand_rps == before.model("tiny-llama").demand_rps
    assert after.model("tiny-chat").vllm_args == before.model("tiny-chat").vllm_args


def test_a_phase_at_a_low_rate_runs_long_enough_for_its_requests():
    assert phase_seconds(10.0, 20.0) == 20.0
    assert phase_seconds(1.0, 20.0) == 40.0
    assert phase_seconds(0.0, 20.0) == 20.0
