"""Performance of one phase alone: what a prefill-only or a decode-only stage sustains.

A disaggregated model runs prefill replicas (prompt in, KV cache out, one token) and decode
replicas (KV cache in, output tokens out); vLLM's KV connector moves the cache between them
(../shared/VLLM-CPU.md). Both are priced on the same step-time model as an aggregated replica
(:mod:`coral_solver.perf_model`, with the same calibration and measured corrections), so the three
roles compare like with like:

- **prefill**: one prompt per engine step (vLLM schedules whole prompts; batching several in a
  step only helps, so this is conservative). Prompt lengths are exponential with the mix's mean
  (as :func:`coral_solver.perf._concurrent_slots` takes them), so a stage is an M/M/1 queue whose
  sojourn time is exponential with rate mu − lambda. A request's TTFT share on one of S stages
  is TTFT/S, less its KV hand-off over the node's link, less one TPOT for the decode replica's
  first token (the client sees the first token from the decode side):
  P(sojourn > budget) = exp(−(mu − lambda) · budget) ≤ MISS  ⇒  lambda ≤ mu − ln(1/MISS)/budget.
  The link also caps lambda at bandwidth ÷ KV bytes per prompt of the stage's layers.
- **decode**: b sequences decode one token per step, each holding the KV of its prompt and its
  output (slots sized as for an aggregated replica, exponential token counts); no prompt steps.
  The largest b whose step stays within TPOT/S, also for the 1 − MISS quantile of the batch
  (b × (1 + z / sqrt(n)), n the arrivals within a lifetime at the TPOT limit times the
  spare share of a step, the same surge as the aggregated model), and whose arrivals
  find a free KV slot with probability ≥ 1 − MISS (Erlang C: the TTFT belongs to prefill). The
  stage's link caps the arrivals the same way as prefill's.

The KV transfer runs over the inter-node link the pipeline hand-off uses: the calibration's
``pipeline`` figures (alpha 0.028 ms, 7.77 GB/s: Vidur raw/network/a100_dgx/send_recv.csv,
devices_per_node=1, i.e. one GPU per node across InfiniBand, @ 7d47513 — 64 MiB in 8.59 ms).
A site with a faster fabric (NIXL over 400 Gb/s NDR) is faster than this; measured profiles of
the site override the calibration as for every other figure.

Measured role profiles (``coral-hpc profile --roles``, :func:`coral_solver.perf.
measured_phase_throughput`) override these figures for one stage holding the layers measured,
as a measured point overrides an aggregated stage: fewer layers do at least as well, more at
most as well. A measured prefill point already counts the KV hand-off the same way (the
profiler judges TTFT against the model's TTFT less this module's hand-off less one TPOT).

Units: requests/s of the model's mix (prompt tokens/s ÷ mean input tokens for prefill, output
tokens/s ÷ mean output tokens for decode), ARCHITECTURE "Units".
"""

from __future__ import annotations

import math

from coral_solver import perf
from coral_solver.catalog import GpuSpec, ModelArch
from coral_solver.perf_model import StageCoeffs, step_time

__all__ = ["kv_bytes_per_request", "kv_transfer_s", "mean_phase_throughput", "phase_throughput",
           "prefill_ttft_budget_s"]

#: ln(1 / MISS): sojourn times of an M/M/1 queue beyond ``budget`` occur with exp(-x · budget)
_LOG_MISS = math.log(1.0 / perf.MISS_PER_OBJECTIVE)


def kv_bytes_per_request(arch: ModelArch, mix: perf.Mix) -> float:
    """KV bytes a prefill replica hands to a decode replica per request: the whole prompt's
    K and V over all layers (16 bit, as ``ModelArch.kv_bytes_per_token``)."""
    return float(mix.input_tokens) * arch.kv_bytes_per_token


def kv_transfer_s(arch: ModelArch, layers: int, mix: perf.Mix) -> float:
    """Seconds to move one mean prompt's KV of ``layers`` layers off (or onto) one stage's node
    (:func:`coral_solver.perf.kv_transfer_s`)."""
    return perf.kv_transfer_s(arch, layers, mix.input_tokens)


def _link_cap(arch: ModelArch, layers: int, mix: perf.Mix) -> float:
    """Prompts/s one node's link moves (bytes only: transfers are pipelined on the wire)."""
    cal = perf._calibration()
    share = kv_bytes_per_request(arch, mix) * layers / arch.layers
    return cal.pp_bw / share if share > 0 else math.inf


def _prefill(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
             slo: perf.Slo, mix: perf.Mix, tail: bool = True) -> float:
    cal = perf._calibration()
    cap = perf.kv_capacity_tokens(arch, gpu, tp, layers, cal.gpu_memory_utilization)
    n_in = mix.input_tokens
    cap = perf.kv_tokens_at(arch, cap, n_in)  # sliding-window layers keep at most the window
    if cap <= 0 or n_in > cap or n_in > cal.max_num_batched_tokens:
        return 0.0
    c = perf._stage_coeffs(arch, gpu, tp, layers)
    service = step_time(c, 0, n_in, 0.0, n_in / 2.0, cal.step_overhead_s, n_stages,
                        cal.pp_alpha_s, cal.pp_bw)
    # one stage: perf.prefill_ttft_budget_s, which coral-hpc profile --roles judges against
    budget = slo.ttft_s / n_stages - kv_transfer_s(arch, layers, mix) - slo.tpot_s
    if budget <= 0:
        return 0.0
    if not tail:  # means only: the mean prompt's step fits its budget, the stage stays busy
        return _busy_prefill(c, service, n_stages, n_in, _link_cap(arch, layers, mix)) if (
            service <= budget) else 0.0
    rate = 1.0 / service - _LOG_MISS / budget
    return max(0.0, min(rate, _link_cap(arch, layers, mix)))


def _busy_prefill(c: StageCoeffs, service: float, n_stages: int, n_in: int,
                  link: float) -> float:
    """Prompts/s a stage busy with prompts finishes: one mean prompt a step, or a full step's
    token budget of them (chunked prefill batches prompts; the simulated replica does, so this
    mean figure must count it to stay above what the simulation rates), capped by the link."""
    cal = perf._calibration()
    full = cal.max_num_batched_tokens
    batched = step_time(c, 0, full, 0.0, n_in / 2.0, cal.step_overhead_s, n_stages,
                        cal.pp_alpha_s, cal.pp_bw)
    return min(max(1.0 / service, full / n_in / batched), link)


def _decode(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
            slo: perf.Slo, mix: perf.Mix) -> float:
    cal = perf._calibration()
    cap = perf.kv_capacity_tokens(arch, gpu, tp, layers, cal.gpu_memory_utilization)
    n_in, n_out = mix.input_tokens, mix.output_tokens
    cap = perf.kv_tokens_at(arch, cap, n_in + n_out)  # sliding layers keep at most the window
    if cap <= 0 or n_in + n_out > cap:
        return 0.0
    slots = perf._concurrent_slots(cap, n_in, n_out, cal.max_num_seqs)
    b_max = min(slots // n_stages, cal.max_num_batched_tokens)
    if b_max < 1:
        return 0.0
    S = n_stages
    tpot = slo.tpot_s / S
    c = perf._stage_coeffs(arch, gpu, tp, layers)
    ctx = float(n_in + n_out)  # KV read per sequence: length-biased, as in coral_solver.perf
    link = _link_cap(arch, layers, mix)

    def step(b: float) -> float:
        return step_time(c, b, 0.0, b * ctx, 0.0, cal.step_overhead_s, S, cal.pp_alpha_s,
                         cal.pp_bw)

    step_empty = step(0.0)

    def feasible(b: float) -> tuple[bool, float]:
        t = step(b)
        if t > tpot:
            return False, t
        # the arrivals within the lifetime at the TPOT limit, as the aggregated model counts
        # them (coral_solver.perf_queue._Feasibility._tail_tpot_ok): not the mean lifetime,
        # which would give a slower step a smaller surge
        surge = 1.0 + perf._Z / math.sqrt(step_empty / t * S * b * tpot / t)
        if step(b * surge) > tpot:
            return False, t
        lam = b / (n_out * t)
        if lam > link:
            return False, t
        service = n_out * S * t  # a sequence holds its slot for n_out rounds of S steps
        a = lam * service
        if a >= slots:
            return False, t
        waits = perf._erlang_c_wait_tail(slots, a, slots / service - lam, 0.0)
        return waits <= perf.MISS_PER_OBJECTIVE, t

    # feasibility is monotone in b: every term grows with the batch
    b, t_b = perf._largest_feasible_batch(feasible, b_max, n_out)
    rate = b / (n_out * t_b) if b > 0 else 0.0
    return rate if rate >= perf.MIN_RATE else 0.0


def _decode_mean(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                 slo: perf.Slo, mix: perf.Mix) -> float:
    """:func:`_decode` on means alone: as many sequences as ``max_num_seqs`` and the KV cache
    hold at their mean length (prompt + half the output, what the simulated replica holds on
    average), each reading that mean context, the step within TPOT/S; no batch surge, no wait
    for a slot; the link caps the arrivals."""
    cal = perf._calibration()
    cap = perf.kv_capacity_tokens(arch, gpu, tp, layers, cal.gpu_memory_utilization)
    n_in, n_out = mix.input_tokens, mix.output_tokens
    cap = perf.kv_tokens_at(arch, cap, n_in + n_out)
    if cap <= 0 or n_in + n_out > cap:
        return 0.0
    held = n_in + n_out / 2.0
    b_max = min(cal.max_num_seqs, int(cap // held)) // n_stages
    c = perf._stage_coeffs(arch, gpu, tp, layers)

    def step(b: float) -> float:
        return step_time(c, b, 0.0, b * held, 0.0, cal.step_overhead_s, n_stages, cal.pp_alpha_s,
                         cal.pp_bw)

    def feasible(b: float) -> tuple[bool, float]:
        t = step(b)
        return t <= slo.tpot_s / n_stages, t

    if b_max < 1:
        return 0.0
    # the mean batch is a real number, as in the aggregated search (never below the whole one)
    b, t_b = perf._largest_feasible_batch(feasible, b_max, n_out)
    return min(b / (n_out * t_b), _link_cap(arch, layers, mix)) if b > 0 else 0.0


def _stage_can_run(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                   mix: perf.Mix) -> bool:
    """Whether a role stage is worth rating at all: the engine runs the model on the GPU, the
    stage holds 1..all of its layers, and the mix and the pipeline are non-empty."""
    return (perf.engine_dtype(arch, gpu) is not None and tp >= 1
            and 1 <= layers <= arch.layers
            and mix.input_tokens >= 1 and mix.output_tokens >= 1 and n_stages >= 1)


def phase_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                     slo: perf.Slo, mix: perf.Mix, role: str) -> float:
    """Requests/s of ``mix`` one stage of a ``role`` replica sustains within its SLO share.

    ``role`` "prefill": prompts under TTFT/n_stages (KV hand-off and the decode side's first
    token included); "decode": output tokens under TPOT/n_stages with each sequence's prompt
    and output KV held; "both": :func:`coral_solver.perf.stage_throughput`. 0.0 when the stage
    cannot run, does not fit or misses the SLO; non-increasing in ``layers``.
    """
    if role == "both":
        return perf.stage_throughput(arch, gpu, tp, layers, n_stages, slo, mix)
    if role not in ("prefill", "decode"):
        raise ValueError(f"role {role!r}: expected 'both', 'prefill' or 'decode'")
    if not _stage_can_run(arch, gpu, tp, layers, n_stages, mix):
        return 0.0
    fn = _prefill if role == "prefill" else _decode
    model = float(fn(arch, gpu, tp, layers, n_stages, slo, mix))
    if n_stages == 1:
        measured = perf.measured_phase_throughput(arch, gpu, tp, slo, mix, role)
        if measured is not None:
            m_layers, m_rps, exact, _path = measured
            if layers == m_layers:
                return m_rps if exact else max(model, m_rps)
            return max(model, m_rps) if layers < m_layers else min(model, m_rps)
    return model


def mean_phase_throughput(arch: ModelArch, gpu: GpuSpec, tp: int, layers: int, n_stages: int,
                          slo: perf.Slo, mix: perf.Mix, role: str) -> float:
    """:func:`phase_throughput` on means alone, as :func:`coral_solver.perf.
    mean_stage_throughput` is to the aggregated figure: prefill, the mean prompt's step within
    its TTFT budget and the stage busy with prompts (no M/M/1 tail); decode, the mean step
    within TPOT/S with the batch the KV cache holds at mean lengths (no batch surge, no Erlang
    C wait, no slots kept for long requests). Optimistic:
    Stage 1's simulated capacity (``Policy.capacity``) chooses a ``role`` template's layer split
    and ranks its candidates by it before simulating them; no measured override."""
    if role not in ("prefill", "decode"):
        raise ValueError(f"role {role!r}: expected 'prefill' or 'decode'")
    if not _stage_can_run(arch, gpu, tp, layers, n_stages, mix):
        return 0.0
    if role == "prefill":
        return float(_prefill(arch, gpu, tp, layers, n_stages, slo, mix, tail=False))
    return float(_decode_mean(arch, gpu, tp, layers, n_stages, slo, mix))


def prefill_ttft_budget_s(arch: ModelArch, layers: int, slo: perf.Slo, mix: perf.Mix) -> float:
    """:func:`coral_solver.perf.prefill_ttft_budget_s`: the TTFT share a one-stage prefill
    replica is rated (and ``coral-hpc profile --roles`` judged) against."""
    return perf.prefill_ttft_budget_s(arch, layers, slo, mix)
