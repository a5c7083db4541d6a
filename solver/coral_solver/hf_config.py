"""A model's architecture derived from its own Hugging Face ``config.json``.

The closed catalogue (``profiles/models.yaml``) names nine models; any other model the cluster
serves is described here from the file every Hugging Face checkpoint ships. Pure: a parsed dict
in (or a path to one), a :class:`HfModel` out, whose ``arch`` is the catalogue's
:class:`~coral_solver.catalog.ModelArch`, so the performance model reads it unchanged.

Families read field by field: Llama, Mistral/Mixtral, Qwen2/2.5, Qwen3, Qwen2/3-MoE, Gemma 2/3,
Phi-3/4, DeepSeek-V2/V3 (and their clones, e.g. Kimi-K2), gpt-oss. Any other ``model_type`` gets
a generic dense estimate from the standard fields, flagged ``generic`` so the planner can say so;
a missing field it cannot do without raises :class:`HfConfigError` naming that field.

Conventions follow the catalogue (``profiles/models.yaml``): ``params_b`` counts every weight of
the served model (embeddings and lm_head included, multi-token-prediction heads excluded: vLLM
does not load them unless speculative decoding asks for them); ``active_params_b`` is what one
token touches, with both embedding matrices counted as the catalogue does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coral_solver import hf_encoder
from coral_solver.catalog import ModelArch

__all__ = ["FAMILIES", "HfConfigError", "HfModel", "Support", "arch_from_config_json",
           "model_from_config"]

#: model_type values read with their own rules (anything else: generic dense estimate)
FAMILIES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma2", "gemma3",
    "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss",
})

# vLLM refuses float16 for these model types ("numerical instability"): vllm/config/model.py,
# _FLOAT16_NOT_SUPPORTED_MODELS. On a GPU without bf16 they cannot run at all.
# (float32 would run, at twice the weight memory; the planner does not plan fp32 replicas)
_NO_FP16 = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4", "plamo2"})

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
           "float": "fp32"}


class HfConfigError(ValueError):
    """The config cannot be read: a required field is missing or has the wrong type."""


@dataclass(frozen=True)
class Support:
    """Whether a GPU of one compute capability can serve the model, and how."""

    ok: bool
    dtype: str | None  # vLLM --dtype: 'bfloat16' | 'half'; None when it cannot run
    reason: str  # why not, or what is degraded (weight-only FP8, fp16 cast); '' when plain


@dataclass(frozen=True)
class HfModel:
    """Everything the planner derives from one config.json."""

    arch: ModelArch
    model_type: str
    generic: bool  # unknown model_type: a dense estimate from the standard fields
    dtype: str  # checkpoint's torch_dtype: 'bf16' | 'fp16' | 'fp32'
    quant_method: str | None  # quantization_config.quant_method ('fp8', 'awq', 'gptq', 'mxfp4')
    weight_bits: float  # bits per quantised weight (16 when unquantised)
    mla: bool  # DeepSeek multi-head latent attention: KV is one compressed latent per layer
    sliding_window: int | None
    sliding_layers: int  # layers that attend only to the last ``sliding_window`` tokens
    shared_experts: int
    dense_layers: int  # MoE models: leading layers with a dense FFN (DeepSeek first_k_dense)

    @property
    def kv_bytes_per_layer_token(self) -> float:
        """16-bit KV bytes one layer stores per token."""
        return self.arch.kv_bytes_per_token / self.arch.layers

    def kv_bytes_at(self, context: int) -> float:
        """KV bytes one sequence of ``context`` tokens holds: full-attention layers keep every
        token, sliding-window layers at most the window (what vLLM's hybrid KV manager keeps)."""
        full = self.arch.layers - self.sliding_layers
        window = min(context, self.sliding_window or context)
        return self.kv_bytes_per_layer_token * (full * context + self.sliding_layers * window)

    def kv_bytes_per_token_at(self, context: int) -> float:
        """Mean KV bytes per token of a ``context``-token sequence (== ``arch.kv_bytes_per_token``
        when no layer slides or the context fits in the window)."""
        return self.kv_bytes_at(context) / context if context > 0 else 0.0

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs of one token attending to ``context`` earlier tokens.

        2 per active weight (matrix-vector product; the input embedding is a lookup, no FLOPs)
        plus attention scores and weighted values, 2·ctx·d each per query head (Kaplan et al.
        2020, "Scaling Laws", Table 1: C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn; kipp.ly,
        "Transformer inference arithmetic"). Sliding layers attend to at most the window.
        """
        a = self.arch
        embeddings = a.vocab * a.hidden * (1 if a.tied_embeddings else 2)
        linear = 2.0 * (a.active_params_b * 1e9 - embeddings + a.vocab * a.hidden)  # + lm_head
        full = a.layers - self.sliding_layers
        window = min(context, self.sliding_window or context)
        attended = full * context + self.sliding_layers * window
        return linear + 4.0 * a.q_heads * a.head_dim * attended

    def support(self, compute_capability: float) -> Support:
        """Can a GPU of ``compute_capability`` serve this checkpoint under vLLM, and in which
        dtype. Each rule names its source."""
        cc = compute_capability
        # vLLM's GPU requirement: compute capability 7.0 or higher (docs, installation/gpu).
        if cc < 7.0:
            return Support(False, None, f"vLLM needs compute capability >= 7.0 (have {cc})")
        q = self.quant_method
        # Quantisation kernels per architecture: vLLM docs, features/quantization/
        # supported_hardware (Volta 7.0, Turing 7.5, Ampere 8.0/8.6, Ada 8.9, Hopper 9.0).
        if q == "awq" and cc < 7.5:
            return Support(False, None, f"AWQ kernels need compute capability >= 7.5 (have {cc})")
        if q == "mxfp4" and cc < 8.0:
            # vLLM gpt-oss recipe: Ampere runs it with Marlin MXFP4 MoE; nothing older.
            return Support(False, None, f"MXFP4 needs Marlin kernels, compute capability >= 8.0 "
                                        f"(have {cc})")
        note = ""
        if q == "fp8" and cc < 8.9:
            if self.arch.is_moe or cc < 8.0:
                # FP8 W8A8 needs Ada/Hopper; the Marlin weight-only fallback (vLLM PR #5975,
                # sm80+) had no fused-MoE kernel (vLLM issues #7322, #17579). Newer vLLM may lift
                # this for MoE; until a site's version is known, the planner stays on the safe side.
                return Support(False, None, f"FP8 needs compute capability >= 8.9 (have {cc})"
                                            + (" for an MoE model" if cc >= 8.0 else ""))
            note = "FP8 weight-only (Marlin W8A16): no FP8 compute below compute capability 8.9"
        if self.arch.is_moe and cc < 7.5:
            # vLLM's fused-MoE Triton kernels do not run on Volta (coral_solver.perf.engine_dtype)
            return Support(False, None, f"fused-MoE kernels need compute capability >= 7.5 "
                                        f"(have {cc})")
        if cc >= 8.0:
            # a family vLLM refuses in fp16 runs bf16 whatever its checkpoint's dtype (an fp32
            # Gemma 2 upload would otherwise get --dtype half and be refused)
            bf16 = self.dtype == "bf16" or self.model_type in _NO_FP16
            return Support(True, "bfloat16" if bf16 else "half", note)
        # No bf16 below 8.0: bfloat16 arithmetic arrives with compute capability 8.0 (NVIDIA CUDA
        # C++ Programming Guide, "Arithmetic Instructions" / cuda_bf16.h: __nv_bfloat16 math needs
        # sm_80); vLLM raises "Bfloat16 is only supported on GPUs with compute capability of at
        # least 8.0" and suggests --dtype half (vllm/platforms/cuda.py).
        if self.model_type in _NO_FP16:
            return Support(False, None, f"{self.model_type} is not supported in float16 by vLLM "
                                        f"(numerical instability) and bf16 needs compute "
                                        f"capability >= 8.0 (have {cc})")
        cast = "bf16 checkpoint cast to fp16" if self.dtype == "bf16" else ""
        return Support(True, "half", "; ".join(s for s in (note, cast) if s))


# --- reading fields -------------------------------------------------------------------------

def _get(cfg: dict[str, Any], *names: str, default: Any = None, required: bool = True) -> Any:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return value
    if default is not None or not required:
        return default
    raise HfConfigError(f"config.json: missing field {names[0]!r}"
                        + (f" (or {', '.join(map(repr, names[1:]))})" if len(names) > 1 else ""))


def _int(cfg: dict[str, Any], *names: str, default: int | None = None) -> int:
    value = _get(cfg, *names, default=default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise HfConfigError(f"config.json: field {names[0]!r} = {value!r} is not an integer")
    return int(value)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Multimodal wrappers (Gemma 3, ...) keep the language model's fields in ``text_config``;
    top-level fields (torch_dtype, quantization_config) apply to it too."""
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in cfg.items() if k != "text_config"}
        merged.update(text)
        merged["model_type"] = cfg.get("model_type", text.get("model_type"))
        return merged
    return cfg


def _quantization(cfg: dict[str, Any]) -> tuple[str | None, float]:
    """(quant_method, bits per quantised weight) from ``quantization_config``."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        return None, 16.0
    method = str(qc.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", 8.0
    if method == "mxfp4":
        return "mxfp4", 4.25  # 4-bit E2M1 + one 8-bit scale per 32 weights (OCP MX spec v1.0)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = int(qc.get("bits") or qc.get("w_bit") or 4)
        group = int(qc.get("group_size") or qc.get("q_group_size") or 128)
        group = group if group > 0 else 1 << 30  # -1: one group per column
        # packed ints + per group one fp16 scale and one packed zero point (AutoAWQ / AutoGPTQ
        # layouts: qweight, scales [in/group, out] fp16, qzeros [in/group, out/pack])
        return method.split("_")[0], bits + (16.0 + bits) / group
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        for group_cfg in groups.values():
            w = (group_cfg or {}).get("weights") or {}
            if w.get("type") == "float" and int(w.get("num_bits", 0)) == 8:
                return "fp8", 8.0
            if w.get("type") == "int":
                bits = int(w.get("num_bits", 8))
                return ("int8" if bits == 8 else "int4"), float(bits)
        return "compressed-tensors", 16.0
    return method or None, 16.0


def _layer_types(cfg: dict[str, Any], layers: int, model_type: str) -> tuple[int | None, int]:
    """(sliding window, number of sliding-window layers)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        # Qwen2 configs carry sliding_window but switch it off with use_sliding_window: false
        return None, 0
    window = int(window)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return window, sum(1 for t in types if t == "sliding_attention")
    if model_type == "gemma2":
        return window, (layers + 1) // 2  # layers 0, 2, 4, ... slide (HF modeling_gemma2)
    if model_type in ("gemma3", "gemma3_text"):
        # every `sliding_window_pattern`-th layer is global, the rest local (Gemma 3 report: 5:1)
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return window, layers - layers // pattern
    if model_type == "mistral" and window < int(cfg.get("max_position_embeddings", 0) or 0):
        return window, layers  # Mistral-7B v0.1: every layer slides over 4096 tokens
    # Any other family's window is not trusted to bound the KV (Phi-3 and Qwen2 configs carry
    # one their serving path may ignore): every layer keeps every token, the safe side.
    return None, 0


# --- parameter counts -----------------------------------------------------------------------

def _attention_params(cfg: dict[str, Any], model_type: str, hidden: int, q_heads: int,
                      kv_heads: int, head_dim: int) -> int:
    """Q, K, V, O weights (+ biases and norms where the family has them) of one layer."""
    params = hidden * head_dim * (2 * q_heads + 2 * kv_heads)
    if model_type in ("qwen2", "qwen2_moe"):
        params += head_dim * (q_heads + 2 * kv_heads)  # q/k/v biases (Qwen2 modeling code)
    if cfg.get("attention_bias"):
        params += head_dim * (q_heads + 2 * kv_heads) + hidden
    if model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        params += 2 * head_dim  # q_norm / k_norm over head_dim
    if model_type == "gpt_oss":
        params += q_heads  # attention sinks, one per head
    return params


def _mla_params(cfg: dict[str, Any], hidden: int, heads: int) -> tuple[int, int, int]:
    """(params of one MLA layer, qk head dim, v head dim): DeepSeek-V2 paper §2.1 (arXiv
    2405.04434), projections as in modeling_deepseek.py (q_a/q_b or q_proj, kv_a_proj_with_mqa,
    kv_b_proj, o_proj, the two low-rank norms)."""
    kv_rank = _int(cfg, "kv_lora_rank")
    rope = _int(cfg, "qk_rope_head_dim")
    nope = _int(cfg, "qk_nope_head_dim")
    v_dim = _int(cfg, "v_head_dim")
    q_rank = cfg.get("q_lora_rank")
    qk = nope + rope
    if q_rank:
        q = hidden * q_rank + q_rank + q_rank * heads * qk
    else:
        q = hidden * heads * qk
    kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
    o = heads * v_dim * hidden
    return q + kv + o, qk, v_dim


@dataclass(frozen=True)
class _Ffn:
    dense_width: int  # FFN width of dense layers
    expert_width: int  # one routed expert's width (0: dense model)
    experts: int
    active: int
    shared: int  # shared experts (each expert_width wide), or 0
    shared_width: int  # total width of the always-on shared expert(s)
    dense_layers: int  # MoE models: layers with a dense FFN instead of experts
    expert_bias: bool  # gpt-oss experts carry biases


def _ffn(cfg: dict[str, Any], model_type: str, layers: int) -> _Ffn:
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts",
                       required=False) or 0)
    if not experts:
        return _Ffn(_int(cfg, "intermediate_size", "n_inner", "ffn_dim"), 0, 0, 0, 0, 0, 0, False)
    active = _int(cfg, "num_experts_per_tok", "experts_per_token", "num_experts_per_token")
    if model_type == "mixtral" or model_type == "gpt_oss":
        width = _int(cfg, "intermediate_size")
    else:
        width = _int(cfg, "moe_intermediate_size", "intermediate_size")
    shared = int(cfg.get("n_shared_experts") or 0)
    shared_width = shared * width
    if model_type == "qwen2_moe":
        shared_width = int(cfg.get("shared_expert_intermediate_size") or 0)
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        # DeepSeek modeling code: layer i is MoE when i >= first_k_dense_replace and
        # i % moe_layer_freq == 0
        first = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        moe = [i for i in range(layers) if i >= first and i % freq == 0]
    else:
        # Qwen2/3-MoE modeling code: MoE when i is not in mlp_only_layers and
        # (i + 1) % decoder_sparse_step == 0
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        moe = [i for i in range(layers) if i not in mlp_only and (i + 1) % step == 0]
    dense_layers = layers - len(moe)
    return _Ffn(_int(cfg, "intermediate_size", default=width), width, experts, active, shared,
                shared_width, dense_layers, model_type == "gpt_oss")


@dataclass(frozen=True)
class _Attention:
    params: int  # one layer's attention weights
    head_dim: int
    kv_heads: int  # the KV heads cached per token (MLA: one latent)
    kv_per_layer: int  # KV-cache bytes per token and layer


def _attention(cfg: dict[str, Any], model_type: str, mla: bool, hidden: int, q_heads: int,
               kv_heads: int) -> _Attention:
    """One layer's attention: its weights, head size and what it caches per token."""
    if mla:
        attn, head_dim, _v_dim = _mla_params(cfg, hidden, q_heads)
        # vLLM caches the compressed latent c_KV plus the shared RoPE key, once per layer, for
        # all heads (DeepSeek-V2 paper Table 1: (d_c + d_h^R)·l elements per token)
        kv_per_layer = (_int(cfg, "kv_lora_rank") + _int(cfg, "qk_rope_head_dim")) * 2
        return _Attention(attn, head_dim, 1, kv_per_layer)  # one latent, on every TP rank
    head_dim = _int(cfg, "head_dim", default=hidden // q_heads)
    attn = _attention_params(cfg, model_type, hidden, q_heads, kv_heads, head_dim)
    kv_per_layer = 2 * kv_heads * head_dim * 2  # K and V, 16-bit (GPU-AND-MODEL-FACTS §2)
    return _Attention(attn, head_dim, kv_heads, kv_per_layer)


@dataclass(frozen=True)
class _Params:
    total: int  # every weight the engine loads
    active: int  # what one token touches
    embed: int  # the embedding matrix (and lm_head unless tied)
    routed: int  # every routed expert's weights, all MoE layers together


def _param_counts(ffn: _Ffn, model_type: str, layers: int, hidden: int, attn: int, vocab: int,
                  tied: bool) -> _Params:
    """Weights of the whole model and of one token's path, from one layer's parts."""
    dense_mlp = 3 * hidden * ffn.dense_width  # gate, up, down (SwiGLU / GeGLU in all families)
    expert = 3 * hidden * ffn.expert_width
    if ffn.expert_bias:
        expert += 2 * ffn.expert_width + hidden  # gate_up and down biases (gpt-oss)
    router = hidden * ffn.experts + (ffn.experts if ffn.expert_bias else 0)
    shared = 3 * hidden * ffn.shared_width
    if model_type == "qwen2_moe" and ffn.shared_width:
        shared += hidden  # the shared expert's sigmoid gate
    norms_per_layer = (4 if model_type.startswith("gemma") else 2) * hidden

    moe_layers = layers - ffn.dense_layers if ffn.experts else 0
    body_total = layers * (attn + norms_per_layer) + (layers - moe_layers) * dense_mlp
    body_total += moe_layers * (ffn.experts * expert + router + shared)
    body_active = layers * (attn + norms_per_layer) + (layers - moe_layers) * dense_mlp
    body_active += moe_layers * (ffn.active * expert + router + shared)
    embed = vocab * hidden * (1 if tied else 2)
    return _Params(total=body_total + embed + hidden,  # + final norm
                   active=body_active + embed + hidden, embed=embed,
                   routed=moe_layers * ffn.experts * expert)


# --- the derivation -------------------------------------------------------------------------

def model_from_config(config: dict[str, Any], name: str | None = None) -> HfModel:
    """Derive an :class:`HfModel` from a parsed ``config.json``.

    ``name``: the architecture's name (default: ``_name_or_path``, else ``model_type``).
    Raises :class:`HfConfigError` naming the first missing required field.
    """
    if not isinstance(config, dict):
        raise HfConfigError("config.json: expected a JSON object at the top level")
    cfg = _text_config(config)
    model_type = str(cfg.get("model_type") or "").lower()
    if model_type in hf_encoder.ENCODER_TYPES:  # BERT-style embedding encoders: their own count
        return _encoder_model(config, cfg, model_type, name)
    generic = model_type not in FAMILIES

    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    q_heads = _int(cfg, "num_attention_heads", "n_head")
    # HF default: num_key_value_heads None -> multi-head attention (as many KV heads as Q heads)
    kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", default=q_heads)
    vocab = _int(cfg, "vocab_size")
    max_context = _int(cfg, "max_position_embeddings", "n_positions", "max_seq_len",
                       "seq_length")
    tied = bool(cfg.get("tie_word_embeddings", model_type in ("gemma2", "gemma3",
                                                              "gemma3_text")))
    mla = "kv_lora_rank" in cfg and cfg.get("kv_lora_rank") is not None

    att = _attention(cfg, model_type, mla, hidden, q_heads, kv_heads)
    ffn = _ffn(cfg, model_type, layers)
    counts = _param_counts(ffn, model_type, layers, hidden, att.params, vocab, tied)

    quant, bits = _quantization(cfg)
    dtype = _DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower(),
                        "bf16")
    weight_bytes, label = _weight_bytes(quant, bits, counts.total, counts.embed, counts.routed,
                                        dtype)
    window, sliding = _layer_types(cfg, layers, model_type)

    arch = ModelArch(
        name=(name or str(config.get("_name_or_path") or model_type or "unknown")).lower(),
        layers=layers, hidden=hidden, q_heads=q_heads, kv_heads=att.kv_heads,
        head_dim=att.head_dim, ffn=ffn.expert_width or ffn.dense_width, experts=ffn.experts,
        active_experts=ffn.active, params_b=counts.total / 1e9,
        active_params_b=counts.active / 1e9, vocab=vocab, max_context=max_context,
        weight_bytes=weight_bytes, kv_bytes_per_token=int(att.kv_per_layer * layers),
        quantization=label, tied_embeddings=tied,
        pooling=hf_encoder.architecture_pools(config),  # e.g. Qwen2Model: vLLM embeds with it
    )
    return HfModel(arch=arch, model_type=model_type, generic=generic, dtype=dtype,
                   quant_method=quant, weight_bits=bits, mla=mla, sliding_window=window,
                   sliding_layers=sliding, shared_experts=ffn.shared,
                   dense_layers=ffn.dense_layers if ffn.experts else 0)


def _encoder_model(config: dict[str, Any], cfg: dict[str, Any], model_type: str,
                   name: str | None) -> HfModel:
    """A BERT-style encoder (:mod:`coral_solver.hf_encoder`): an embedding model, unquantised."""
    dtype = _DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").lower(),
                        "fp32")
    key = (name or str(config.get("_name_or_path") or model_type)).lower()
    try:
        arch = hf_encoder.encoder_arch(cfg, key, dtype)
    except ValueError as exc:
        raise HfConfigError(str(exc)) from None
    return HfModel(arch=arch, model_type=model_type, generic=False, dtype=dtype,
                   quant_method=None, weight_bits=16.0, mla=False, sliding_window=None,
                   sliding_layers=0, shared_experts=0, dense_layers=0)


def _weight_bytes(quant: str | None, bits: float, total: float, embed: float,
                  expert_params: float, dtype: str) -> tuple[float, str]:
    """(bytes of weights as served, the catalogue's quantization label).

    Unquantised: 2 bytes per weight (vLLM serves fp32 checkpoints in 16 bit by default).
    Quantised: the linear layers at ``bits``; embeddings and lm_head stay 16-bit (AWQ, GPTQ,
    FP8 and gpt-oss's ``modules_to_not_convert`` all leave them). MXFP4 (gpt-oss) quantises only
    the routed experts; attention and router stay bf16 (its quantization_config).
    """
    if quant is None or bits >= 16:
        return 2.0 * total, "fp16" if dtype == "fp16" else "bf16"
    if quant == "mxfp4":
        return 2.0 * (total - expert_params) + expert_params * bits / 8, "mxfp4"
    label = "fp8" if quant == "fp8" else ("int8" if bits >= 8 else "int4")
    return 2.0 * embed + (total - embed) * bits / 8, label


def arch_from_config_json(source: str | Path | dict[str, Any], name: str | None = None
                          ) -> HfModel:
    """The hook the config layer calls: a model's :class:`HfModel` from its ``config.json``
    (a path to the file or to the folder holding it, or the parsed dict)."""
    if isinstance(source, dict):
        return model_from_config(source, name)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise HfConfigError(f"{path}: file not found") from exc
    except json.JSONDecodeError as exc:
        raise HfConfigError(f"{path}: not valid JSON: {exc}") from exc
    try:
        return model_from_config(data, name)
    except HfConfigError as exc:
        raise HfConfigError(f"{path}: {exc}") from exc

