"""A model named by its weights alone (no ``architecture:``): its config.json found where vLLM
and `coral-hpc stage` put it, derived, registered with the catalogue, and used by validate and
plan as a catalogue entry is — on real config.json files of each family (tests/data/hf_configs,
sources in its README)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.config import load_deployment
from coral_hpc.config.weights import MAX_CONFIG_JSON_BYTES, staged_copy
from coral_hpc.errors import ConfigError
from coral_hpc.model_archs import derivation, derive_models, derived_deployment, ensure_arch
from coral_solver import catalog, perf
from coral_solver.hf_config import arch_from_config_json
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "data" / "hf_configs"
SNAPSHOT = REPO / "tests" / "data" / "plan" / "university-busy-snapshot.json"


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    """Each test starts with only the catalogue: what it derives is gone afterwards."""
    monkeypatch.setattr(catalog, "_DERIVED", {})
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")


def _weights(tmp_path: Path, stem: str, folder: str | None = None) -> Path:
    """A model folder holding the published config.json ``stem`` (what a site's weights
    folder holds besides the safetensors)."""
    path = tmp_path / "models" / (folder or stem)
    path.mkdir(parents=True)
    shutil.copy(CONFIGS / f"{stem}.json", path / "config.json")
    return path


def _models_yaml(tmp_path: Path, models: list[dict], hf_home: Path | None = None) -> Path:
    """examples/university.yaml (a V100 and an A100 partition) with ``models`` instead of its
    own, each with no architecture: unless given."""
    text = (REPO / "examples" / "university.yaml").read_text()
    text = text.replace("/scratch/shared/coral-hpc", str(tmp_path / "shared"))
    text = text.replace("~/.local/state/coral-hpc/lab-llm.db", str(tmp_path / "lab-llm.db"))
    text = text.replace("/scratch/shared/hf-cache", str(hf_home or tmp_path / "hf-cache"))
    text = text[:text.index("\nmodels:")] + "\nmodels:\n"
    for m in models:
        text += f"  - name: {m['name']}\n    source: {m['source']}\n"
        if m.get("embed"):  # an embedding model: prompts only, one latency per request
            text += ("    mix: {input_tokens: 256}\n    demand: {requests_per_s: 5}\n"
                     "    slo: {latency_ms: 200}\n")
        else:
            text += ("    mix: {input_tokens: 512, output_tokens: 128}\n"
                     "    demand: {requests_per_s: 0.5}\n"
                     "    slo: {ttft_s: 4.0, tpot_s: 0.1}\n")
        if "architecture" in m:
            text += f"    architecture: {m['architecture']}\n"
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


# --- every family, by folder ----------------------------------------------------------------

FAMILIES = [
    # stem, layers, KV bytes/token by hand, checkpoint dtype, quantization
    ("llama-3.1-8b", 32, 2 * 32 * 8 * 128 * 2, "bf16", "bf16"),
    ("mistral-7b-v0.1", 32, 2 * 32 * 8 * 128 * 2, "bf16", "bf16"),
    ("mixtral-8x7b", 32, 2 * 32 * 8 * 128 * 2, "bf16", "bf16"),
    ("qwen2.5-7b", 28, 2 * 28 * 4 * 128 * 2, "bf16", "bf16"),
    ("qwen2.5-7b-instruct-awq", 28, 2 * 28 * 4 * 128 * 2, "fp16", "int4"),
    ("qwen3-8b", 36, 2 * 36 * 8 * 128 * 2, "bf16", "bf16"),
    ("qwen3-30b-a3b", 48, 2 * 48 * 4 * 128 * 2, "bf16", "bf16"),
    ("gemma-2-2b-it", 26, 2 * 26 * 4 * 256 * 2, "bf16", "bf16"),
    ("gemma-3-4b-it", 34, 2 * 34 * 4 * 256 * 2, "bf16", "bf16"),
    ("phi-3-mini-4k-instruct", 32, 2 * 32 * 32 * 96 * 2, "bf16", "bf16"),
    ("phi-4", 40, 2 * 40 * 10 * 128 * 2, "bf16", "bf16"),
    ("deepseek-v2-lite", 27, (512 + 64) * 27 * 2, "bf16", "bf16"),  # MLA latent + RoPE key
    ("deepseek-v3", 61, (512 + 64) * 61 * 2, "bf16", "fp8"),
    ("gpt-oss-20b", 24, 2 * 24 * 8 * 64 * 2, "bf16", "mxfp4"),
]


@pytest.mark.parametrize("stem, layers, kv_bytes, dtype, quantization", FAMILIES)
def test_a_folder_source_is_derived_and_planned_as_a_catalogue_entry(
        tmp_path, stem, layers, kv_bytes, dtype, quantization):
    folder = _weights(tmp_path, stem)
    deployment = load_deployment(_models_yaml(tmp_path, [{"name": "m", "source": folder}]))
    assert derive_models(deployment) == []
    model = deployment.models[0]
    assert model.architecture is None and model.arch_key == str(folder)
    arch = catalog.model_arch(model.arch_key)  # what the planner and perf model look up
    assert arch == arch_from_config_json(folder / "config.json", name=str(folder).lower()).arch
    assert (arch.layers, arch.kv_bytes_per_token, arch.quantization) == (
        layers, kv_bytes, quantization)
    found = derivation(deployment, "m")
    assert found is not None and found.config_path == folder / "config.json"
    assert found.model is not None and found.model.dtype == dtype and not found.generic


def test_a_relative_folder_is_taken_beside_the_file_whatever_the_working_directory(
        tmp_path, monkeypatch):
    """A replica job runs in its own working directory: the source it is given must be the
    folder beside models.yaml, absolute; a Hugging Face id stays as written."""
    folder = _weights(tmp_path, "llama-3.1-8b")
    config = _models_yaml(tmp_path, [
        {"name": "m", "source": "./models/llama-3.1-8b"},
        {"name": "hf", "source": "meta-llama/Llama-3.1-8B-Instruct"}])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    deployment = load_deployment(config)
    assert derive_models(deployment) == []
    by_name = {m.name: m for m in deployment.models}
    assert by_name["m"].source == str(folder)
    assert by_name["hf"].source == "meta-llama/Llama-3.1-8B-Instruct"
    found = derivation(deployment, "m")
    assert found is not None and found.config_path == folder / "config.json"


def test_plan_inputs_carry_the_derived_key(tmp_path):
    from coral_hpc.plan.inputs import model_specs

    folder = _weights(tmp_path, "qwen3-8b")
    deployment = derived_deployment(load_deployment(
        _models_yaml(tmp_path, [{"name": "m", "source": folder}])))
    (spec,) = model_specs(deployment, {})
    assert catalog.model_arch(spec.arch).layers == 36


# --- where config.json is found ---------------------------------------------------------------

def _hub(hf_home: Path, repo: str, revisions: dict[str, str], main: str | None) -> None:
    """The huggingface_hub cache layout: hub/models--org--name/{refs/main,snapshots/<rev>/}."""
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    for rev, stem in revisions.items():
        (folder / "snapshots" / rev).mkdir(parents=True)
        shutil.copy(CONFIGS / f"{stem}.json", folder / "snapshots" / rev / "config.json")
    if main:
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text(main)


def test_a_hugging_face_id_is_read_from_the_sites_cache_at_refs_main(tmp_path):
    hf_home = tmp_path / "hf-cache"
    # two revisions in the cache; refs/main names the Qwen3 one, the other is newer on disk
    _hub(hf_home, "lab/chat-v2", {"aaa111": "qwen3-8b"}, "aaa111")
    _hub(hf_home, "lab/chat-v2", {"bbb222": "llama-3.1-8b"}, None)
    deployment = derived_deployment(load_deployment(_models_yaml(
        tmp_path, [{"name": "chat", "source": "lab/chat-v2"}], hf_home=hf_home)))
    assert catalog.model_arch("lab/chat-v2").layers == 36
    found = derivation(deployment, "chat")
    assert found is not None and found.config_path is not None
    assert found.config_path.parent.name == "aaa111"


def test_the_copy_stage_keeps_serves_a_login_node_without_the_weights(tmp_path):
    from coral_hpc.launch.stage import keep_config_copies

    path = _models_yaml(tmp_path, [{"name": "moe", "source": "deepseek-ai/DeepSeek-V2-Lite"}])
    deployment = load_deployment(path)
    # nothing in the cache on this host, no copy yet: refused, naming every place looked
    problems = derive_models(deployment)
    assert len(problems) == 1 and "models[0].source" in problems[0]
    assert "no config.json for 'deepseek-ai/DeepSeek-V2-Lite'" in problems[0]
    assert str(staged_copy(deployment.state_path, "deepseek-ai/DeepSeek-V2-Lite")) in problems[0]
    # the staging job's result names the snapshot it downloaded (on the shared filesystem)
    snapshot = _weights(tmp_path, "deepseek-v2-lite", "snapshot")
    kept = keep_config_copies(deployment, {"results": {
        "deepseek-ai/DeepSeek-V2-Lite": {"status": "downloaded", "path": str(snapshot)}}})
    copy = staged_copy(deployment.state_path, "deepseek-ai/DeepSeek-V2-Lite")
    assert kept == {"deepseek-ai/DeepSeek-V2-Lite": str(copy)}
    shutil.rmtree(snapshot)  # the login node can no longer read the weights
    again = load_deployment(path)
    assert derive_models(again) == []
    assert catalog.model_arch("deepseek-ai/DeepSeek-V2-Lite").experts == 64
    found = derivation(again, "moe")
    assert found is not None and found.config_path == copy


def test_an_id_the_catalogue_knows_needs_no_config_json(tmp_path):
    deployment = derived_deployment(load_deployment(_models_yaml(
        tmp_path, [{"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"}])))
    assert catalog.model_arch(deployment.models[0].arch_key).name == "llama-3.1-8b"
    found = derivation(deployment, "llama")
    assert found is not None and found.config_path is None and found.model is None


def test_architecture_stays_an_override(tmp_path):
    folder = _weights(tmp_path, "qwen3-8b")  # a config.json there, but the override wins
    deployment = derived_deployment(load_deployment(_models_yaml(
        tmp_path, [{"name": "m", "source": folder, "architecture": "llama-3.1-8b"}])))
    assert catalog.model_arch(deployment.models[0].arch_key).name == "llama-3.1-8b"
    assert derivation(deployment, "m") is None and catalog.derived_model(str(folder)) is None


def test_a_derived_model_never_shadows_a_catalogue_entrys_own_name(tmp_path):
    # a Hugging Face id without an org that happens to be a catalogue key: the entry keeps its
    # meaning for every `architecture: phi-4`
    _hub(tmp_path / "hf", "phi-4", {"r1": "qwen3-8b"}, "r1")
    deployment = derived_deployment(load_deployment(_models_yaml(
        tmp_path, [{"name": "odd", "source": "phi-4"},
                   {"name": "pinned", "source": "microsoft/phi-4", "architecture": "phi-4"}],
        hf_home=tmp_path / "hf")))
    assert catalog.model_arch(deployment.models[1].arch_key).layers == 40  # Phi-4's, not Qwen's
    # while an alias of a catalogue entry is outranked by the model's own file
    _hub(tmp_path / "hf", "meta-llama/Llama-3.1-8B-Instruct", {"r1": "qwen3-8b"}, "r1")
    derived_deployment(load_deployment(_models_yaml(
        tmp_path, [{"name": "m", "source": "meta-llama/Llama-3.1-8B-Instruct"}],
        hf_home=tmp_path / "hf")))
    assert catalog.model_arch("meta-llama/Llama-3.1-8B-Instruct").layers == 36


def test_a_missing_config_json_stops_plan_with_exit_2(tmp_path):
    path = _models_yaml(tmp_path, [{"name": "m", "source": "lab/never-staged"}])
    result = CliRunner().invoke(cli, ["plan", str(path), "--snapshot", str(SNAPSHOT)])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "models[0].source: no config.json for 'lab/never-staged'" in flat
    assert "coral-hpc stage" in flat


def test_the_sim_engine_finds_the_config_through_hf_home(tmp_path, monkeypatch):
    _hub(tmp_path / "hf", "org/tiny", {"r1": "phi-4"}, "r1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # what the job's environment sets
    with pytest.raises(KeyError):
        catalog.model_arch("org/tiny")
    ensure_arch("org/tiny")
    assert catalog.model_arch("org/tiny").layers == 40
    # HF_HUB_CACHE, where a site sets it, is the hub folder itself (huggingface_hub's order)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    _hub(tmp_path / "elsewhere-home", "org/other", {"r1": "qwen3-8b"}, "r1")
    (tmp_path / "elsewhere-home" / "hub").rename(tmp_path / "elsewhere")
    ensure_arch("org/other")
    assert catalog.model_arch("org/other").layers == 36
    ensure_arch("no/such-model")  # nothing anywhere: left for the catalogue to refuse
    with pytest.raises(KeyError, match="no/such-model"):
        catalog.model_arch("no/such-model")


# --- bad input: exit 2, naming the file and the field ----------------------------------------

def _validate(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["validate", str(path), "--snapshot", str(SNAPSHOT), *extra])


def test_a_missing_folder_is_named(tmp_path):
    result = _validate(_models_yaml(tmp_path, [{"name": "m", "source": tmp_path / "absent"}]))
    assert result.exit_code == 2, result.output
    assert "models.yaml:" in result.output and "models[0].source" in result.output
    assert str(tmp_path / "absent" / "config.json") in result.output


def test_unreadable_json_is_named_with_its_line(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}')
    result = _validate(_models_yaml(tmp_path, [{"name": "m", "source": folder}]))
    assert result.exit_code == 2, result.output
    assert f"{folder / 'config.json'}:3: not valid JSON" in result.output.replace("\n", "")


@pytest.mark.parametrize("stem, field", [
    ("qwen3-8b", "num_hidden_layers"),
    ("llama-3.1-8b", "vocab_size"),
    ("deepseek-v2-lite", "kv_lora_rank"),  # MLA: n_routed... present, latent rank gone
    ("mixtral-8x7b", "num_experts_per_tok"),
])
def test_a_missing_field_is_named_with_its_file(tmp_path, stem, field):
    folder = _weights(tmp_path, stem)
    config = json.loads((folder / "config.json").read_text())
    del config[field]
    if field == "kv_lora_rank":  # without the rank the file is no longer MLA: drop another
        config["kv_lora_rank"] = 512
        del config["qk_rope_head_dim"]
        field = "qk_rope_head_dim"
    (folder / "config.json").write_text(json.dumps(config))
    result = _validate(_models_yaml(tmp_path, [{"name": "m", "source": folder}]))
    assert result.exit_code == 2, result.output
    flat = result.output.replace("\n", "")
    assert f"{folder / 'config.json'}: missing field '{field}'" in flat


def test_not_an_object_or_too_big_or_not_a_file(tmp_path):
    array = tmp_path / "array"
    array.mkdir()
    (array / "config.json").write_text("[1, 2]")
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "config.json", "wb") as out:
        out.truncate(MAX_CONFIG_JSON_BYTES + 1)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    path = _models_yaml(tmp_path, [{"name": "a", "source": array}, {"name": "b", "source": big},
                                   {"name": "c", "source": fifo}])
    with pytest.raises(ConfigError) as caught:
        derived_deployment(load_deployment(path))
    problems = "\n".join(caught.value.problems)
    assert f"{array / 'config.json'}: expected a JSON object" in problems
    assert f"{big / 'config.json'}: {MAX_CONFIG_JSON_BYTES + 1:,} bytes" in problems
    assert f"{fifo / 'config.json'}: not a regular file" in problems


# --- what validate and plan show; which GPU types are excluded and why -----------------------

def test_validate_shows_what_it_derived_and_why_a_v100_is_excluded(tmp_path):
    gemma = _weights(tmp_path, "gemma-2-2b-it")
    awq = _weights(tmp_path, "qwen2.5-7b-instruct-awq")
    lab = _weights(tmp_path, "llama-3.1-8b", "lab-lm")
    config = json.loads((lab / "config.json").read_text())
    (lab / "config.json").write_text(json.dumps(dict(config, model_type="lab_lm")))
    path = _models_yaml(tmp_path, [{"name": "gemma", "source": gemma},
                                   {"name": "awq", "source": awq},
                                   {"name": "lab", "source": lab}])
    result = _validate(path, "--json")
    document = json.loads(result.stdout)
    facts = {f["name"]: f for f in document.get("model_facts", [])}
    assert set(facts) == {"gemma", "awq", "lab"}, result.output
    # Gemma 2: bf16 only (vLLM refuses fp16 for it), and a V100 (7.0) has no bf16
    assert facts["gemma"]["gpu_dtypes"] == {"a100-80g": "bfloat16"}
    assert "compute capability >= 8.0 (have 7.0)" in facts["gemma"]["excluded_gpus"]["v100-32g"]
    assert (facts["gemma"]["layers"], facts["gemma"]["kv_bytes_per_token"]) == (26, 106496)
    # AWQ int4, an fp16 checkpoint: AWQ kernels need 7.5, so the V100 is out too
    assert facts["awq"]["quantization"] == "int4" and facts["awq"]["dtype"] == "fp16"
    assert "AWQ kernels need compute capability >= 7.5" in facts["awq"]["excluded_gpus"]["v100-32g"]
    assert facts["awq"]["weight_gb"] == pytest.approx(5.57, abs=0.01)
    # an unknown model_type: a generic dense estimate, said so; bf16 cast to fp16 on the V100
    assert facts["lab"]["estimate"] == "generic" and facts["lab"]["model_type"] == "lab_lm"
    assert facts["lab"]["gpu_dtypes"]["v100-32g"].startswith("half (bf16 checkpoint cast")
    text = " ".join(_validate(path).output.split())
    assert "model_type lab_lm has no family rules" in text and "generic dense estimate" in text
    assert "gemma: v100-32g excluded: gemma2 is not supported in float16" in text
    assert "lab: runs on a100-80g (bfloat16), v100-32g (half: bf16 checkpoint cast" in text


def test_validate_shows_a_moes_experts_and_an_embedding_models_task(tmp_path):
    """A Qwen3-MoE folder as the Hub publishes it (``num_experts``) and as transformers 5 saves
    it (``num_local_experts``, what scripts/make-test-models writes), and an embedding model,
    all by path alone: validate shows the experts and the task it derived."""
    hub = _weights(tmp_path, "qwen3-30b-a3b")
    saved = _weights(tmp_path, "qwen3-30b-a3b", "saved-by-transformers-5")
    config = json.loads((saved / "config.json").read_text())
    config["num_local_experts"] = config.pop("num_experts")
    (saved / "config.json").write_text(json.dumps(config))
    bge = _weights(tmp_path, "bge-small-en-v1.5")
    path = _models_yaml(tmp_path, [{"name": "hub", "source": hub},
                                   {"name": "saved", "source": saved},
                                   {"name": "bge", "source": bge, "embed": True}])
    document = json.loads(_validate(path, "--json").stdout)
    facts = {f["name"]: f for f in document["model_facts"]}
    # Qwen3-30B-A3B's card: 128 experts, 8 activated; 30.5 B parameters, 3.3 B activated
    for name in ("hub", "saved"):
        assert (facts[name]["experts"], facts[name]["active_experts"]) == (128, 8), facts[name]
        assert facts[name]["task"] == "generate"
        assert facts[name]["params_b"] == pytest.approx(30.5, rel=0.02)
        assert facts[name]["active_params_b"] == pytest.approx(3.3, rel=0.05)
    assert facts["hub"]["weight_gb"] == facts["saved"]["weight_gb"]
    assert (facts["bge"]["experts"], facts["bge"]["task"]) == (0, "embed")
    text = " ".join(_validate(path).output.split())
    assert "hub: mixture of experts: 128 routed experts, 8 active per token" in text
    assert "bge: embedding model: vLLM's pooling runner, answers /v1/embeddings" in text
    assert "128 (8 active)" in text


def test_the_planner_never_places_a_model_where_its_dtype_cannot_run(tmp_path):
    gemma = _weights(tmp_path, "gemma-2-2b-it")
    deployment = derived_deployment(load_deployment(
        _models_yaml(tmp_path, [{"name": "gemma", "source": gemma}])))
    arch = catalog.model_arch(deployment.models[0].arch_key)
    assert perf.engine_dtype(arch, catalog.gpu_spec("v100-32g")) is None
    assert perf.engine_dtype(arch, catalog.gpu_spec("a100-80g")) == "bfloat16"
    # the same figures under a catalogue entry's rules would cast it to fp16 on the V100
    assert perf.engine_dtype(arch.__class__(**{**arch.__dict__, "name": "x"}),
                             catalog.gpu_spec("v100-32g")) == "half"
    result = CliRunner().invoke(cli, ["plan", str(tmp_path / "models.yaml"), "--snapshot",
                                      str(SNAPSHOT), "--json", "--cache-dir",
                                      str(tmp_path / "cache")])
    document = json.loads(result.stdout)
    assert document["replicas"], result.output  # placed: on the A100s only
    assert all(stage["gpu_type"] != "v100-32g"
               for r in document["replicas"] for stage in r["stages"]), result.output
    (fact,) = document["model_facts"]
    assert list(fact["excluded_gpus"]) == ["v100-32g"]


def test_no_allowed_gpu_that_can_run_it_is_refused_with_the_reason(tmp_path):
    gemma = _weights(tmp_path, "gemma-2-2b-it")
    path = _models_yaml(tmp_path, [{"name": "gemma", "source": gemma}])
    path.write_text(path.read_text() + "    gpu_types: [v100-32g]\n")
    result = _validate(path)
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "no allowed GPU type can run" in flat and "v100-32g: gemma2 is not supported" in flat


def test_an_edited_config_json_is_planned_afresh(tmp_path):
    from coral_solver.templates import _cache_key
    from coral_solver.types import ModelSpec, Policy

    folder = _weights(tmp_path, "qwen3-8b")
    key = str(folder)
    derived_deployment(load_deployment(_models_yaml(tmp_path, [{"name": "m", "source": key}])))
    spec = ModelSpec(name="m", arch=key, input_tokens=512, output_tokens=128, ttft_s=4,
                     tpot_s=0.1, demand_rps=1.0)

    class Tm:
        answers_by_architecture = True

    before = _cache_key(Tm(), spec, {}, Policy(), "f")  # type: ignore[arg-type]
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=40)))
    derived_deployment(load_deployment(tmp_path / "models.yaml"))
    assert _cache_key(Tm(), spec, {}, Policy(), "f") != before  # type: ignore[arg-type]


def test_a_profile_of_a_model_named_by_path_has_a_file_name():
    from coral_hpc.profile.write import profile_path

    path = profile_path(Path("/p"), "/shared/models/Lab-LM", "a100-80g", 2)
    assert path == Path("/p/shared--models--Lab-LM__a100-80g__tp2.yaml")
    assert profile_path(Path("/p"), "org/name", "h100", 1).name == "org--name__h100__tp1.yaml"
