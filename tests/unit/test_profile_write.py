"""``coral-hpc profile``'s output is what the solver reads: a written profile parses with
:func:`coral_solver.perf_profiles.parse_measured` and then drives the plan (its throughput point
answers exactly for the same arch, GPU, TP, layers, mix and SLO); tasks are checked against
models.yaml with errors that name the option and the valid values."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.profile.measure import EngineMeasurements, prompt_ids
from coral_hpc.profile.run import ProfileError, profile_tasks
from coral_hpc.profile.write import profile_document, profile_path, write_profile
from coral_solver import catalog, perf
from coral_solver.perf_profiles import parse_measured

REPO = Path(__file__).resolve().parents[2]


def _measured() -> EngineMeasurements:
    return EngineMeasurements(kv_capacity_tokens=419328, prefill=[(32, 0.034), (128, 0.117)],
                              decode=[(1, 44, 0.004), (8, 352, 0.010)],
                              throughput=[(64, 32, 2.0, 0.2, 10.46), (64, 32, 1.0, 0.05, 0.0)])


def test_written_profile_parses_and_answers_the_plan(tmp_path):
    doc = profile_document(arch="coral-tiny-qwen2", gpu="v100", tp=1, layers=5, pp=1,
                           layer_partition="5", source="test", model="tiny", partition="v100",
                           startup_s=34.6, submit_to_ready_s=36.2, measured=_measured())
    path = write_profile(profile_path(tmp_path, "coral-tiny-qwen2", "v100", 1), doc)
    assert path.name == "coral-tiny-qwen2__v100__tp1.yaml"
    parsed = parse_measured(path)
    assert (parsed.arch, parsed.gpu, parsed.tp, parsed.layers) == ("coral-tiny-qwen2", "v100", 1, 5)
    # a level that met nothing (0 req/s) is not written as a throughput point
    assert [p.requests_per_s for p in parsed.throughput] == [10.46]
    assert len(parsed.step_latency) == 4
    try:
        perf.configure(measured=[tmp_path])
        arch, gpu = catalog.model_arch("coral-tiny-qwen2"), catalog.gpu_spec("v100")
        got = perf.stage_throughput(arch, gpu, 1, 5, 1, perf.Slo(2.0, 0.2), perf.Mix(64, 32))
        assert got == pytest.approx(10.46)
        assert perf.is_calibrated(arch, gpu)
    finally:
        perf.configure()


def test_pipeline_profiles_go_where_the_solver_does_not_read(tmp_path):
    path = profile_path(tmp_path, "coral-tiny-llama", "v100", 1, pp=2)
    assert path.parent.name == "pipelines"


def test_prompts_have_the_exact_length_and_differ_by_salt():
    assert len(prompt_ids(384)) == 384
    assert prompt_ids(16, 1) != prompt_ids(16, 2)
    assert all(16 <= t < 480 for t in prompt_ids(500))


def test_tasks_follow_models_yaml_and_reject_unknown_names():
    deployment = load_deployment(REPO / "examples" / "vllm-cpu.yaml")
    tasks = profile_tasks(deployment)
    # tiny-llama is limited to v100, tiny-chat to a100; tiny-qwen2 runs on both
    assert {(t.model, t.partition) for t in tasks} == {
        ("tiny-llama", "v100"), ("tiny-qwen2", "v100"), ("tiny-qwen2", "a100"),
        ("tiny-chat", "a100")}
    assert all(t.tp == 1 and t.pp == 1 for t in tasks)
    with pytest.raises(ProfileError, match=r"--partition 'h100'.*valid: \['a100', 'v100'\]"):
        profile_tasks(deployment, partitions=["h100"])
    with pytest.raises(ProfileError, match="--model 'nope'"):
        profile_tasks(deployment, models=["nope"])
    assert [t.pp for t in profile_tasks(deployment, models=["tiny-chat"], pp_degrees=(1, 2))] \
        == [1, 2]
