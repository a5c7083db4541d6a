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


def print_model_facts(facts: list[dict[str, Any]], wide: bool = False) -> None:
    """A table of what was derived per model, then one line per excluded GPU type."""
    rows = [
        (
            fact["name"],
            _estimate(fact),
            fact["layers"],
            f"{fact['weight_gb']:.1f}",
            f"{fact['kv_bytes_per_token']:,}",
            f"{fact['dtype']}" + (f" {fact['quantization']}"
                                  if fact["quantization"] not in ("bf16", "fp16") else ""),
            ", ".join(f"{gpu} {dtype.split(' ')[0]}" for gpu, dtype in fact["gpu_dtypes"].items())
            or "none",
        )
        for fact in facts
    ]
    print_table([Column("model", "id"), Column("model type"), Column("layers", "num"),
                 Column("weights GB", "num"), Column("KV B/token", "num"), Column("dtype"),
                 Column("GPU types (vLLM --dtype)")], rows,
                title="Models (as derived from each model's config.json or the catalogue)",
                wide=wide)
    for fact in facts:
        console.print(f"{fact['name']}: from {fact['derived_from']}", highlight=False)
        if fact["estimate"] == "generic":
            console.print(f"{fact['name']}: model_type {fact['model_type'] or '(none)'!s} has no "
                          "family rules: weights and FLOPs are a generic dense estimate from "
                          "its config.json's standard fields", highlight=False)
        for gpu, dtype in fact["gpu_dtypes"].items():
            if "(" in dtype:  # runs, degraded: say how
                console.print(f"{fact['name']}: {gpu}: {dtype}", highlight=False)
        for gpu, why in fact["excluded_gpus"].items():
            console.print(f"{fact['name']}: {gpu} excluded: {why}", highlight=False)
