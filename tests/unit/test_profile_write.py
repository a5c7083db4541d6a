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


RECORDED_PP2 = REPO / "tests/data/profiles/pipelines/coral-tiny-llama__v100__tp1__pp2.yaml"


def test_pipeline_profiles_go_under_pipelines_and_keep_their_split(tmp_path):
    path = profile_path(tmp_path, "coral-tiny-llama", "v100", 1, pp=2)
    assert path.parent.name == "pipelines"
    # recorded by `coral-hpc profile --pp 2` on the real engine (bench/paper_pp_configs)
    parsed = parse_measured(RECORDED_PP2)
    assert (parsed.pp, parsed.layer_partition) == (2, (2, 2))


def test_a_measured_pipeline_gives_its_template_the_measured_replica_figure(tmp_path):
    """Stage 1 takes the engine's measured req/s for the exact pipeline layout (the per-stage
    model's figure only estimates the pipeline), at the same mix and an SLO as loose or looser;
    the plan's figures column says which file it came from."""
    from coral_hpc.plan.figures import figures_used
    from coral_solver.templates import PerfThroughput, _with_measured_pipelines, model_templates
    from coral_solver.types import ModelSpec, Policy

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / RECORDED_PP2.name).write_text(RECORDED_PP2.read_text())
    policy = Policy(n_max=3, rho=1e5, max_tp=1)
    gpus = {"v100": (4, 32.0)}

    def model(ttft: float, tpot: float) -> ModelSpec:
        return ModelSpec(name="tiny", arch="coral-tiny-llama", demand_rps=1.0, ttft_s=ttft,
                         tpot_s=tpot, input_tokens=438, output_tokens=6)

    try:
        perf.configure(measured=[tmp_path])
        tm = PerfThroughput()
        loose, strict = model(4.0, 0.4), model(4.0, 0.2)
        pipes = [t for t in _with_measured_pipelines(tm, loose, gpus, policy, []) if t.pp == 2]
        assert [(t.stages[0].layers, t.stages[1].layers, t.throughput) for t in pipes] == [
            (2, 2, pytest.approx(4.5789))]
        assert figures_used(pipes[0], "coral-tiny-llama") == (
            f"measured pipeline ({RECORDED_PP2.name})")
        # in the library it competes: a single node serving more per GPU dominates it
        library = model_templates(tm, loose, gpus, policy)
        best_single = max(t.throughput for t in library if t.pp == 1)
        kept = [t for t in library if t.pp == 2 and t.stages == pipes[0].stages]
        assert kept == ([] if best_single >= 4.5789 else pipes)
        # a stricter SLO than the one measured: the measurement says nothing
        assert _with_measured_pipelines(tm, strict, gpus, policy, []) == []
        assert all(figures_used(t, "coral-tiny-llama") != f"measured pipeline ({RECORDED_PP2.name})"
                   for t in model_templates(tm, strict, gpus, policy))
    finally:
        perf.configure()


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


def test_a_pipeline_over_named_partitions_is_one_task_with_a_stage_each():
    """``--stages v100,v100,a100``: PP 3 where no partition has three nodes (a hetjob); the
    profile's name says every stage's GPU type, so it never passes for a one-type pipeline."""
    from coral_hpc.profile.run import pipeline_task

    deployment = load_deployment(REPO / "examples" / "vllm-cpu.yaml")
    task = pipeline_task(deployment, "tiny-qwen2", ["v100", "v100", "a100"])
    assert (task.pp, task.stage_places) == (3, (("v100", "v100"), ("v100", "v100"),
                                                ("a100", "a100")))
    assert task.gpu_label == "v100+v100+a100"
    assert profile_path(REPO, task.architecture, task.gpu_label, 1, task.pp).name == (
        "coral-tiny-qwen2-long__v100+v100+a100__tp1__pp3.yaml")
    with pytest.raises(ProfileError, match=r"partition 'h100' not in cluster.partitions"):
        pipeline_task(deployment, "tiny-qwen2", ["v100", "h100"])
    with pytest.raises(ProfileError, match="at least two partitions"):
        pipeline_task(deployment, "tiny-qwen2", ["v100"])


def test_a_mixed_gpu_pipeline_profile_never_answers_for_a_one_type_pipeline(tmp_path):
    doc = RECORDED_PP2.read_text().replace("layer_partition: 2,2", "layer_partition: 2,2\n"
                                           "stage_gpus: [v100, a100]")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "coral-tiny-llama__v100+a100__tp1__pp2.yaml").write_text(doc)
    try:
        perf.configure(measured=[tmp_path])
        arch, gpu = catalog.model_arch("coral-tiny-llama"), catalog.gpu_spec("v100")
        (profile,) = perf.measured_pipelines()[(arch.name, gpu.name, 1)]
        assert profile.stage_gpus == ("v100", "a100")
        assert perf.measured_pipeline_throughput(
            arch, gpu, 1, (2, 2), perf.Slo(4.0, 0.4), perf.Mix(438, 6)) is None
    finally:
        perf.configure()


class _EndedJob:
    """A Slurm client whose profiling job has already failed (as `sacct` would say)."""

    def job_states(self, job_ids):
        return {job_id: type("State", (), {"state": "FAILED"})() for job_id in job_ids}


def test_an_engine_job_that_ends_before_health_is_an_engine_failure_naming_its_logs(tmp_path):
    from coral_hpc.profile.run import EngineFailed, ProfileError, _wait_ready

    endpoint_file = tmp_path / "state" / "endpoints" / "profile-1.json"
    with pytest.raises(EngineFailed, match=r"job 42 ended FAILED .*logs under .*state/logs"
                       ) as raised:
        _wait_ready(_EndedJob(), "42", endpoint_file, 30, progress=lambda _: None)
    assert not isinstance(raised.value, ProfileError)  # exit 5 (engine), not 1 (a bug)


def test_profile_help_lists_exit_status_5_for_a_failed_engine():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "from coral_hpc.cli import main; main()",
                          "profile", "--help"], capture_output=True, text=True, timeout=60,
                         check=False, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "5  an engine job (coral-hpc profile) failed" in out.stdout
