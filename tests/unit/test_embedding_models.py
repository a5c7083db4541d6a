"""Embedding (pooling) models: which checkpoints embed (vLLM's own rule), a BERT-style encoder's
architecture from a real config.json (tests/data/hf_configs/bge-small-en-v1.5.json, source in
its README), the pooling capacity, the models.yaml fields (task, slo.latency_ms) with their
errors, and what planning and launching make of it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.config import load_deployment, parse_deployment
from coral_hpc.errors import ConfigError
from coral_hpc.model_archs import derive_models, derived_deployment
from coral_solver import catalog, perf, perf_pooling
from coral_solver.hf_config import HfConfigError, arch_from_config_json, model_from_config
from coral_solver.hf_encoder import architecture_pools
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "data" / "hf_configs"
SNAPSHOT = REPO / "tests" / "data" / "plan" / "university-busy-snapshot.json"


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(catalog, "_DERIVED", {})
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")


def bge() -> dict:
    return json.loads((CONFIGS / "bge-small-en-v1.5.json").read_text())


def _registered(name: str = "baai/bge-small-en-v1.5"):
    model = model_from_config(bge(), name=name)
    catalog.register_derived(name, model)
    return model.arch


# --- which checkpoints embed ------------------------------------------------------------------

@pytest.mark.parametrize("architecture, pools", [
    ("BertModel", True), ("XLMRobertaModel", True), ("RobertaModel", True),
    ("Qwen2Model", True),  # gte-Qwen2: a decoder's bare Model class embeds
    ("NomicBertModel", True), ("GteNewModel", True),
    ("Qwen3ForCausalLM", False),  # Qwen3-Embedding: needs task: embed
    ("LlamaForCausalLM", False), ("Gemma3ForConditionalGeneration", False),
    ("BertForSequenceClassification", False),  # a classifier: not an embedding model
])
def test_an_embedding_model_is_what_vllms_runner_auto_would_pool(architecture, pools):
    assert architecture_pools({"architectures": [architecture]}) is pools


@pytest.mark.parametrize("path", sorted(p for p in CONFIGS.glob("*.json")
                                        if not p.name.startswith("bge")), ids=lambda p: p.stem)
def test_no_chat_model_config_is_taken_for_an_embedding_model(path):
    assert arch_from_config_json(path).arch.pooling is False


# --- a BERT-style encoder from its config.json -----------------------------------------------

def test_bge_small_is_derived_with_its_published_size():
    model = arch_from_config_json(CONFIGS / "bge-small-en-v1.5.json", name="bge")
    arch = model.arch
    assert arch.pooling and not model.generic and model.model_type == "bert"
    # BAAI/bge-small-en-v1.5 model card: 33.4M parameters (with BertModel's pooler, 0.15M, that
    # vLLM does not load: 33.21M here)
    assert arch.params_b == pytest.approx(0.0334, rel=0.01)
    assert arch.params_b == arch.active_params_b
    assert (arch.layers, arch.hidden, arch.q_heads, arch.kv_heads, arch.head_dim) == (
        12, 384, 12, 12, 32)
    assert arch.max_context == 512  # the card's "Max Tokens: 512"
    assert arch.weight_bytes == pytest.approx(2 * arch.params_b * 1e9)  # served in 16 bit
    assert model.dtype == "fp32"  # the checkpoint is fp32; vLLM serves it in 16 bit
    assert arch.experts == 0 and arch.tied_embeddings


def test_bge_large_size_from_the_same_rules():
    # BAAI/bge-large-en-v1.5: 24 layers, hidden 1024, FFN 4096; model card: 335M parameters
    large = {**bge(), "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
             "num_attention_heads": 16}
    assert model_from_config(large, "l").arch.params_b == pytest.approx(0.335, rel=0.01)


def test_roberta_positions_leave_two_for_the_padding_offset():
    e5 = {**bge(), "model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"],
          "max_position_embeddings": 514, "type_vocab_size": 1, "vocab_size": 250002}
    arch = model_from_config(e5, "e5").arch
    assert arch.max_context == 512 and arch.pooling


def test_a_missing_encoder_field_is_named():
    broken = {k: v for k, v in bge().items() if k != "intermediate_size"}
    with pytest.raises(HfConfigError, match="'intermediate_size'"):
        model_from_config(broken, "b")


def test_a_decoder_named_as_a_bare_model_pools_with_its_family_rules():
    qwen = json.loads((CONFIGS / "qwen2.5-7b.json").read_text())
    generating = model_from_config(qwen, "q").arch
    embedding = model_from_config({**qwen, "architectures": ["Qwen2Model"]}, "q").arch
    assert embedding.pooling and not generating.pooling
    assert embedding.params_b == generating.params_b


# --- capacity ---------------------------------------------------------------------------------

def test_pooling_capacity_meets_its_latency_and_no_more_prompts_would():
    arch, gpu = _registered(), catalog.gpu_spec("a100")
    latency = 0.004
    rate = perf_pooling.pooling_throughput(arch, gpu, 1, arch.layers, 1, latency, 256)
    assert rate > 0
    cal = perf._calibration()
    room = min(cal.max_num_seqs, cal.max_num_batched_tokens // 256)
    # the capacity is b / step(b) at the largest batch whose tail latency fits
    best = max(b for b in range(1, room + 1)
               if perf_pooling.pooling_latency_s(arch, gpu, 1, arch.layers, b, 256) <= latency)
    step = perf.step_latency_s(arch, gpu, 1, arch.layers, 0, best * 256, 0, 1,
                               prefill_ctx=256.0)  # bidirectional: each token sees all 256
    assert rate == pytest.approx(best / step)


def test_pooling_capacity_moves_the_right_way():
    arch, a100 = _registered(), catalog.gpu_spec("a100")

    def rate(latency=0.02, layers=arch.layers, tokens=256, stages=1, gpu=a100):
        return perf_pooling.pooling_throughput(arch, gpu, 1, layers, stages, latency, tokens)

    assert rate(latency=1e-5) == 0.0  # not even one prompt alone
    assert rate(latency=0.002) <= rate(latency=0.02)
    assert rate(layers=6) >= rate(layers=12)
    assert rate(tokens=512) < rate(tokens=64)
    assert rate(stages=2) == 0.0  # embedding replicas are one stage
    assert rate(gpu=catalog.gpu_spec("h100")) > rate(gpu=catalog.gpu_spec("v100"))


def test_the_sim_engine_charges_an_embedding_step_as_the_planner_does():
    from coral_replica_sim.batching import Batch, Sequence
    from coral_replica_sim.replica import Layout, StepModel

    arch = _registered()
    step_model = StepModel(Layout(arch=arch.name, tp=1, gpu_types=("a100",), layers=(12,)))
    prompts = [Sequence(f"s{i}", prompt_tokens=128, max_tokens=1) for i in range(4)]
    batch = Batch(engine=0, decode=(), prefill=tuple((s, 128) for s in prompts))
    (seconds,) = step_model.batch_times(batch)
    planned = perf.step_latency_s(arch, catalog.gpu_spec("a100"), 1, 12, 0, 4 * 128, 0, 1,
                                  prefill_ctx=perf_pooling.pooling_prefill_ctx(arch, 128))
    assert seconds == pytest.approx(planned)


# --- models.yaml ------------------------------------------------------------------------------

BASE = """\
deployment: t
state_dir: /tmp/coral-state
db_path: /tmp/coral.db
cluster:
  partitions:
    - name: a100
      gpu_types: [a100]
      price: {a100: 2.0}
engine:
  kind: sim
models:
  - name: emb
    source: Qwen/Qwen3-Embedding-8B
    architecture: qwen3-8b
    task: embed
    mix: {input_tokens: 256}
    demand: {requests_per_s: 20}
    slo: {latency_ms: 200}
"""

BAD = [
    ("ttft-and-latency", ("slo: {latency_ms: 200}", "slo: {latency_ms: 200, ttft_s: 1}"),
     "models[0].slo", "not both"),
    ("embed-with-ttft", ("slo: {latency_ms: 200}", "slo: {ttft_s: 1, tpot_s: 0.1}"),
     "models[0].slo", "latency_ms"),
    ("embed-with-output", ("{input_tokens: 256}", "{input_tokens: 256, output_tokens: 8}"),
     "models[0].mix.output_tokens", "generates no tokens"),
    ("embed-token-demand", ("{requests_per_s: 20}", "{output_tokens_per_s: 20}"),
     "models[0].demand.output_tokens_per_s", "requests_per_s"),
    ("latency-zero", ("latency_ms: 200", "latency_ms: 0"), "models[0].slo.latency_ms",
     "greater than 0"),
    ("task-typo", ("task: embed", "task: embedding"), "models[0].task", "'generate' or 'embed'"),
    ("generate-with-latency", ("task: embed", "task: generate"), "models[0].slo.latency_ms",
     "ttft_s"),
    ("generate-without-output", ("task: embed\n    mix: {input_tokens: 256}\n    demand: "
                                 "{requests_per_s: 20}\n    slo: {latency_ms: 200}",
                                 "mix: {input_tokens: 256}\n    demand: {requests_per_s: 20}\n"
                                 "    slo: {ttft_s: 1, tpot_s: 0.1}"),
     "models[0].mix.output_tokens", "give mix.output_tokens"),
]


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_embedding_fields_name_the_field(case):
    _, (old, new), field, phrase = case
    with pytest.raises(ConfigError) as info:
        parse_deployment(_edit(BASE, old, new), "bad.yaml")
    wanted = [p for p in info.value.problems if f": {field}: " in p]
    assert wanted, info.value.problems
    assert phrase in wanted[0]


def test_a_generating_model_still_needs_ttft_and_tpot():
    text = _edit(_edit(BASE, "    task: embed\n", ""), "{input_tokens: 256}",
                 "{input_tokens: 256, output_tokens: 9}")
    with pytest.raises(ConfigError) as info:
        parse_deployment(_edit(text, "slo: {latency_ms: 200}", "slo: {ttft_s: 1}"), "bad.yaml")
    assert any("models[0].slo: missing tpot_s" in p for p in info.value.problems)


def test_the_base_embedding_config_is_valid():
    model = parse_deployment(BASE, "ok.yaml").models[0]
    assert model.embedding and model.slo.first_answer_s == pytest.approx(0.2)


def _folder_yaml(tmp_path: Path, stem: str, slo: str, mix: str, task: str = "") -> Path:
    """examples/university.yaml (a V100 and an A100 partition) serving one model ``emb`` from a
    folder holding the published config.json ``stem``."""
    folder = tmp_path / "models" / stem
    folder.mkdir(parents=True)
    shutil.copy(CONFIGS / f"{stem}.json", folder / "config.json")
    text = (REPO / "examples" / "university.yaml").read_text()
    text = text.replace("/scratch/shared/coral-hpc", str(tmp_path / "shared"))
    text = text.replace("~/.local/state/coral-hpc/lab-llm.db", str(tmp_path / "lab-llm.db"))
    text = text.replace("/scratch/shared/hf-cache", str(tmp_path / "hf-cache"))
    text = text[:text.index("\nmodels:")] + "\nmodels:\n"
    text += (f"  - name: emb\n    source: {folder}\n{task}    {mix}\n"
             f"    demand: {{requests_per_s: 200}}\n    {slo}\n")
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_a_bert_folder_with_a_generation_slo_is_refused_naming_its_config(tmp_path):
    path = _folder_yaml(tmp_path, "bge-small-en-v1.5", "slo: {ttft_s: 1, tpot_s: 0.1}",
                        "mix: {input_tokens: 256, output_tokens: 9}")
    problems = derive_models(load_deployment(path))
    assert len(problems) == 1
    assert "models[0].slo:" in problems[0] and "'BertModel'" in problems[0]
    assert "latency_ms" in problems[0] and "config.json" in problems[0]
    result = CliRunner().invoke(cli, ["validate", str(path), "--snapshot", str(SNAPSHOT)])
    assert result.exit_code == 2, result.output


def test_a_causal_lm_folder_with_a_latency_slo_needs_task_embed(tmp_path):
    path = _folder_yaml(tmp_path, "qwen3-8b", "slo: {latency_ms: 200}",
                        "mix: {input_tokens: 256}")
    problems = derive_models(load_deployment(path))
    assert len(problems) == 1 and "'Qwen3ForCausalLM'" in problems[0]
    assert "task: embed" in problems[0]


def test_a_causal_lm_served_as_an_embedding_model_plans_and_launches_pooled(tmp_path):
    from coral_hpc.launch.render import render_engine_script
    from coral_hpc.launch.spec import replica_spec
    from coral_hpc.plan.inputs import model_specs
    from coral_hpc.types import ReplicaLayout, StageLayout

    path = _folder_yaml(tmp_path, "qwen3-8b", "slo: {latency_ms: 200}",
                        "mix: {input_tokens: 256}", task="    task: embed\n")
    deployment = derived_deployment(load_deployment(path))
    (spec,) = model_specs(deployment, {})
    assert spec.pooling and spec.disaggregation == "off" and spec.ttft_s == pytest.approx(0.2)
    layout = ReplicaLayout(1, (StageLayout("gpu-a100", "a100-80g", 36),), "bfloat16", "both")
    replica = replica_spec(deployment, "emb", "r1", "t1", layout, api_key_file=None)
    # a ...ForCausalLM checkpoint: vLLM converts it into an embedding model
    assert replica.runner_args == ("--runner", "pooling", "--convert", "embed")
    text = render_engine_script(replica, rank=0, port=24001)
    assert "--runner pooling --convert embed" in " ".join(text.split())


def test_a_bert_folder_plans_one_stage_embedding_replicas(tmp_path):
    from coral_hpc.launch.spec import replica_spec
    from coral_hpc.types import ReplicaLayout, StageLayout

    path = _folder_yaml(tmp_path, "bge-small-en-v1.5", "slo: {latency_ms: 50}",
                        "mix: {input_tokens: 256}")
    result = CliRunner().invoke(cli, ["plan", str(path), "--snapshot", str(SNAPSHOT), "--json",
                                      "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    replicas = [r for r in document["replicas"] if r["model"] == "emb"]
    assert replicas and all(len(r["stages"]) == 1 for r in replicas), document["replicas"]
    deployment = derived_deployment(load_deployment(path))
    layout = ReplicaLayout(1, (StageLayout("gpu-a100", "a100-80g", 12),), "half", "both")
    replica = replica_spec(deployment, "emb", "r1", "t1", layout, api_key_file=None)
    assert replica.runner_args == ("--runner", "pooling")  # BertModel embeds natively


def test_the_sim_refuses_the_generate_runner_for_an_embedding_model(tmp_path):
    from coral_hpc.engine.args import parse_args
    from coral_hpc.engine.sim import StartupError, prepare

    folder = tmp_path / "bge"
    folder.mkdir()
    shutil.copy(CONFIGS / "bge-small-en-v1.5.json", folder / "config.json")
    base = [str(folder), "--sim-gpu-types", "a100"]
    assert prepare(parse_args(base)).pooling  # --runner auto: BertModel embeds
    with pytest.raises(StartupError, match="do not support `--runner generate`"):
        prepare(parse_args([*base, "--runner", "generate"]))
    assert not prepare(parse_args(["qwen3-8b", "--sim-gpu-types", "a100"])).pooling
    assert prepare(parse_args(["qwen3-8b", "--sim-gpu-types", "a100", "--runner", "pooling",
                               "--convert", "embed"])).pooling
    assert math.isfinite(perf_pooling.pooling_prefill_ctx(catalog.model_arch(str(folder)), 8))


def test_the_runner_flags_exist_in_every_recorded_vllm_and_survive_the_spec_file(tmp_path):
    from coral_hpc.launch.spec import ReplicaSpec, runner_args

    recorded = json.loads((REPO / "tests" / "data" / "vllm_engine_args.json").read_text())
    flags = [a for a in runner_args(True, "qwen3-8b") if a.startswith("--")]
    assert flags == ["--runner", "--convert"]
    for version, entry in recorded["versions"].items():
        assert set(flags) <= set(entry["flags"]), version
    assert runner_args(False, "qwen3-8b") == ()
    from tests.unit.launch_cases import case_spec

    spec = case_spec("single", "venv", runner_args=("--runner", "pooling"))
    assert ReplicaSpec.from_json(spec.to_json()) == spec


def test_a_config_may_not_set_the_runner_itself():
    text = _edit(BASE, "slo: {latency_ms: 200}",
                 "slo: {latency_ms: 200}\n    vllm_args: ['--runner', 'generate']")
    with pytest.raises(ConfigError) as info:
        parse_deployment(text, "bad.yaml")
    assert any("models[0].vllm_args[0]" in p and "task" in p for p in info.value.problems)


def test_simulate_refuses_an_embedding_model_naming_it(tmp_path):
    path = _folder_yaml(tmp_path, "bge-small-en-v1.5", "slo: {latency_ms: 50}",
                        "mix: {input_tokens: 256}")
    result = CliRunner().invoke(cli, ["simulate", str(path), "--trace", str(tmp_path / "t.csv"),
                                      "--snapshot", str(SNAPSHOT)])
    assert result.exit_code == 2, result.output
    assert "models[0].slo: model 'emb' is an embedding model" in result.output
