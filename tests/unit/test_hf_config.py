"""A model's architecture derived from its own config.json, against figures known independently:
parameter counts the model cards publish, KV bytes per token computed by hand, and the
catalogue's own entries (profiles/models.yaml) where a catalogue model's config is here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coral_solver import catalog
from coral_solver.catalog import model_arch
from coral_solver.hf_config import HfConfigError, arch_from_config_json, model_from_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"


def derive(stem: str):
    return arch_from_config_json(CONFIGS / f"{stem}.json")


def raw(stem: str) -> dict:
    return json.loads((CONFIGS / f"{stem}.json").read_text())


# --- parameter counts the model cards publish ----------------------------------------------

@pytest.mark.parametrize("stem, total_b, active_b, rel", [
    ("llama-3.1-8b", 8.03, 8.03, 0.005),  # Llama 3.1 model card: 8.03B
    ("qwen2.5-7b", 7.61, 7.61, 0.005),  # Qwen2.5-7B card: 7.61B
    ("qwen3-8b", 8.19, 8.19, 0.005),  # Qwen3-8B card: 8.2B (6.95B non-embedding)
    ("qwen3-32b", 32.8, 32.8, 0.005),  # Qwen3-32B card: 32.8B
    ("qwen3-30b-a3b", 30.5, 3.3, 0.02),  # Qwen3-30B-A3B card: 30.5B total, 3.3B activated
    ("phi-4", 14.7, 14.7, 0.005),  # Phi-4 card: 14B; technical report: 14.7B
    ("mixtral-8x7b", 46.7, 12.9, 0.005),  # Mixtral paper: 47B total, 13B active per token
    ("gemma-2-2b-it", 2.614, 2.614, 0.002),  # Gemma 2 report: 2.6B (2,614,341,888 on the Hub)
    ("gpt-oss-20b", 20.91, 3.61 + 0.58, 0.005),  # gpt-oss card: 20.91B / 3.61B active + embedding
    # DeepSeek-V3 README_WEIGHTS: 671B main model, 36.6B active (+ the 0.93B input embedding)
    ("deepseek-v3", 671, 36.6 + 0.93, 0.005),
    # Kimi-K2 card: 1T total, 32B activated; its checkpoint holds 1,026,470,731,056 numbers, of
    # which ~63M are FP8 block scales (one per 128 x 128 weights)
    ("kimi-k2-instruct", 1026.4, 32.9, 0.01),
    ("mistral-7b-v0.1", 7.2417, 7.2417, 0.001),  # 7,241,732,096 parameters on the Hub
    ("phi-3-mini-4k-instruct", 3.821, 3.821, 0.002),  # Phi-3 report: 3.8B (3,821,079,552)
    # DeepSeek-V2-Lite card: 15.7B total, 2.4B activated (+ the 0.21B input embedding)
    ("deepseek-v2-lite", 15.7, 2.4 + 102400 * 2048 / 1e9, 0.005),
    ("qwen2.5-7b-instruct-awq", 7.61, 7.61, 0.005),  # the parameters of Qwen2.5-7B, AWQ-packed
])
def test_parameter_counts_match_the_model_cards(stem, total_b, active_b, rel):
    arch = derive(stem).arch
    assert arch.params_b == pytest.approx(total_b, rel=rel)
    assert arch.active_params_b == pytest.approx(active_b, rel=max(rel, 0.02))


def test_active_parameters_count_the_input_embedding_as_the_catalogue_does():
    # The catalogue's active_params_b includes embed_tokens and lm_head (ModelArch
    # .active_params_per_layer subtracts both); OpenAI's and DeepSeek's published "active"
    # figures leave out the input embedding. gpt-oss-20b: 201088 x 2880 = 0.579B.
    oss = derive("gpt-oss-20b").arch
    assert oss.active_params_b - 3.61 == pytest.approx(201088 * 2880 / 1e9, abs=0.01)
    # per layer: attention (2880 x 64 x (2x64 + 2x8) + biases + sinks) + 4 experts with biases +
    # router = 26.6M + 99.5M + 0.09M
    assert oss.active_params_per_layer == pytest.approx(126.2e6, rel=0.005)


# --- KV bytes per token, by hand -----------------------------------------------------------

def test_gqa_kv_bytes_per_token():
    assert derive("llama-3.1-8b").arch.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert derive("qwen2.5-7b").arch.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2  # 56 KiB
    assert derive("qwen3-30b-a3b").arch.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2  # 96 KiB
    assert derive("phi-4").arch.kv_bytes_per_token == 2 * 40 * 10 * 128 * 2  # 200 KiB


def test_mla_caches_one_latent_per_layer():
    v3 = derive("deepseek-v3")
    assert v3.mla
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes, for all 128 heads at once
    assert v3.arch.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70272
    # as plain MHA it would be 2 x 61 x 128 heads x (128 + 64) x 2 = 5.9 MB: 85x more
    assert v3.arch.kv_heads == 1  # one latent, held whole by every TP rank
    assert v3.arch.head_dim == 128 + 64
    assert (v3.shared_experts, v3.dense_layers, v3.arch.experts, v3.arch.active_experts) == (
        1, 3, 256, 8)


def test_sliding_window_layers_hold_at_most_the_window():
    oss = derive("gpt-oss-20b")
    per_layer = 2 * 8 * 64 * 2  # K, V x 8 KV heads x head_dim 64 x 2 bytes = 2 KiB
    assert oss.arch.kv_bytes_per_token == 24 * per_layer  # the conservative catalogue figure
    assert (oss.sliding_window, oss.sliding_layers) == (128, 12)
    assert oss.kv_bytes_at(100) == 24 * per_layer * 100  # inside the window every layer grows
    assert oss.kv_bytes_at(32768) == per_layer * (12 * 32768 + 12 * 128)
    assert oss.kv_bytes_per_token_at(32768) == pytest.approx(12 * per_layer, rel=0.005)

    gemma2 = derive("gemma-2-2b-it")  # even layers slide (window 4096), odd layers are global
    assert (gemma2.sliding_window, gemma2.sliding_layers) == (4096, 13)
    assert gemma2.arch.max_context == 8192
    gemma3 = derive("gemma-3-4b-it")  # text_config; every 6th layer global: 29 local, 5 global
    # Gemma 3 report, Table 1 (4B): 3,209M non-embedding parameters (+ 417M vision encoder,
    # which the language model's count leaves out); embeddings tied
    assert gemma3.arch.tied_embeddings
    assert gemma3.arch.params_b - 262208 * 2560 / 1e9 == pytest.approx(3.209, rel=0.002)
    assert (gemma3.sliding_window, gemma3.sliding_layers) == (1024, 29)
    assert gemma3.kv_bytes_at(131072) == 2 * 4 * 256 * 2 * (5 * 131072 + 29 * 1024)


def test_qwen2_sliding_window_switched_off_is_no_window():
    assert raw("qwen2.5-7b")["sliding_window"] == 131072
    assert derive("qwen2.5-7b").sliding_layers == 0


# --- the catalogue's own models ------------------------------------------------------------

@pytest.mark.parametrize("stem, entry", [
    ("llama-3.1-8b", "llama-3.1-8b"), ("qwen3-8b", "qwen3-8b"), ("qwen3-32b", "qwen3-32b"),
    ("phi-4", "phi-4"), ("gpt-oss-20b", "gpt-oss-20b"), ("mixtral-8x7b", "mixtral-8x7b"),
])
def test_derived_arch_matches_the_catalogue(stem, entry):
    derived, listed = derive(stem).arch, model_arch(entry)
    for field in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "ffn", "experts",
                  "active_experts", "vocab", "max_context", "kv_bytes_per_token",
                  "quantization", "tied_embeddings"):
        assert getattr(derived, field) == getattr(listed, field), field
    assert derived.params_b == pytest.approx(listed.params_b, rel=0.005)
    assert derived.weight_bytes == pytest.approx(listed.weight_bytes, rel=0.01)
    if entry != "gpt-oss-20b":  # the catalogue's 3.6 leaves out the input embedding (above)
        assert derived.active_params_b == pytest.approx(listed.active_params_b, rel=0.005)


@pytest.mark.parametrize("stem, changes, entry", [
    # openai/gpt-oss-120b: gpt-oss-20b's config with 36 layers and 128 experts (model card)
    ("gpt-oss-20b", {"num_hidden_layers": 36, "num_local_experts": 128,
                     "layer_types": ["sliding_attention", "full_attention"] * 18}, "gpt-oss-120b"),
    # Qwen/Qwen3-235B-A22B: Qwen3-30B-A3B's config at 94 layers, hidden 4096, 64 q / 4 kv heads,
    # expert width 1536 (GPU-AND-MODEL-FACTS §2, from THUDM/slime's qwen3-235B-A22B.sh)
    ("qwen3-30b-a3b", {"num_hidden_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
                       "num_key_value_heads": 4, "moe_intermediate_size": 1536},
     "qwen3-235b-a22b"),
    # meta-llama/Llama-3.1-70B: Llama-3.1-8B's config at 80 layers, hidden 8192, 64 q heads,
    # FFN 28672 (GPU-AND-MODEL-FACTS §2)
    ("llama-3.1-8b", {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                      "intermediate_size": 28672}, "llama-3.1-70b"),
])
def test_larger_siblings_match_the_catalogue(stem, changes, entry):
    derived, listed = model_from_config(dict(raw(stem), **changes)).arch, model_arch(entry)
    for field in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "ffn", "experts",
                  "active_experts", "vocab", "max_context", "kv_bytes_per_token"):
        assert getattr(derived, field) == getattr(listed, field), field
    assert derived.params_b == pytest.approx(listed.params_b, rel=0.005)
    assert derived.weight_bytes == pytest.approx(listed.weight_bytes, rel=0.005)
    # the catalogue's gpt-oss active figure is OpenAI's, without the 0.58B input embedding
    embedding = 201088 * 2880 / 1e9 if entry == "gpt-oss-120b" else 0.0
    assert derived.active_params_b - embedding == pytest.approx(listed.active_params_b, rel=0.01)


# --- weights as served, and which GPUs can serve them --------------------------------------

def test_quantised_weight_bytes():
    oss = derive("gpt-oss-20b")  # MXFP4 experts, bf16 rest: 13.7 GB (12.8 GiB checkpoint)
    assert oss.arch.quantization == "mxfp4" and oss.weight_bits == 4.25
    assert oss.arch.weight_bytes == pytest.approx(13.7e9, rel=0.01)
    v3 = derive("deepseek-v3")  # FP8 linear layers, 16-bit embeddings: ~1 byte per weight
    assert v3.arch.quantization == "fp8"
    assert v3.arch.weight_bytes == pytest.approx(671e9 + 2 * 129280 * 7168, rel=0.005)

    awq = dict(raw("llama-3.1-8b"), quantization_config={
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    m = model_from_config(awq)
    embeddings = 2 * 128256 * 4096
    per_weight = (4 + (16 + 4) / 128) / 8  # 4-bit + per 128: fp16 scale and 4-bit zero
    assert m.arch.quantization == "int4" and m.quant_method == "awq"
    assert m.arch.weight_bytes == pytest.approx(
        2 * embeddings + (8.03e9 - embeddings) * per_weight, rel=0.005)


@pytest.mark.parametrize("stem, cc, ok, dtype", [
    ("llama-3.1-8b", 7.0, True, "half"),  # V100: bf16 checkpoint served as fp16
    ("llama-3.1-8b", 8.0, True, "bfloat16"),
    ("gemma-2-2b-it", 7.5, False, None),  # no fp16 Gemma 2 in vLLM, no bf16 on a T4
    ("gemma-2-2b-it", 8.6, True, "bfloat16"),
    ("gpt-oss-20b", 7.5, False, None),  # MXFP4 needs Marlin: Ampere or newer
    ("gpt-oss-20b", 8.0, True, "bfloat16"),
    ("deepseek-v3", 8.0, False, None),  # FP8 MoE: Ada / Hopper only
    ("deepseek-v3", 9.0, True, "bfloat16"),
    ("qwen3-30b-a3b", 7.0, False, None),  # fused-MoE kernels do not run on Volta
])
def test_which_gpus_can_serve_it(stem, cc, ok, dtype):
    support = derive(stem).support(cc)
    assert (support.ok, support.dtype) == (ok, dtype)
    assert support.ok or "compute capability" in support.reason


def test_a_family_vllm_refuses_in_fp16_runs_bf16_whatever_its_checkpoint_dtype():
    fp32 = model_from_config(dict(raw("gemma-2-2b-it"), torch_dtype="float32"))
    assert fp32.dtype == "fp32" and fp32.support(8.0).dtype == "bfloat16"
    assert not fp32.support(7.5).ok
    # other families keep their checkpoint's 16-bit type
    assert model_from_config(dict(raw("llama-3.1-8b"), torch_dtype="float16")).support(
        9.0).dtype == "half"


def test_fp8_dense_on_ampere_runs_weight_only_and_awq_not_on_volta():
    fp8 = model_from_config(dict(raw("llama-3.1-8b"), quantization_config={
        "quant_method": "fp8", "activation_scheme": "dynamic"}))
    assert fp8.support(8.0).ok and "weight-only" in fp8.support(8.0).reason
    assert fp8.support(8.9).reason == ""
    assert not fp8.support(7.5).ok
    awq = model_from_config(dict(raw("llama-3.1-8b"), quantization_config={
        "quant_method": "awq", "bits": 4, "group_size": 128}))
    assert not awq.support(7.0).ok and awq.support(7.5).dtype == "half"


# --- FLOPs, unknown families, errors -------------------------------------------------------

def test_flops_per_token():
    llama = derive("llama-3.1-8b")
    embed = 128256 * 4096
    # 2 x (weights without the input embedding) + attention 4 x 32 heads x 128 x 32 layers x ctx
    assert llama.flops_per_token(0) == pytest.approx(2 * (8.03e9 - embed), rel=0.005)
    assert llama.flops_per_token(8192) - llama.flops_per_token(0) == 4 * 32 * 128 * 32 * 8192
    oss = derive("gpt-oss-20b")  # sliding layers stop growing past the 128-token window
    grow = oss.flops_per_token(10_000) - oss.flops_per_token(9_000)
    assert grow == 4 * 64 * 64 * 12 * 1_000


def test_unknown_model_type_is_a_generic_dense_estimate():
    cfg = dict(raw("llama-3.1-8b"), model_type="brand_new_lm")
    m = model_from_config(cfg, name="Lab/New-LM")
    assert m.generic and m.arch.name == "lab/new-lm"
    assert m.arch.params_b == pytest.approx(8.03, rel=0.005)
    assert not derive("llama-3.1-8b").generic


def test_missing_required_field_is_named():
    cfg = raw("qwen3-8b")
    del cfg["num_hidden_layers"]
    with pytest.raises(HfConfigError, match="num_hidden_layers"):
        model_from_config(cfg)
    cfg = raw("deepseek-v3")
    del cfg["qk_rope_head_dim"]
    with pytest.raises(HfConfigError, match="qk_rope_head_dim"):
        model_from_config(cfg)


def test_hook_reads_a_file_or_a_folder(tmp_path):
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / "qwen3-8b.json").read_text())
    assert arch_from_config_json(folder, name="Qwen/Qwen3-8B").arch.name == "qwen/qwen3-8b"
    with pytest.raises(HfConfigError, match="not found"):
        arch_from_config_json(tmp_path / "absent")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(HfConfigError, match="not valid JSON"):
        arch_from_config_json(tmp_path / "bad.json")


def test_the_catalogue_hands_out_the_hook():
    # coral_hpc may import coral_solver.catalog (the import contract); the hook is there too
    model = catalog.arch_from_config_json(raw("mixtral-8x7b"), name="mistralai/Mixtral-8x7B-v0.1")
    assert model.arch.name == "mistralai/mixtral-8x7b-v0.1" and model.arch.experts == 8


# --- families without a file here: their architecture fields written out ------------------

def test_deepseek_v2_lite_without_q_compression_and_two_shared_experts():
    # deepseek-ai/DeepSeek-V2-Lite config.json's architecture fields; card: 15.7B total,
    # 2.4B activated (without the input embedding, 102400 x 2048 = 0.21B)
    lite = model_from_config({
        "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
        "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "intermediate_size": 10944, "vocab_size": 102400, "max_position_embeddings": 163840,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"})
    assert lite.arch.params_b == pytest.approx(15.7, rel=0.005)
    assert lite.arch.active_params_b - 102400 * 2048 / 1e9 == pytest.approx(2.4, rel=0.03)
    assert (lite.shared_experts, lite.dense_layers) == (2, 1)
    assert lite.arch.kv_bytes_per_token == (512 + 64) * 27 * 2


def test_mistral_7b_slides_on_every_layer():
    # mistralai/Mistral-7B-v0.1 config.json's fields; 7,241,732,096 parameters on the Hub
    mistral = model_from_config(dict(raw("llama-3.1-8b"), model_type="mistral", vocab_size=32000,
                                     max_position_embeddings=32768, sliding_window=4096,
                                     rope_scaling=None))
    assert mistral.arch.params_b == pytest.approx(7.2417, rel=0.001)
    assert (mistral.sliding_window, mistral.sliding_layers) == (4096, 32)
    assert mistral.kv_bytes_at(32768) == 2 * 8 * 128 * 2 * 32 * 4096


def test_a_qwen3_moe_saved_by_transformers_5_counts_its_weights_exactly():
    # scripts/make-test-models' MoE, a model no catalogue entry names: its model.safetensors
    # holds 2,036,864 numbers (counted from the written file), bf16
    model = derive("coral-tiny-qwen3moe")
    arch = model.arch
    assert (model.model_type, arch.experts, arch.active_experts) == ("qwen3_moe", 4, 2)
    assert arch.params_b * 1e9 == pytest.approx(2_036_864, abs=1)
    assert arch.weight_bytes == 2 * 2_036_864
    # a token runs 2 of the 4 experts (gate, up, down: 3 x 256 x 128 each) in each of 3 layers
    assert arch.active_params_b * 1e9 == pytest.approx(2_036_864 - 3 * 2 * 3 * 256 * 128, abs=1)
    assert arch.kv_bytes_per_token == 2 * 3 * 2 * 64 * 2  # K and V, 3 layers, 2 KV heads of 64
    with pytest.raises(KeyError):
        catalog.model_arch("coral-tiny-qwen3moe")


def test_moe_layer_schedules():
    base = raw("qwen3-30b-a3b")
    every_other = model_from_config(dict(base, decoder_sparse_step=2))  # layers 1, 3, ... MoE
    assert every_other.dense_layers == 24
    some_dense = model_from_config(dict(base, mlp_only_layers=[0, 47]))
    assert some_dense.dense_layers == 2
    dense_mlp = 3 * 2048 * 6144
    assert some_dense.arch.params_b * 1e9 - derive("qwen3-30b-a3b").arch.params_b * 1e9 == (
        pytest.approx(2 * (dense_mlp - 128 * 3 * 2048 * 768 - 2048 * 128)))
