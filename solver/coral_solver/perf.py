"""Performance model: what one pipeline stage of a vLLM replica sustains under an SLO.

The model is the standard roofline with calibrated efficiencies (docs/catalog-sources.md):
prefill is compute-bound, decode reads the weights and the KV cache,
KV capacity bounds the batch, tensor parallelism adds two all-reduces per layer priced by the
node's interconnect, and pipeline stages on different nodes add a hand-off per step. Efficiency
factors come from ``profiles/calibration.yaml`` (fitted by ``bench/calibrate.py``); measured
profiles in ``profiles/measured/`` override the model (see :mod:`coral_solver.perf_profiles`).

Units: seconds, tokens, requests per second of the model's mix (ARCHITECTURE "Units").
Everything public is memoised: Stage 1 calls :func:`stage_throughput` 10^4-10^5 times.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from coral_solver import catalog, perf_fit
from coral_solver.catalog import GpuSpec, ModelArch
from coral_solver.perf_model import (
    StageCoeffs,
    build_coeffs,
    kv_bytes_per_token_per_gpu,
    stage_weight_bytes_per_gpu,
    step_time,
    with_correction,
)
from coral_solver.perf_profiles import Calibration, MeasuredProfile, load_calibration, load_measured

# ``X as X``: re-exported where they lived before (perf_roles, perf_pooling and tests read them)
from coral_solver.perf_queue import _Z as _Z
from coral_solver.perf_queue import (
    MIN_RATE,
    _concurrent_slots,
    _Feasibility,
    _largest_feasible_batch,
    _StageSteps,
)
from coral_solver.perf_queue import MISS_PER_OBJECTIVE as MISS_PER_OBJECTIVE
from coral_solver.perf_queue import _erlang_c_wait_tail as _erlang_c_wait_tail
from coral_solver.perf_queue import _tail_step as _tail_step
from coral_solver.resources import profiles_dir

__all__ = [
    "PROMPTS_STALL_RING",
    "Mix",
    "Slo",
    "configure",
    "engine_dtype",
    "has_measured_throughput",
    "is_calibrated",
    "kv_capacity_tokens",
    "kv_tokens_at",
    "kv_space",
    "measured_dirs",
    "measured_pipeline_throughput",
    "measured_pipelines",
    "mean_stage_throughput",
    "measured_phase_throughput",
    "measured_profiles",
    "measured_roles",
    "pipeline_stage_gpus",
    "prefill_ttft_budget_s",
    "stage_kv_capacity_tokens",
    "stage_throughput",
    "step_function",
    "step_latency_s",
    "throughput_from_coeffs",
    "valid_tp_degrees",
]


@dataclass(frozen=True)
class Slo:
    """Latency objectives: time to first token and time per output token, seconds."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Mix:
    """A model's request mix: mean input and output tokens per request."""

    input_tokens: int
    output_tokens: int


# --- configuration --------------------------------------------------------------------------

_profiles: Path | None = None
_measured_dirs: tuple[Path, ...] | None = None
_kv_space: dict[str, int] = {}


#: cache_clear of memo tables outside this module whose answers rest on it (the simulated
#: capacities of :mod:`coral_solver.simcap`): :func:`configure` clears them too
_CLEAR_ON_CONFIGURE: list[Callable[[], None]] = []


def configure(profiles: Path | None = None, measured: list[Path] | tuple[Path, ...] | None = None,
              kv_space: Mapping[str, int] | None = None) -> None:
    """Point the model at another profiles folder and/or measured-profile folders.

    ``profiles`` None: the shipped profiles; ``measured`` None: ``<profiles>/measured``.
    ``kv_space``: GPU type -> bytes of KV cache the engine is told to keep per worker where
    that is a setting, not what the GPU's memory leaves (vLLM's CPU build:
    ``VLLM_CPU_KVCACHE_SPACE``); see :func:`stage_kv_capacity_tokens`.
    Clears every memoised result, so later calls see the new inputs.
    """
    global _profiles, _measured_dirs, _kv_space
    _profiles = Path(profiles).resolve() if profiles is not None else None
    _measured_dirs = tuple(Path(p).resolve() for p in measured) if measured is not None else None
    _kv_space = dict(kv_space or {})
    for clear in _CLEAR_ON_CONFIGURE:
        clear()
    for cached in (_base_coeffs, _stage_coeffs, _stage_throughput, _kv_capacity, _step_model,
                   mean_stage_throughput, load_calibration, load_measured):
        cached.cache_clear()


def _calibration() -> Calibration:
    return load_calibration(_profiles)


def kv_space() -> dict[str, int]:
    """GPU type -> configured KV bytes per engine worker (see :func:`configure`)."""
    return dict(_kv_space)


def measured_dirs() -> tuple[Path, ...]:
    """The folders measured profiles are read from now (see :func:`configure`)."""
    if _measured_dirs is not None:
        return _measured_dirs
    return ((_profiles or profiles_dir()).resolve() / "measured",)


def measured_profiles() -> dict[tuple[str, str, int], tuple[MeasuredProfile, ...]]:
    """Every measured profile in use, keyed by (arch, gpu, tp)."""
    return _measured()


def _measured() -> dict[tuple[str, str, int], tuple[MeasuredProfile, ...]]:
    return load_measured(measured_dirs(), _profiles)


def measured_roles() -> dict[tuple[str, str, int], tuple[MeasuredProfile, ...]]:
    """Every measured prefill and decode role profile in use (``roles/`` of each measured
    folder, ``coral-hpc profile --roles``), keyed by (arch, gpu, tp)."""
    return load_measured(measured_dirs(), _profiles, roles=True)


def measured_pipelines() -> dict[tuple[str, str, int], tuple[MeasuredProfile, ...]]:
    """Every measured pipeline profile in use (``pipelines/`` of each measured folder), keyed by
    (arch, gpu, tp): one GPU type on every stage (``coral-hpc profile --pp N``)."""
    return load_measured(measured_dirs(), _profiles, pipelines=True)


def measured_pipeline_throughput(arch: ModelArch, gpu: GpuSpec, tp: int,
                                 split: tuple[int, ...], slo: Slo, mix: Mix,
                                 stage_gpus: tuple[str, ...] | None = None
                                 ) -> tuple[float, str] | None:
    """(requests/s, profile file) a measured pipeline of exactly this layout (``split``: layers
    per stage, in order; ``stage_gpus``: each stage's GPU type, None: every stage on ``gpu``, the
    first stage's) served at ``mix`` within an SLO at least as strict as ``slo``; the best such
    point, or None. The whole replica's figure: the engine's real pipeline accounting, which the
    model's per-stage figure only estimates."""
    wanted = tuple(stage_gpus) if stage_gpus else (gpu.name,) * len(split)
    best: tuple[float, str] | None = None
    for profile in measured_pipelines().get((arch.name, gpu.name, tp), ()):
        if profile.layer_partition != tuple(split) or pipeline_stage_gpus(profile) != wanted:
            continue  # another split, or other GPU types on its stages
        for p in profile.throughput:
            if (p.input_tokens, p.output_tokens) != (mix.input_tokens, mix.output_tokens):
                continue
            if p.ttft_s > slo.ttft_s or p.tpot_s > slo.tpot_s:
                continue
            if best is None or p.requests_per_s > best[0]:
                best = (p.requests_per_s, profile.path)
    return best


def pipeline_stage_gpus(profile: MeasuredProfile) -> tuple[str, ...]:
    """Each stage's GPU type of a measured pipeline (a hetjob's own list, else ``gpu`` on all)."""
    return profile.stage_gpus or (profile.gpu,) * profile.pp


def stage_kv_capacity_tokens(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int) -> int:
    """KV-cache tokens one stage holding ``layers`` layers has: the engine's configured KV
    space where the deployment sets one for this GPU type (:func:`configure` ``kv_space``, bytes
    per worker over each worker's KV bytes per token of its heads and layers); else measured
    where the engine reported its KV capacity on this GPU type (``coral-hpc profile``: a
    single-process profile, or a pipeline's first stage); else the analytic
    :func:`kv_capacity_tokens` (GPU memory x utilisation - reserve - weights).

    A measured figure is the engine's KV space in bytes (e.g. vLLM's CPU build sizes it by
    ``VLLM_CPU_KVCACHE_SPACE``, not by the model) divided by the bytes per token of the layers it
    held, so a stage of ``layers`` layers holds measured tokens x measured layers / ``layers``.
    The smallest measured figure wins (the engine refuses to start when one request's
    ``max_model_len`` does not fit)."""
    if layers <= 0 or tp <= 0:
        return 0
    if gpu.name in _kv_space:
        return int(_kv_space[gpu.name] // kv_bytes_per_token_per_gpu(arch, tp, layers))
    measured = []
    for profile in _measured().get((arch.name, gpu.name, tp), ()):
        if profile.kv_capacity_tokens:
            measured.append(profile.kv_capacity_tokens * profile.layers)
    for profile in measured_pipelines().get((arch.name, gpu.name, tp), ()):
        if profile.kv_capacity_tokens and profile.layer_partition:
            measured.append(profile.kv_capacity_tokens * profile.layer_partition[0])
    if measured:
        return min(measured) // layers
    cal = _calibration()
    return kv_capacity_tokens(arch, gpu, tp, layers, cal.gpu_memory_utilization)


# --- rules ----------------------------------------------------------------------------------

def valid_tp_degrees(arch: ModelArch, max_tp: int) -> list[int]:
    """TP degrees vLLM accepts for ``arch``, up to ``max_tp``.

    vLLM shards attention heads: q_heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0,
    i.e. KV heads are replicated). Phi-4 (40 q / 10 kv heads) allows only 1, 2, 5, 10.
    """
    return [tp for tp in range(1, max_tp + 1)
            if arch.q_heads % tp == 0 and (arch.kv_heads % tp == 0 or tp % arch.kv_heads == 0)]


def engine_dtype(arch: ModelArch, gpu: GpuSpec) -> str | None:
    """vLLM ``--dtype`` for ``arch`` on ``gpu``: 'bfloat16', 'half', or None when it cannot run.

    No bf16 before compute capability 8.0 (V100, T4) -> 'half'. MXFP4 (gpt-oss) needs Marlin/Triton
    MXFP4 kernels (sm80+); FP8 checkpoints need sm89 natively or Marlin on sm80+; vLLM's fused-MoE
    kernels do not run on Volta (sm70). Below sm70 vLLM does not run at all.
    """
    derived = catalog.derived_model(arch.name)
    if derived is not None and derived.arch == arch:
        # a model read from its config.json knows its model_type and checkpoint dtype: its own
        # rules (coral_solver.hf_config.HfModel.support), each with its source
        return derived.support(gpu.compute_capability).dtype
    cc = gpu.compute_capability
    if cc < 7.0:
        return None
    if arch.quantization == "mxfp4" and cc < 8.0:
        return None
    if arch.quantization == "fp8" and cc < 8.0:
        return None
    if arch.is_moe and cc < 7.5:
        return None
    return "bfloat16" if gpu.bf16 else "half"


# --- memory ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=65536)
def _kv_capacity(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, util: float) -> int:
    cal = _calibration()
    free = util * gpu.memory_gb * 1e9 - cal.reserve_gb * 1e9
    free -= stage_weight_bytes_per_gpu(arch, tp, layers)
    if free <= 0:
        return 0
    return int(free // kv_bytes_per_token_per_gpu(arch, tp, layers))


def kv_capacity_tokens(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int,
                       gpu_memory_utilization: float = 0.9) -> int:
    """Tokens of KV cache one stage (tp GPUs holding ``layers`` layers) has room for; 0 if the
    weights do not fit. Per GPU: utilisation x memory - reserve (activations, CUDA graphs,
    runtime) - weight shard, divided by the KV bytes per token of this rank's heads and layers."""
    if layers <= 0 or tp <= 0:
        return 0
    return _kv_capacity(arch, gpu, tp, layers, gpu_memory_utilization)


def kv_tokens_at(arch: ModelArch, cap: int, context: int) -> int:
    """KV capacity ``cap`` (tokens of ``arch.kv_bytes_per_token`` bytes each, as
    :func:`kv_capacity_tokens` counts) recounted for sequences of ``context`` tokens: the same
    bytes hold more of them when some layers attend only to a sliding window (Gemma 2/3,
    gpt-oss, Mistral-7B v0.1 read from their config.json). vLLM's hybrid KV cache manager frees
    the blocks a sliding layer no longer needs (SlidingWindowManager,
    vllm/v1/core/single_type_kv_cache_manager.py), so a sequence holds per-layer bytes x (full
    layers x context + sliding layers x min(context, window))
    (:meth:`coral_solver.hf_config.HfModel.kv_bytes_at`; docs/catalog-sources.md). Every stage
    is taken to hold full and sliding layers in the model's proportion. ``cap`` unchanged for
    models without sliding layers and for catalogue entries (which keep the full figure)."""
    derived = catalog.derived_model(arch.name)
    if derived is None or derived.arch != arch or not derived.sliding_layers or context <= 0:
        return cap
    per_token = derived.kv_bytes_per_token_at(context)
    return int(cap * arch.kv_bytes_per_token / per_token) if per_token > 0 else cap


def kv_transfer_s(arch: ModelArch, layers: int, prompt_tokens: int) -> float:
    """Seconds to move the KV cache of ``prompt_tokens`` prompt tokens, ``layers`` layers of it,
    from a prefill replica's node to a decode replica's: over the inter-node link the pipeline
    hand-off is priced on (calibration ``pipeline``: alpha + bytes / bandwidth, measured)."""
    cal = _calibration()
    share = float(prompt_tokens) * arch.kv_bytes_per_token * layers / arch.layers
    return cal.pp_alpha_s + share / cal.pp_bw


def prefill_ttft_budget_s(arch: ModelArch, layers: int, slo: Slo, mix: Mix) -> float:
    """The share of TTFT a one-stage prefill replica has for its own queue and prompt: the
    model's TTFT less the KV hand-off of a mean prompt (:func:`kv_transfer_s`) and less the
    decode replica's first token (one TPOT), as :mod:`coral_solver.perf_roles` rates it.
    ``coral-hpc profile --roles`` judges a prefill replica's measured TTFT against this, so the
    measured and the modelled figure count the hand-off alike."""
    return slo.ttft_s - kv_transfer_s(arch, layers, mix.input_tokens) - slo.tpot_s


# --- step latency ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=65536)
def _base_coeffs(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int) -> StageCoeffs:
    """The analytic model's coefficients, before any measured correction."""
    cal = _calibration()
    alpha_s, bus_bw = cal.tp_comm(gpu)
    return build_coeffs(arch, gpu, tp, layers, cal.factors(gpu), alpha_s, bus_bw)


@functools.lru_cache(maxsize=65536)
def _stage_coeffs(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int) -> StageCoeffs:
    """Coefficients with the measured steps of (arch, gpu, tp) applied: their fitted step model
    or the roofline's correction, whichever describes them better
    (:mod:`coral_solver.perf_fit`)."""
    model = _step_model(arch, gpu, tp)
    if isinstance(model, perf_fit.StepFit):
        return perf_fit.stage_coeffs(model, layers, arch.hidden)
    coeffs = _base_coeffs(arch, gpu, tp, layers)
    return coeffs if model == 1.0 else with_correction(coeffs, model)


def step_latency_s(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, decode_seqs: int,
                   prefill_tokens: int, context_tokens: int, n_stages: int = 1,
                   prefill_ctx: float | None = None) -> float:
    """Seconds of one continuous-batching engine step on this stage.

    ``decode_seqs`` sequences decode one token each, reading ``context_tokens`` KV tokens in total;
    ``prefill_tokens`` prompt tokens are prefilled in the same step, each attending to
    ``prefill_ctx`` tokens on average. None: one prompt chunk from its start (half of it). A
    batch of several chunks attends per sequence (attention kernels do not mix sequences):
    pass Σ chunk·(already computed + chunk/2) ÷ Σ chunk, or k prompts of n tokens are charged
    k times their attention. Includes this stage's share of the per-step engine overhead and,
    in a pipeline of ``n_stages`` > 1, the hand-off to the next stage — exactly what
    :func:`stage_throughput` charges (k whole prompts of n_in tokens at n_in/2 each), so a sim
    engine summing its stages' steps sees the latency the planner promised.
    """
    cal = _calibration()
    c = _stage_coeffs(arch, gpu, tp, layers)
    ctx = prefill_tokens / 2.0 if prefill_ctx is None else prefill_ctx
    return step_time(c, decode_seqs, prefill_tokens, context_tokens, ctx,
                     cal.step_overhead_s, n_stages, cal.pp_alpha_s, cal.pp_bw)


def step_function(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int = 1
                  ) -> Callable[[float, float, float, float], float]:
    """:func:`step_latency_s` of one stage with its inputs looked up once: a function of
    (decode_seqs, prefill_tokens, context_tokens, prefill_ctx) giving exactly what
    :func:`step_latency_s` gives (a replica simulation takes 10^5 steps; looking the
    coefficients up each step was most of their cost)."""
    cal = _calibration()
    c = _stage_coeffs(arch, gpu, tp, layers)
    overhead, alpha, bw = cal.step_overhead_s, cal.pp_alpha_s, cal.pp_bw

    def step(decode_seqs: float, prefill_tokens: float, context_tokens: float,
             prefill_ctx: float) -> float:
        return step_time(c, decode_seqs, prefill_tokens, context_tokens, prefill_ctx, overhead,
                         n_stages, alpha, bw)

    return step


# --- measured overrides ---------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _step_model(arch: ModelArch, gpu: GpuSpec, tp: int) -> perf_fit.StepFit | float:
    """The measured steps' model of (arch, gpu, tp): a fitted step model or the roofline's
    correction (1.0 without measured steps)."""
    return perf_fit.measured_step_model(_measured().get((arch.name, gpu.name, tp), ()),
                                        lambda layers: _base_coeffs(arch, gpu, tp, layers),
                                        _calibration().step_overhead_s)


def _measured_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, slo: Slo, mix: Mix
                         ) -> tuple[int, float, bool] | None:
    """(layers, req/s, exact SLO match) of the best applicable measured point, or None.

    A point applies to the same mix when its SLO is at least as strict as the one asked for
    (what met a stricter SLO meets a looser one)."""
    best = _best_point(_measured().get((arch.name, gpu.name, tp), ()), slo, mix)
    return None if best is None else (best[0].layers, best[1], best[2])


def _best_point(profiles: Iterable[MeasuredProfile], slo: Slo, mix: Mix
                ) -> tuple[MeasuredProfile, float, bool] | None:
    """(profile, req/s, exact SLO match) of the applicable throughput point of ``profiles``
    that matches the SLO exactly before any other, then serves the most; None if none applies.
    A point applies to the same mix when its SLO is at least as strict as the one asked for."""
    best: tuple[MeasuredProfile, float, bool] | None = None
    for profile in profiles:
        for p in profile.throughput:
            if (p.input_tokens, p.output_tokens) != (mix.input_tokens, mix.output_tokens):
                continue
            if p.ttft_s > slo.ttft_s or p.tpot_s > slo.tpot_s:
                continue
            exact = math.isclose(p.ttft_s, slo.ttft_s) and math.isclose(p.tpot_s, slo.tpot_s)
            if best is None or (exact, p.requests_per_s) > (best[2], best[1]):
                best = (profile, p.requests_per_s, exact)
    return best


def measured_phase_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, slo: Slo, mix: Mix,
                              role: str) -> tuple[int, float, bool, str] | None:
    """(layers, req/s, exact SLO match, file) of the best measured ``role`` point of (arch,
    gpu, tp) that applies to ``mix`` and ``slo`` (same mix, an SLO at least as strict, as
    :func:`has_measured_throughput`), or None. ``role``: "prefill" or "decode"."""
    profiles = measured_roles().get((arch.name, gpu.name, tp), ())
    best = _best_point((p for p in profiles if p.role == role), slo, mix)
    return None if best is None else (best[0].layers, best[1], best[2], best[0].path)


def has_measured_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, slo: Slo, mix: Mix) -> bool:
    """Whether a measured single-stage point of (arch, gpu, tp) applies to ``mix`` and ``slo``
    (same mix, an SLO at least as strict): :func:`stage_throughput` of the whole model then
    returns that measurement."""
    return _measured_throughput(arch, gpu, tp, slo, mix) is not None


# --- throughput under SLO -------------------------------------------------------------------

#: Pipeline accounting of prompts: True, a prompt stalls the whole ring of S micro-batches, so
#: each stage pays S x b / n_out prompts per step of its own; False, each stage pays its own
#: micro-batch's b / n_out. True is what a pipeline does: vLLM keeps S micro-batches in flight
#: (one per stage), a request is scheduled again only after its step has left the last stage, and
#: each stage runs the micro-batches in order, so every micro-batch follows the one holding a
#: prompt through every stage (the sim engine's PipelineClock does exactly this; tested in
#: tests/unit/test_engine_layout.py: test_one_micro_batchs_prompt_stalls_every_micro_batch_...).
#: Measured on the real engine (bench/results/paper_pp.md, written by bench/paper_pp.py: vLLM
#: 0.32.0's CPU build, coral-tiny-llama and coral-tiny-qwen2, PP 2 and PP 3 with even and
#: uneven splits, each stage's engine unbound, at 438/6 and 32/64 tokens, 2026-12-01 22:45-23:10
#: UTC), with the host's measured hand-off of 2.1-5.7 ms per stage step and the steps fitted
#: by exact non-negative least squares (coral_solver.perf_fit), the ring fits better on both
#: measures: median |log(predicted / measured)| of PP / PP 1 0.129 (own micro-batch only
#: 0.478), of the prompt penalty 0.245 (0.499). What it does not capture there: the
#: penalty's direction (measured 1.02-1.20, the pipelines lose a little more at the
#: decode-heavy mix; the ring predicts 0.83-0.99), under a closed loop of at most 32 clients
#: on stages sharing the host's 2 cores. (The earlier profiles, every stage bound to core 0,
#: could not tell the two apart.)
PROMPTS_STALL_RING = True


def _model_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                      slo: Slo, mix: Mix) -> float:
    cal = _calibration()
    cap = kv_capacity_tokens(arch, gpu, tp, layers, cal.gpu_memory_utilization)
    # sliding-window layers keep at most the window: more sequences of this mix fit
    cap = kv_tokens_at(arch, cap, mix.input_tokens + mix.output_tokens)
    return throughput_from_coeffs(_stage_coeffs(arch, gpu, tp, layers), cap, n_stages, slo, mix)


def throughput_from_coeffs(c: StageCoeffs, cap: int, n_stages: int, slo: Slo, mix: Mix,
                           prompts_stall_ring: bool | None = None,
                           overhead_s: float | None = None,
                           poisson_tail: bool = True,
                           handoff_s: float | None = None,
                           max_concurrent: int | None = None) -> float:
    """Requests/s one stage with step-time coefficients ``c`` and ``cap`` KV tokens sustains
    (the search :func:`stage_throughput` runs, on any coefficients: e.g. ones fitted to a
    measured engine). ``prompts_stall_ring`` None: :data:`PROMPTS_STALL_RING`;
    ``overhead_s`` None: the calibration's per-step engine overhead. ``poisson_tail`` False:
    only the mean TPOT and TTFT tests, for a closed-loop load (a fixed number of clients, as
    ``coral-hpc profile`` measures), which has no Poisson surge and no queue for KV slots.
    ``handoff_s``: seconds per stage hand-off in place of the calibration's link (e.g. one
    measured on the engine's own host). ``max_concurrent``: at most this many sequences in
    flight over all micro-batches (a closed loop's clients, e.g. the largest level of
    ``coral-hpc profile``'s sweep, for predictions compared with its measurements)."""
    cal = _calibration()
    ring = PROMPTS_STALL_RING if prompts_stall_ring is None else prompts_stall_ring
    n_in, n_out = mix.input_tokens, mix.output_tokens
    if cap <= 0 or n_in + n_out > cap:
        return 0.0
    # Every stage stores KV for every running sequence of all n_stages micro-batches.
    slots = _concurrent_slots(cap, n_in, n_out, cal.max_num_seqs)
    if max_concurrent is not None:
        slots = min(slots, max_concurrent)
    b_max = min(slots // n_stages,
                int(cal.max_num_batched_tokens // (1.0 + n_in / n_out)))
    if b_max < 1:
        return 0.0
    over = cal.step_overhead_s if overhead_s is None else overhead_s
    alpha, bw = (cal.pp_alpha_s, cal.pp_bw) if handoff_s is None else (handoff_s, math.inf)
    # KV tokens a decode step reads per running sequence: in + out for exponential outputs
    # (a sequence seen mid-flight is length-biased: long outputs stay longer), not in + out/2
    steps = _StageSteps(c, n_in, over, n_stages, alpha, bw, ctx=float(n_in + n_out),
                        prefill_ctx=n_in / 2.0)
    feasible = _Feasibility(steps, n_out, slots,
                            ring=n_stages if ring else 1,  # micro-batches whose prompts a step pays
                            tpot_s=slo.tpot_s / n_stages, ttft_s=slo.ttft_s,
                            poisson_tail=poisson_tail, prompt_step=steps.prompt(),
                            step_empty=steps.empty())
    return _best_throughput(feasible, b_max, n_out)


def _best_throughput(feasible: _Feasibility, b_max: int, n_out: int) -> float:
    """Requests/s at the largest mean batch in (0, ``b_max``] that ``feasible`` passes; 0.0 if
    none passes or the rate is below :data:`~coral_solver.perf_queue.MIN_RATE`.

    Every test is monotone in the step costs at a given rate (a slower step lengthens the mean
    and tail steps, the KV slots' service and the prompt steps; the tail's surge depends on the
    rate, the SLO and the spare share only), so a slower step is never rated higher. The rate
    b / step(b) grows with b (a positive intercept, growth at most linear): the largest feasible
    batch serves the most."""
    b, t_b = _largest_feasible_batch(feasible, b_max, n_out)
    rate = b / (n_out * t_b) if b > 0 else 0.0
    return rate if rate >= MIN_RATE else 0.0


@functools.lru_cache(maxsize=262144)
def _stage_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                      slo: Slo, mix: Mix) -> float:
    if engine_dtype(arch, gpu) is None or tp < 1 or layers < 1 or layers > arch.layers:
        return 0.0
    if mix.input_tokens < 1 or mix.output_tokens < 1 or n_stages < 1:
        return 0.0
    model = _model_throughput(arch, gpu, tp, layers, n_stages, slo, mix)
    if n_stages == 1:
        measured = _measured_throughput(arch, gpu, tp, slo, mix)
        if measured is not None:
            m_layers, m_rps, exact = measured
            # Keep "fewer layers never slower": the measured point pins its own layer count,
            # fewer layers do at least as well, more layers at most as well.
            if layers == m_layers:
                return m_rps if exact else max(model, m_rps)
            return max(model, m_rps) if layers < m_layers else min(model, m_rps)
    return model


@functools.lru_cache(maxsize=262144)
def mean_stage_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                          slo: Slo, mix: Mix) -> float:
    """Requests/s one stage sustains when only the *mean* step must meet its TPOT share and the
    mean prompt path its TTFT share (:func:`throughput_from_coeffs` with ``poisson_tail``
    False): no tail, no KV queue. An optimistic figure: Stage 1's simulated capacity
    (``Policy.capacity``) uses it to choose each node multiset's layer split and to rank
    candidates before simulating them; 0.0 where even the means fail."""
    if engine_dtype(arch, gpu) is None or tp < 1 or layers < 1 or layers > arch.layers:
        return 0.0
    if mix.input_tokens < 1 or mix.output_tokens < 1 or n_stages < 1:
        return 0.0
    cal = _calibration()
    cap = kv_capacity_tokens(arch, gpu, tp, layers, cal.gpu_memory_utilization)
    return throughput_from_coeffs(_stage_coeffs(arch, gpu, tp, layers), cap, n_stages, slo,
                                  mix, poisson_tail=False)


def stage_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                     slo: Slo, mix: Mix) -> float:
    """Requests/s of ``mix`` that ONE pipeline stage sustains within its SLO share.

    The stage is one node's ``tp`` GPUs holding ``layers`` layers of ``arch``, one of ``n_stages``
    stages, so it gets TTFT/n_stages and TPOT/n_stages. Finds the largest decode batch B per
    micro-batch such that, with prompts processed whole in one step (as vLLM schedules them) and
    each stage paying the prompts of the whole ring (S x B / output per step; PROMPTS_STALL_RING):
    at least 1 - MISS_PER_OBJECTIVE of requests (geometric output lengths: perf_tail) meet the
    TPOT share given the arrivals in their window at the limit; the wait for one of the KV cache's concurrent slots
    (M/M/c, Erlang C, slots sized for exponential token counts) exceeds what the TTFT leaves
    after the prompt steps for at most MISS_PER_OBJECTIVE of requests. Returns
    B / (output_tokens x mean step), B a mean, so any real number (found to 0.1 %). 0.0 when the
    stage cannot run, does not fit, misses the SLO or serves under one request a minute.
    Non-increasing in ``layers`` and in every step cost; non-decreasing as the SLO loosens.
    Measured profiles override.
    """
    return _stage_throughput(arch, gpu, tp, layers, n_stages, slo, mix)


def is_calibrated(arch_name: str | ModelArch, gpu_name: str | GpuSpec) -> bool:
    """True when the prediction for (arch, gpu) rests on measurements: a measured profile exists,
    or the GPU has its own fitted factors and the model is of a family the fits cover (dense,
    16-bit). Uncalibrated pairs use datasheet specs and their GPU class's efficiency.
    Accepts names (aliases too) or the catalog objects themselves."""
    arch = arch_name if isinstance(arch_name, ModelArch) else catalog.model_arch(arch_name, _profiles)
    gpu = gpu_name if isinstance(gpu_name, GpuSpec) else catalog.gpu_spec(gpu_name, _profiles)
    if any(a == arch.name and g == gpu.name for (a, g, _tp) in _measured()):
        return True
    cal = _calibration()
    family_ok = arch.quantization in cal.calibrated_quantizations and (
        not arch.is_moe or cal.calibrated_moe)
    return gpu.name in cal.gpus and family_ok
