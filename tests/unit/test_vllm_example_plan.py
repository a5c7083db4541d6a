"""examples/vllm-cpu.yaml is planned from its measured profiles (examples/vllm-cpu.profiles,
``coral-hpc profile`` on the local cluster's real engine) alone, and what Stage 1 offers each
model follows from what was measured: tiny-chat a single a100 node; tiny-llama, whose 600,000-
token context does not fit one node's measured KV space, only its measured two-node v100
pipeline; tiny-qwen2 only its measured v100 + a100 hetjob with the uneven 3 + 2 split."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.plan.figures import figures_used, measured_profile_dirs
from coral_hpc.plan.inputs import model_specs, policy_of
from coral_solver import catalog, perf
from coral_solver.templates import PerfThroughput, build_library
from coral_solver.types import Stage
from tests.support.vllm_example import disaggregated_example, plan_json

REPO = Path(__file__).resolve().parents[2]
#: the local cluster's node shapes (scripts/dev-cluster: 4 GPUs a node; catalogue memory)
GPUS = {"v100": (4, 32.0), "a100": (4, 40.0)}


@pytest.fixture(scope="module")
def example():
    deployment = load_deployment(REPO / "examples" / "vllm-cpu.yaml")
    perf.configure(measured=measured_profile_dirs(deployment))
    yield deployment
    perf.configure()


def test_every_template_of_the_example_is_a_measured_layout(example):
    models = {m.name: m for m in model_specs(example)}
    library = build_library(models.values(), GPUS, policy_of(example), PerfThroughput(),
                            use_cache=False)
    # Stage 1 does not know partitions (Stage 2 places templates on them): a layout counts when
    # every stage's GPU type is on a partition the model may use
    allowed = {m.name: {g for p in example.cluster.partitions
                        if not m.partitions or p.name in m.partitions for g in p.gpu_types}
               for m in example.models}
    library = {name: [t for t in templates if all(s.gpu_type in allowed[name] for s in t.stages)]
               for name, templates in library.items()}
    layouts = {name: sorted((t.stages for t in templates), key=repr)
               for name, templates in library.items()}
    assert layouts["tiny-chat"] == [(Stage("a100", 4),)]
    assert layouts["tiny-llama"] == [(Stage("v100", 2), Stage("v100", 2))]
    assert layouts["tiny-qwen2"] == [(Stage("v100", 3), Stage("a100", 2))]
    for name, templates in library.items():
        for template in templates:
            assert figures_used(template, models[name].arch).startswith("measured"), template
            # the demand is what the measured layout served within the SLO, with the plan's
            # headroom (policy.demand_headroom)
            assert template.throughput >= models[name].demand_rps * (
                1 + example.policy.demand_headroom), (name, template.throughput)


def test_the_long_context_models_do_not_fit_one_node_by_the_measured_kv(example):
    """The measured KV space (the pipeline heads' kv_capacity_tokens) holds one request of the
    model's max_model_len over at most 3 layers: not over tiny-llama's 4 or tiny-qwen2's 5 (one
    node), so each needs two stages, and tiny-qwen2's split is 3 + 2 or 2 + 3, never 4 + 1."""
    v100 = catalog.gpu_spec("v100")
    for name in ("tiny-llama", "tiny-qwen2"):
        model = example.model(name)
        arch = catalog.model_arch(model.architecture)
        assert model.max_model_len is not None
        assert perf.stage_kv_capacity_tokens(arch, v100, 1, 3) >= model.max_model_len
        assert perf.stage_kv_capacity_tokens(arch, v100, 1, 4) < model.max_model_len


def test_disaggregated_the_long_context_roles_never_sit_on_one_node(example):
    """issue 27: with ``disaggregation: on`` and ``measured_only`` relaxed, the long-context
    models' prefill and decode replicas were planned on one node, whose measured KV space holds
    fewer tokens than max_model_len, and crashed at start. Now no role's stage holds more layers
    than its KV room allows, and the plan says why per model."""
    from dataclasses import replace

    from coral_hpc.plan.figures import use_measured_profiles

    models = [replace(m, disaggregation="on") for m in model_specs(example)]
    policy = replace(policy_of(example), measured_only=False)
    use_measured_profiles(example)  # as the planner does: the example's 1 GiB KV space too
    tm = PerfThroughput()
    library = build_library(models, GPUS, policy, tm, use_cache=False)
    # 1 GiB over 600,000 tokens of 512 B per layer: 3 layers a stage (699,050 tokens), not 4
    most = {"tiny-llama": 3, "tiny-qwen2": 3}
    for name, limit in most.items():
        roles = {t.role for t in library[name]}
        assert roles == {"prefill", "decode"}, name
        assert all(t.pp >= 2 and max(s.layers for s in t.stages) <= limit
                   for t in library[name]), name
    from coral_solver.kv_room import kv_limit

    lines = {m.name: kv_limit(tm, m, GPUS, policy) for m in models}
    assert lines["tiny-chat"] is None
    assert lines["tiny-llama"] == (
        "tiny-llama: max_model_len 600000: every pipeline stage (prefill and decode replicas "
        "alike) must hold one request's KV cache or vLLM refuses to start it; a stage holds at "
        "most 3 of 4 layers on a100 (TP 1), so layouts of fewer than 2 stages are refused")
    assert "at most 3 of 5 layers" in lines["tiny-qwen2"]
    one_stage = replace(policy, n_max=1)
    assert "nothing of it is planned" in kv_limit(tm, models[0], GPUS, one_stage)


def test_plan_names_the_layouts_the_kv_check_refuses(tmp_path, monkeypatch):
    """`coral-hpc plan --json` of the example, disaggregated and not measured-only: every long-
    context replica is a pipeline, and its warnings say why per model."""
    import json

    path = disaggregated_example(tmp_path, measured_only=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = plan_json(path)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    long = [r for r in data["replicas"] if r["model"] in ("tiny-llama", "tiny-qwen2")]
    assert long and all(r["pp"] >= 2 and max(s["layers"] for s in r["stages"]) <= 3
                        for r in long)
    warned = {w.split(":")[0] for w in data["warnings"] if "max_model_len 600000" in w}
    assert warned == {"tiny-llama", "tiny-qwen2"}
    assert any("at most 3 of 4 layers on v100" in w for w in data["warnings"])
