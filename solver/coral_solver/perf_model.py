"""The analytic step-time model, pure arithmetic (no files, no caches).

Shared by :mod:`coral_solver.perf` (which feeds it the shipped calibration) and
``bench/calibrate.py``
(which feeds it trial factors while fitting), so fitted numbers mean exactly what the model uses.
Roofline with calibrated efficiencies; sources in docs/catalog-sources.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from coral_solver.catalog import GpuSpec, ModelArch
from coral_solver.perf_profiles import Factors


def stage_weight_bytes_per_gpu(arch: ModelArch, tp: int, layers: int) -> float:
    """Weight bytes one GPU of a stage holds.

    Embeddings and lm_head are spread over layers in proportion, so a stage's weights grow with
    the layers it holds (keeps every quantity monotone in ``layers``; exact for a whole model).
    """
    return arch.weight_bytes * layers / arch.layers / tp


def kv_bytes_per_token_per_gpu(arch: ModelArch, tp: int, layers: int) -> float:
    """KV bytes per token one GPU stores for its layers and heads.

    KV heads are split across TP ranks; when tp > kv_heads each rank keeps one replicated head.
    """
    head_share = max(1.0 / tp, 1.0 / arch.kv_heads)
    return arch.kv_bytes_per_token * layers / arch.layers * head_share


@dataclass(frozen=True)
class StageCoeffs:
    """Per-(arch, gpu, tp, layers) constants, so one step costs a handful of float operations."""

    flops_per_token: float  # linear layers, per GPU, per token
    lm_head_flops: float  # per decoded token (share of this stage), per GPU
    attn_flops: float  # per (query token x context token), per GPU
    flops: float  # effective FLOP/s (prefill MFU x peak)
    attn_flops_rate: float  # effective FLOP/s of attention kernels
    dense_bytes: float  # weights always read per step, per GPU
    expert_bytes: float  # routed-expert weights, per GPU (read in proportion to experts touched)
    expert_pick: float  # active_experts / experts
    weight_bw: float  # effective bytes/s for weights
    kv_bytes_per_token: float  # per GPU
    kv_bw: float  # effective bytes/s for the KV cache
    overlap: float  # 0: compute and memory time overlap (roofline max); 1: they add
    floor_s: float  # per step: layers x layer floor
    comm_alpha_s: float  # per step: 2 x layers x alpha (0 when tp == 1)
    comm_s_per_token: float  # per step per token: 2 x layers x ring factor x hidden x 2 B / bus BW
    hidden_bytes: float  # activation bytes per token handed to the next stage
    correction: float = 1.0  # measured/model ratio from measured step latencies
    #: engine overhead per step of a step model fitted to measured steps, in place of the
    #: calibration's (coral_solver.perf_fit); None: the calibration's
    overhead_s: float | None = None


def build_coeffs(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, f: Factors,
                 tp_alpha_s: float, tp_bus_bw: float) -> StageCoeffs:
    """Constants of one stage: ``tp`` GPUs of type ``gpu`` holding ``layers`` layers of ``arch``.

    ``tp_alpha_s`` / ``tp_bus_bw`` (bytes/s) price one all-reduce on this node's interconnect.
    """
    share = layers / arch.layers
    per_layer_dense = arch.weights_per_layer_bytes - arch.expert_bytes_per_layer
    lm_head_bytes = arch.embedding_bytes / (1 if arch.tied_embeddings else 2)
    if tp > 1:
        ring = 2.0 * (tp - 1) / tp
        comm_alpha = 2 * layers * tp_alpha_s  # two all-reduces per layer
        comm_per_token = 2 * layers * ring * arch.hidden * 2.0 / tp_bus_bw
    else:
        comm_alpha = comm_per_token = 0.0
    return StageCoeffs(
        flops_per_token=2.0 * arch.active_params_per_layer * layers / tp,
        lm_head_flops=2.0 * arch.hidden * arch.vocab * share / tp,
        attn_flops=4.0 * arch.q_heads * arch.head_dim * layers / tp,
        flops=gpu.fp16_tflops * 1e12 * f.prefill_mfu,
        attn_flops_rate=gpu.fp16_tflops * 1e12 * f.attn_mfu,
        dense_bytes=(per_layer_dense * layers + lm_head_bytes * share) / tp,
        expert_bytes=arch.expert_bytes_per_layer * layers / tp,
        expert_pick=arch.active_experts / arch.experts if arch.experts else 0.0,
        weight_bw=gpu.mem_bw_gbs * 1e9 * f.decode_mbu,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(arch, tp, layers),
        kv_bw=gpu.mem_bw_gbs * 1e9 * f.kv_mbu,
        overlap=f.overlap,
        floor_s=layers * f.layer_floor_us * 1e-6,
        comm_alpha_s=comm_alpha,
        comm_s_per_token=comm_per_token,
        hidden_bytes=arch.hidden * 2.0,
    )


def with_correction(c: StageCoeffs, correction: float) -> StageCoeffs:
    """The same coefficients scaled by a measured/model step-latency ratio."""
    return replace(c, correction=correction)


def compute_time(c: StageCoeffs, decode: float, prefill: float, context: float,
                 prefill_ctx: float) -> float:
    """Busy time of the stage's GPUs for one step, without per-step engine overhead (seconds).

    ``decode`` sequences decode one token each reading ``context`` KV tokens in total; ``prefill``
    prompt tokens attend to ``prefill_ctx`` earlier tokens on average.
    """
    tokens = decode + prefill
    t_flops = (c.flops_per_token * tokens + c.lm_head_flops * decode) / c.flops
    t_flops += c.attn_flops * (prefill * prefill_ctx + context) / c.attn_flops_rate
    weights = c.dense_bytes
    if c.expert_bytes:
        # expected fraction of experts at least one of `tokens` tokens routes to
        weights += c.expert_bytes * (1.0 - (1.0 - c.expert_pick) ** tokens)
    t_mem = weights / c.weight_bw + c.kv_bytes_per_token * (context + prefill) / c.kv_bw
    hi, lo = (t_flops, t_mem) if t_flops >= t_mem else (t_mem, t_flops)
    t = hi + c.overlap * lo + c.floor_s
    if c.comm_alpha_s:
        t += c.comm_alpha_s + c.comm_s_per_token * tokens
    return t


def step_time(c: StageCoeffs, decode: float, prefill: float, context: float, prefill_ctx: float,
              overhead_s: float, n_stages: int, pp_alpha_s: float, pp_bw: float) -> float:
    """One engine step of one stage: busy time + its share of the engine overhead (TPOT is split
    evenly over stages; ``c.overhead_s`` where a fitted step model has its own), scaled by any
    measured correction, + the hand-off to the next stage."""
    over = overhead_s if c.overhead_s is None else c.overhead_s
    t = (compute_time(c, decode, prefill, context, prefill_ctx) + over / n_stages)
    t *= c.correction
    if n_stages > 1:
        t += pp_alpha_s + (decode + prefill) * c.hidden_bytes / pp_bw
    return t
