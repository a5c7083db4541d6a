"""Why a model's layouts are few or none for want of KV cache: the plan's reason per model.

vLLM refuses to start an engine whose KV cache cannot hold one request of ``max_model_len``
tokens ("... KV cache is needed, which is larger than the available KV cache memory"), so Stage 1
drops every stage that cannot (:meth:`coral_solver.templates.PerfThroughput.kv_fits`: the GPU's
memory after the weights, or the engine's measured KV space such as vLLM's CPU
``VLLM_CPU_KVCACHE_SPACE``). A pipeline stage holds only its own layers' KV, so more stages fit
where one node does not. This module says, per model, what that check left: the most layers one
stage may hold, and whether any layout of at most ``policy.n_max`` stages remains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from coral_solver.types import ModelSpec, Policy

__all__ = ["kv_limit"]


def _most_layers(fits: Callable[[int], bool], layers: int) -> int:
    """The most layers (0..layers) a stage holds with room for one request: KV per token grows
    with the layers a stage holds, so what fits is a prefix (binary search)."""
    lo, hi = 0, layers
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def kv_limit(tm, model: ModelSpec, gpu_types: Mapping[str, tuple[int, float]],
             policy: Policy) -> str | None:
    """A line saying which layouts of ``model`` the KV check refuses and why; None when a
    one-stage layout fits somewhere (nothing refused for KV), when the model sets no
    ``max_model_len`` or when ``tm`` cannot tell (no ``kv_fits``).

    ``gpu_types`` as for :func:`coral_solver.templates.model_templates`."""
    kv_fits = getattr(tm, "kv_fits", None)
    if kv_fits is None or model.max_model_len is None:
        return None
    layers = tm.layers(model)
    usable = sorted(g for g in gpu_types if model.allows_gpu(g) and tm.runs_on(model, g))
    best: tuple[int, str, int] | None = None  # (most layers, GPU type, TP)
    for tp in tm.tp_degrees(model, policy.max_tp):
        for gpu in usable:
            if gpu_types[gpu][0] < tp:
                continue
            def fits(n: int, g: str = gpu, t: int = tp) -> bool:
                return n == 0 or bool(kv_fits(model, g, t, n))

            most = _most_layers(fits, layers)
            if most >= layers:
                return None  # one node holds it: no layout is refused for KV alone
            if best is None or most > best[0]:
                best = (most, gpu, tp)
    if best is None:
        return None  # no GPU type runs it at all: not a KV matter
    most, gpu, tp = best
    roles = "" if model.disaggregation == "off" else " (prefill and decode replicas alike)"
    head = (f"{model.name}: max_model_len {model.max_model_len}: every pipeline stage{roles} "
            "must hold one request's KV cache or vLLM refuses to start it")
    if most == 0:
        return (f"{head}; no stage holds even one of its {layers} layers with that much KV on "
                f"{', '.join(usable)}: nothing of it is planned; lower max_model_len or give "
                "the engine more KV space")
    stages = -(-layers // most)
    where = f"{most} of {layers} layers on {gpu} (TP {tp})"
    if stages > min(policy.n_max, layers):
        return (f"{head}; a stage holds at most {where}, so it needs {stages} stages, more "
                f"than policy.n_max {policy.n_max}: nothing of it is planned; lower "
                "max_model_len, raise policy.n_max or give the engine more KV space")
    return (f"{head}; a stage holds at most {where}, so layouts of fewer than {stages} stages "
            "are refused")
