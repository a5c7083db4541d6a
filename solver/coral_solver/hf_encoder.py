"""Embedding (pooling) models read from their ``config.json``: which checkpoints are embedding
models, and the architecture of BERT-style encoders (BGE, E5, GTE, XLM-RoBERTa).

Whether a checkpoint is an embedding model follows vLLM's own rule for ``--runner auto``
(vllm/config/model.py, ``_SUFFIX_TO_DEFAULTS``, vLLM 0.32): the first entry of
``architectures`` is matched by suffix, in order — ``ForCausalLM``, ``ForConditionalGeneration``,
``ChatModel``, ``LMHeadModel`` generate; ``ForTextEncoding``, ``EmbeddingModel`` and finally any
other ``...Model`` (``BertModel``, ``XLMRobertaModel``, ``Qwen2Model``) pool and embed. A
decoder checkpoint served as an embedding model (Qwen3-Embedding ships ``Qwen3ForCausalLM``)
says so in models.yaml (``task: embed``), as vLLM needs ``--runner pooling`` for it.

Encoders (``model_type`` bert, roberta, xlm-roberta) have no decoder fields; their parameters
are counted as Hugging Face's ``modeling_bert.py`` builds them: word, position and token-type
embeddings with a LayerNorm; per layer Q, K, V and output projections with biases, a LayerNorm,
a two-matrix GELU MLP (not gated) with biases and a LayerNorm. The pooler dense layer of
``BertModel`` is left out: vLLM's pooling runner pools the hidden states itself (CLS or mean,
vllm/model_executor/models/bert.py) and does not load it.
"""

from __future__ import annotations

from typing import Any

from coral_solver.catalog import ModelArch

__all__ = ["ENCODER_TYPES", "architecture_pools", "encoder_arch"]

#: model_type values counted as BERT-style encoders (Hugging Face modeling_bert / modeling_roberta
#: / modeling_xlm_roberta share one layout)
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})

#: vLLM's suffix table (vllm/config/model.py ``_SUFFIX_TO_DEFAULTS``, 0.32), first match wins:
#: True = the pooling runner embeds, False = the generate runner. Classification heads
#: (ForSequenceClassification, ...) are neither served here nor matched: they generate no text
#: and embed nothing, so they stay with the generate rule's answer and vLLM decides.
_SUFFIXES: tuple[tuple[str, bool], ...] = (
    ("ForCausalLM", False), ("ForConditionalGeneration", False), ("ChatModel", False),
    ("LMHeadModel", False), ("ForTextEncoding", True), ("EmbeddingModel", True),
    ("ForSequenceClassification", False), ("ForTokenClassification", False),
    ("ClassificationModel", False), ("ForRewardModeling", False), ("RewardModel", False),
    ("Model", True),
)

# RoBERTa's position ids start after the padding index (padding_idx + 1 = 2): a config's
# max_position_embeddings of 514 serves 512 tokens (HF modeling_roberta,
# create_position_ids_from_input_ids; vLLM derives max_model_len 512 for XLM-RoBERTa models)
_ROBERTA_POSITION_OFFSET = 2


def architecture_pools(config: dict[str, Any]) -> bool:
    """Whether vLLM's ``--runner auto`` would serve this checkpoint as an embedding model (the
    first of ``architectures`` by vLLM's suffix table); False when the file names none."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return False
    for suffix, pools in _SUFFIXES:
        if archs[0].endswith(suffix):
            return pools
    return False


def _int(cfg: dict[str, Any], name: str, default: int | None = None) -> int:
    value = cfg.get(name, default)
    if value is None:
        raise ValueError(f"config.json: missing field {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"config.json: field {name!r} = {value!r} is not an integer")
    return int(value)


def encoder_arch(cfg: dict[str, Any], name: str, dtype: str) -> ModelArch:
    """The :class:`ModelArch` of a BERT-style encoder (``model_type`` in :data:`ENCODER_TYPES`).

    Raises ``ValueError`` (the caller's :class:`~coral_solver.hf_config.HfConfigError`) naming
    a missing field. ``dtype``: the checkpoint's ('bf16', 'fp16' or 'fp32'; served in 16 bit).
    """
    layers = _int(cfg, "num_hidden_layers")
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    ffn = _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
    positions = _int(cfg, "max_position_embeddings")
    types = _int(cfg, "type_vocab_size", default=2)
    if heads <= 0 or hidden % heads:
        raise ValueError(f"config.json: hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}")
    head_dim = hidden // heads
    embeddings = (vocab + positions + types) * hidden + 2 * hidden  # + embedding LayerNorm
    attention = 4 * (hidden * hidden + hidden) + 2 * hidden  # Q, K, V, O with biases; LayerNorm
    mlp = 2 * hidden * ffn + ffn + hidden + 2 * hidden  # up and down with biases; LayerNorm
    total = embeddings + layers * (attention + mlp)
    model_type = str(cfg.get("model_type") or "").lower()
    context = positions - (_ROBERTA_POSITION_OFFSET if model_type != "bert" else 0)
    return ModelArch(
        name=name, layers=layers, hidden=hidden, q_heads=heads, kv_heads=heads,
        head_dim=head_dim, ffn=ffn, experts=0, active_experts=0, params_b=total / 1e9,
        active_params_b=total / 1e9, vocab=vocab, max_context=context,
        # served in 16 bit whatever the checkpoint's dtype (vLLM casts fp32 checkpoints down)
        weight_bytes=2.0 * total,
        # vLLM keeps no KV cache for encoder-only attention; the planner still sizes memory as
        # if K and V of every token were kept (2 x layers x hidden x 2 bytes), the safe side
        kv_bytes_per_token=2 * layers * heads * head_dim * 2,
        quantization="fp16" if dtype == "fp16" else "bf16",
        # one vocabulary matrix (the input embedding); no lm_head to count
        tied_embeddings=True,
        pooling=True,
    )
