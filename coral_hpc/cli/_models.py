"""What ``validate`` and ``plan`` say about each model's architecture: where it was read from,
the figures the performance model uses, and which GPU types can serve it (and why not)."""

from __future__ import annotations

from typing import Any

from coral_hpc.cli._output import Column, console, print_table


def _estimate(fact: dict[str, Any]) -> str:
    if fact["estimate"] == "generic":
        return f"{fact['model_type'] or '?'} (generic estimate)"
    if fact["estimate"] == "family":
        return str(fact["model_type"])
    return "catalogue"


def _runs(gpu_dtypes: dict[str, str]) -> str:
    """``a100-80g (bfloat16), v100-32g (half: bf16 checkpoint cast to fp16)``"""
    parts = []
    for gpu, dtype in gpu_dtypes.items():
        flag, _, note = dtype.partition(" (")
        parts.append(f"{gpu} ({flag}: {note.rstrip(')')})" if note else f"{gpu} ({flag})")
    return ", ".join(parts) or "no allowed GPU type"


def _params(billions: float) -> str:
    """``235 B``, ``3.2 B``, ``2.0 M`` (a tiny test model)."""
    return f"{billions:.3g} B" if billions >= 0.1 else f"{billions * 1000:.3g} M"


def _experts(fact: dict[str, Any]) -> str:
    """``8 (2 active)`` for a mixture of experts, ``—`` for a dense model or an encoder."""
    if not fact.get("experts"):
        return "—"
    return f"{fact['experts']} ({fact['active_experts']} active)"


def print_model_facts(facts: list[dict[str, Any]], wide: bool = False) -> None:
    """A table of what was derived per model; then per model where it was read from, the GPU
    types that serve it (vLLM ``--dtype``) and each excluded GPU type with the reason."""
    rows = [
        (
            fact["name"],
            _estimate(fact),
            fact["layers"],
            _experts(fact),
            f"{fact['weight_gb']:.1f}",
            f"{fact['kv_bytes_per_token']:,}",
            f"{fact['dtype']}" + (f" {fact['quantization']}"
                                  if fact["quantization"] not in ("bf16", "fp16") else ""),
        )
        for fact in facts
    ]
    print_table([Column("model", "id"), Column("model type"), Column("layers", "num"),
                 Column("experts", "num"), Column("weights GB", "num"),
                 Column("KV bytes/token", "num"), Column("dtype")], rows,
                title="Models, as read from each model's config.json (or the catalogue)",
                wide=wide)
    for fact in facts:
        name = fact["name"]
        console.print(f"{name}: from {fact['derived_from']}", highlight=False)
        if fact["estimate"] == "generic":
            console.print(f"{name}: model_type {fact['model_type'] or '(none)'!s} has no "
                          "family rules: weights and FLOPs are a generic dense estimate from "
                          "its config.json's standard fields", highlight=False)
        if fact.get("experts"):
            console.print(f"{name}: mixture of experts: {fact['experts']} routed experts, "
                          f"{fact['active_experts']} active per token: "
                          f"{_params(fact['active_params_b'])} of {_params(fact['params_b'])} "
                          "parameters computed per token, all of them held in memory",
                          highlight=False)
        if fact.get("task") == "embed":
            console.print(f"{name}: embedding model: vLLM's pooling runner, answers "
                          "/v1/embeddings (capacity in prompts/s, no decode)", highlight=False)
        if fact.get("sliding_layers"):
            console.print(f"{name}: {fact['sliding_layers']} of {fact['layers']} layers attend "
                          f"to a {fact['sliding_window']:,}-token window: "
                          f"{fact['kv_bytes_per_token_at_mix']:,} KV bytes per token at this "
                          f"mix's {fact['mix_tokens']:,} tokens", highlight=False)
        console.print(f"{name}: runs on {_runs(fact['gpu_dtypes'])}", highlight=False)
        for gpu, why in fact["excluded_gpus"].items():
            console.print(f"{name}: {gpu} excluded: {why}", highlight=False)
