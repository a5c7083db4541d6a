"""A stage must hold one request of the model's ``max_model_len`` in its KV cache, or vLLM refuses
to start it: Stage 1 drops such stages, taking a stage's KV capacity from the engine's measured
``kv_capacity_tokens`` (a fixed KV space in bytes, so fewer layers hold proportionally more
tokens). Recorded profile: ``coral-hpc profile --pp 2`` of coral-tiny-llama on the real engine
(vLLM's CPU build, VLLM_CPU_KVCACHE_SPACE=1: its head stage of 2 layers held 1,048,576 tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral_solver import catalog, perf
from coral_solver.templates import PerfThroughput, model_templates
from coral_solver.types import ModelSpec, Policy

REPO = Path(__file__).resolve().parents[2]
RECORDED_PP2 = REPO / "tests/data/profiles/pipelines/coral-tiny-llama__v100__tp1__pp2.yaml"
GPUS = {"v100": (4, 32.0), "a100": (4, 40.0)}


@pytest.fixture
def measured_pp2(tmp_path):
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / RECORDED_PP2.name).write_text(RECORDED_PP2.read_text())
    perf.configure(measured=[tmp_path])
    yield tmp_path
    perf.configure()


def _model(max_model_len: int | None) -> ModelSpec:
    # the recorded pipeline's own mix and SLO, so its measured figure applies
    return ModelSpec(name="tiny", arch="coral-tiny-llama", input_tokens=438, output_tokens=6,
                     ttft_s=4.0, tpot_s=0.4, demand_rps=1.0, max_model_len=max_model_len)


def test_a_measured_kv_space_holds_more_tokens_on_fewer_layers(measured_pp2):
    arch, v100 = catalog.model_arch("coral-tiny-llama"), catalog.gpu_spec("v100")
    # 1,048,576 tokens x 2 layers of KV space: 4 layers hold half as many, 1 layer twice
    assert perf.stage_kv_capacity_tokens(arch, v100, 1, 4) == 524_288
    assert perf.stage_kv_capacity_tokens(arch, v100, 1, 1) == 2_097_152
    # no measurement on a100: the analytic model's GPU memory figure
    a100 = catalog.gpu_spec("a100")
    assert perf.stage_kv_capacity_tokens(arch, a100, 1, 4) == perf.kv_capacity_tokens(
        arch, a100, 1, 4, perf._calibration().gpu_memory_utilization)


def test_a_context_one_node_cannot_hold_leaves_only_pipelines(measured_pp2):
    tm = PerfThroughput()
    policy = Policy(n_max=2, rho=1e5, max_tp=1, heterogeneous=False)
    short = model_templates(tm, _model(512), {"v100": GPUS["v100"]}, policy)
    assert any(t.pp == 1 for t in short)
    # 600,000 tokens: more than 4 layers' 524,288 on one v100 node, within 2 layers' 1,048,576
    long = model_templates(tm, _model(600_000), {"v100": GPUS["v100"]}, policy)
    assert long and all(t.pp == 2 for t in long)
    assert all(t.stages[0].layers <= 2 and t.stages[1].layers <= 2 for t in long)
    # beyond what even one layer holds: nothing runs at all
    assert model_templates(tm, _model(2_200_000), {"v100": GPUS["v100"]}, policy) == []


def test_measured_only_keeps_the_measured_layouts(measured_pp2):
    tm = PerfThroughput()
    policy = Policy(n_max=3, rho=1e5, max_tp=1, measured_only=True)
    got = model_templates(tm, _model(None), GPUS, policy)
    # only the recorded pipeline: no single-stage profile, and the model's own pipelines and
    # the a100 layouts rest on no measurement
    assert [(t.stages, t.throughput) for t in got] == [
        ((perf_stage("v100", 2), perf_stage("v100", 2)), pytest.approx(4.5789))]
    assert model_templates(tm, _model(None), GPUS, Policy(n_max=3, rho=1e5, max_tp=1)) != got


def test_a_hetjob_profile_answers_for_its_own_stages_only(tmp_path):
    doc = RECORDED_PP2.read_text().replace("layer_partition: 2,2",
                                           "layer_partition: 2,2\nstage_gpus: [v100, a100]")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "coral-tiny-llama__v100+a100__tp1__pp2.yaml").write_text(doc)
    try:
        perf.configure(measured=[tmp_path])
        tm = PerfThroughput()
        got = model_templates(tm, _model(None), GPUS,
                              Policy(n_max=3, rho=1e5, max_tp=1, measured_only=True))
        assert [t.stages for t in got] == [(perf_stage("v100", 2), perf_stage("a100", 2))]
        # no hetjobs allowed: the measurement is no candidate
        assert model_templates(tm, _model(None), GPUS, Policy(
            n_max=3, rho=1e5, max_tp=1, measured_only=True, heterogeneous=False)) == []
    finally:
        perf.configure()


def perf_stage(gpu: str, layers: int):
    from coral_solver.types import Stage

    return Stage(gpu, layers)


def _disaggregated(max_model_len: int | None) -> ModelSpec:
    return ModelSpec(name="tiny", arch="coral-tiny-llama", input_tokens=438, output_tokens=6,
                     ttft_s=4.0, tpot_s=0.4, demand_rps=1.0, max_model_len=max_model_len,
                     disaggregation="on")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_every_role_holds_one_max_model_len_request(measured_pp2, role):
    # issue 27: disaggregated replicas of a 600,000-token model were planned on one node (its
    # 524,288 measured tokens), and vLLM refused to start them, in a loop
    from coral_solver.roles import phase_templates

    tm = PerfThroughput()
    policy = Policy(n_max=2, rho=1e5, max_tp=1, heterogeneous=False)
    v100 = {"v100": GPUS["v100"]}
    assert any(t.pp == 1 for t in phase_templates(tm, _disaggregated(512), v100, policy, role))
    long = phase_templates(tm, _disaggregated(600_000), v100, policy, role)
    assert long and all(t.pp == 2 and max(s.layers for s in t.stages) <= 2 for t in long)
    assert phase_templates(tm, _disaggregated(2_200_000), v100, policy, role) == []


def test_a_stage_that_just_fits_and_one_that_just_does_not(measured_pp2):
    tm = PerfThroughput()
    # 4 layers on one v100 node hold 524,288 tokens (the measured 1,048,576 x 2 / 4)
    assert tm.kv_fits(_model(524_288), "v100", 1, 4)
    assert not tm.kv_fits(_model(524_289), "v100", 1, 4)
    for role in ("prefill", "decode"):
        assert tm.phase_throughput(_disaggregated(524_288), "v100", 1, 4, 1, role) > 0
        assert tm.phase_throughput(_disaggregated(524_289), "v100", 1, 4, 1, role) == 0.0
