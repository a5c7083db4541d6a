"""Capacity of an embedding (pooling) replica: prompts per second within a latency per request.

An embedding request is one forward pass over its prompt — no decode, no lm_head, no output
tokens. vLLM's pooling runner schedules a prompt of a bidirectional encoder whole (no chunked
prefill: vllm/config/model.py, ``ModelConfig.is_chunked_prefill_supported``, vLLM 0.32), as many
prompts per step as ``max_num_batched_tokens`` and ``max_num_seqs`` allow (calibration
``engine``: vLLM's defaults). The step time is the performance model's own
(:func:`coral_solver.perf.step_latency_s`: the roofline with calibrated efficiencies, its
sources in :mod:`coral_solver.perf_model`) with no decoding sequence and ``b`` whole prompts.

Latency of one request at a steady load of ``b`` prompts per step of ``t(b)`` seconds: it waits
for the step in progress (at most ``t(b)``), then rides the next. The prompts that arrive during
one step are Poisson with mean ``b``; one request in 1 / (1 - MISS) sees the
``1 - MISS_PER_OBJECTIVE`` quantile of them, ``b + z·sqrt(b)`` (normal approximation, ``z`` as
:mod:`coral_solver.perf` uses it), and when they exceed one step's room the rest wait a step
more. The capacity is ``b / t(b)`` at the largest ``b`` whose such request meets the latency.
The sim engine charges the same step (:func:`pooling_prefill_ctx` for the attention).

Pooling replicas are one stage: embedding models served today (BGE/E5/GTE: 0.1-0.6 B
parameters; Qwen3-Embedding-8B: 16 GB in bf16) fit on one node's GPUs, and a latency target of
milliseconds has no room for pipeline hand-offs.
"""

from __future__ import annotations

import math

from coral_solver import catalog, perf
from coral_solver.catalog import GpuSpec, ModelArch
from coral_solver.hf_encoder import ENCODER_TYPES

__all__ = ["bidirectional", "pooling_latency_s", "pooling_prefill_ctx", "pooling_throughput"]


def bidirectional(arch: ModelArch) -> bool:
    """Whether every token of ``arch`` attends to every token of its prompt (a BERT-style
    encoder read from its config.json) rather than to the earlier ones (a decoder, e.g.
    Qwen3-Embedding, pooled with causal attention)."""
    derived = catalog.derived_model(arch.name)
    return derived is not None and derived.arch == arch and derived.model_type in ENCODER_TYPES


def pooling_prefill_ctx(arch: ModelArch, prompt_tokens: float) -> float:
    """Tokens each prompt token attends to, on average, in a prompt of ``prompt_tokens``: all of
    them under bidirectional attention (encoder self-attention, Vaswani et al. 2017 §3.2.3),
    half under causal attention (what :func:`coral_solver.perf.step_latency_s` assumes)."""
    return float(prompt_tokens) if bidirectional(arch) else prompt_tokens / 2.0


def _step_s(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, prompts: float,
            n_in: int) -> float:
    """One engine step carrying ``prompts`` whole prompts of ``n_in`` tokens."""
    return perf.step_latency_s(arch, gpu, tp, layers, 0, int(math.ceil(prompts * n_in)), 0, 1,
                               prefill_ctx=pooling_prefill_ctx(arch, n_in))


def pooling_latency_s(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, prompts: int,
                      n_in: int) -> float:
    """Seconds of the latency a request of a steady ``prompts``-per-step load sees in the
    ``1 - MISS_PER_OBJECTIVE`` tail (see the module doc); ``inf`` when one step cannot hold
    even one prompt."""
    cal = perf._calibration()
    room = min(cal.max_num_seqs, cal.max_num_batched_tokens // max(n_in, 1))
    if room < 1 or prompts < 1:
        return math.inf
    t = _step_s(arch, gpu, tp, layers, prompts, n_in)
    surge = prompts + perf._Z * math.sqrt(prompts)
    steps = math.ceil(surge / room)
    return t + steps * _step_s(arch, gpu, tp, layers, min(surge, room), n_in)


def pooling_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                       latency_s: float, input_tokens: int) -> float:
    """Requests/s of ``input_tokens``-token prompts one pooling replica stage sustains with
    ``1 - MISS_PER_OBJECTIVE`` of them answered within ``latency_s``; 0.0 when it cannot run
    (dtype, memory, a prompt longer than the KV room), is asked for more than one stage, or
    misses the latency even alone. Non-increasing in ``layers``, non-decreasing in
    ``latency_s``. Not memoised: the step times it reads are, and :func:`coral_solver.perf.
    configure` clears those."""
    if perf.engine_dtype(arch, gpu) is None or tp < 1 or not 1 <= layers <= arch.layers:
        return 0.0
    if n_stages != 1 or input_tokens < 1 or latency_s <= 0:
        return 0.0
    capacity = perf.stage_kv_capacity_tokens(arch, gpu, tp, layers)
    if capacity < input_tokens:
        return 0.0  # the weights leave no room for one prompt (vLLM would not start)
    cal = perf._calibration()
    b_max = min(cal.max_num_seqs, cal.max_num_batched_tokens // input_tokens,
                capacity // input_tokens)
    if b_max < 1:
        return 0.0

    def ok(b: int) -> bool:
        return pooling_latency_s(arch, gpu, tp, layers, b, input_tokens) <= latency_s

    if not ok(1):
        return 0.0
    # the tail latency grows with b (every step term does), so feasibility is monotone: bisect
    lo, hi = 1, b_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo / _step_s(arch, gpu, tp, layers, lo, input_tokens)
