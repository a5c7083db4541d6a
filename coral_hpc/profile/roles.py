"""Measure one engine in the two roles of a disaggregated model (``coral-hpc profile --roles``).

The planner rates a prefill replica and a decode replica apart (:mod:`coral_solver.perf_roles`);
these measurements are those two figures, taken on one ordinary engine (the profile job runs no
KV connector) with each role's load alone:

- **prefill**: requests of the model's prompt length with ``max_tokens: 1``, so the engine does
  a prefill replica's work (the prompt, one token) and nothing else. Steps: the TTFT of one
  prompt at a few lengths up to the mix's. Capacity: the highest Poisson rate at which 95 % of
  prompts met the prefill side's TTFT budget: the model's TTFT less the KV hand-off of one
  prompt and less one TPOT for the decode replica's first token
  (:func:`coral_solver.perf_roles.prefill_ttft_budget_s`, the very budget the analytic prefill
  rating uses). The hand-off itself is not measured here: the profiled engine ships no KV, so
  its cost is the calibration's modelled link, taken off the budget before judging.
- **decode**: requests of the mix (its prompt and output lengths) whose prompt KV is already in
  the engine, as a decode replica finds it after the hand-off: each prompt is sent once with
  ``max_tokens: 1`` before it is measured, so vLLM's prefix cache holds its KV. vLLM caches
  whole KV blocks only (the CPU build's blocks are 128 tokens, ``vllm:cache_config_info``): a
  prompt's last partial block, a whole prompt shorter than one block, or every prompt where the
  engine caches no prefixes, is computed again, and the figure is conservative by that much.
  The share of prompt tokens the cache served is measured (``vllm:prefix_cache_hits_total`` over
  ``…queries_total``) and written beside the figure (``prompt_tokens_cached``); on the CPU build
  with 64-token prompts it was 0 of 5,448 tokens (2026-12-03). Steps: the
  median TPOT over batch sizes at the mix's context. Capacity: the highest Poisson rate at which
  95 % of requests met the model's TPOT and its TTFT (a decode replica's TTFT is its wait for a
  KV slot plus a step, far inside it unless it queues).

Each role's result is written as a role profile (``roles/…__prefill.yaml``,
``roles/…__decode.yaml``) whose throughput point names the model's mix and SLO it was judged
for, so the planner applies it exactly where an aggregated point would apply.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from coral_hpc.engine import vllm_metrics
from coral_hpc.profile import openloop
from coral_hpc.profile.measure import (
    closed_loop_capacity,
    kv_capacity_tokens,
    open_loop_capacity,
    run_load,
    stream_completion,
)
from coral_hpc.profile.prompts import prompt_ids

ROLES = ("prefill", "decode")

Progress = Callable[[str], None]


@dataclass
class RoleMeasurements:
    """What one engine measured in one role."""

    role: str
    kv_capacity_tokens: int | None = None
    #: (decode_seqs, prefill_tokens, context_tokens, seconds): the role's own steps
    steps: list[tuple[int, int, int, float]] = field(default_factory=list)
    #: (input, output, ttft_s, tpot_s, requests/s): the model's mix and SLO the rate serves
    throughput: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    #: the same keys, the start of the open-loop search (closed loop, or the steps' figure)
    search_start: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    #: what the requests were judged against: ttft_s, tpot_s, and the hand-off taken off TTFT
    judged: dict[str, float] = field(default_factory=dict)
    #: decode: the share of measured prompt tokens the engine's prefix cache served (None: the
    #: engine exports no prefix-cache counters)
    prompt_tokens_cached: float | None = None
    open_loop_phases: list[dict[str, float | bool]] = field(default_factory=list)


def measure_prefill_role(url: str, model: str, *, input_tokens: int, output_tokens: int,
                         ttft_s: float, tpot_s: float, ttft_budget_s: float,
                         kv_transfer_s: float, api_key: str | None = None,
                         progress: Progress = lambda _m: None,
                         phase_s: float = openloop.PHASE_S) -> RoleMeasurements:
    """A prefill replica's figures (module doc): prompt steps, and the most prompts/s of
    ``input_tokens`` within ``ttft_budget_s``; the point is keyed by the model's mix
    (``input_tokens``, ``output_tokens``) and SLO (``ttft_s``, ``tpot_s``)."""
    result = RoleMeasurements("prefill", kv_capacity_tokens(url, api_key),
                              judged={"ttft_s": round(ttft_budget_s, 6), "tpot_s": tpot_s,
                                      "kv_transfer_s": round(kv_transfer_s, 6)})
    stream_completion(url, model, prompt_ids(8), 2, api_key)  # warm-up, not recorded
    for length in sorted({max(1, input_tokens // 4), max(1, input_tokens // 2), input_tokens}):
        timing = stream_completion(url, model, prompt_ids(length, salt=7000 + length), 1, api_key)
        result.steps.append((0, length, length, timing.ttft_s))
        progress(f"prefill role: {length}-token prompt {timing.ttft_s * 1e3:.1f} ms")
    key = (input_tokens, output_tokens, ttft_s, tpot_s)
    if ttft_budget_s <= 0:
        progress(f"prefill role: no TTFT left for the prompt ({ttft_s:g}s less the hand-off "
                 f"{kv_transfer_s:g}s and one TPOT {tpot_s:g}s)")
        result.throughput.append((*key, 0.0))
        return result
    closed = closed_loop_capacity(url, model, input_tokens, 1, ttft_budget_s, tpot_s, api_key,
                                  progress)
    result.search_start.append((*key, closed))
    rate = open_loop_capacity(url, model, input_tokens, 1, ttft_budget_s, tpot_s, closed,
                              api_key, result.open_loop_phases, progress, fresh_prompts=True,
                              phase_s=phase_s)
    result.throughput.append((*key, rate))
    return result


def _warm(url: str, model: str, input_tokens: int, salts: Iterable[int],
          api_key: str | None, workers: int = 4) -> int:
    """Prefill each prompt of ``salts`` once (``max_tokens: 1``), so a prefix-caching engine
    holds its KV when the prompt comes again: the KV a decode replica is handed. Returns the
    prompt tokens sent."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(lambda s: stream_completion(
            url, model, prompt_ids(input_tokens, s), 1, api_key), salts))
    return len(done) * input_tokens


def _phase_requests(rate: float, phase_s: float) -> int:
    """Prompts a Poisson phase at ``rate`` sends, with room for its spread (mean + 4 sd)."""
    mean = openloop.phase_seconds(rate, phase_s) * rate
    return int(mean + 4 * math.sqrt(mean) + 5)


def measure_decode_role(url: str, model: str, *, input_tokens: int, output_tokens: int,
                        ttft_s: float, tpot_s: float, batch_sizes: Sequence[int] = (1, 2, 4, 8),
                        decode_tokens: int = 24, api_key: str | None = None,
                        progress: Progress = lambda _m: None,
                        phase_s: float = openloop.PHASE_S) -> RoleMeasurements:
    """A decode replica's figures (module doc): the median TPOT per batch size at the mix's
    context with the prompts' KV in place, and the most requests/s of the mix within the
    model's TPOT and TTFT, searched from what the measured steps allow."""
    result = RoleMeasurements("decode", kv_capacity_tokens(url, api_key),
                              judged={"ttft_s": ttft_s, "tpot_s": tpot_s, "kv_transfer_s": 0.0})
    cache_before = _prefix_cache(url, api_key)
    stream_completion(url, model, prompt_ids(8), 2, api_key)  # warm-up, not recorded
    out = max(2, min(decode_tokens, output_tokens))
    start = 0.0
    warm_tokens = 0
    for batch in batch_sizes:
        salt = 9000 + 100 * batch
        warm_tokens += _warm(url, model, input_tokens, [salt + i * 31 for i in range(batch)],
                             api_key)
        load = run_load(url, model, batch, input_tokens, out, rounds=1, api_key=api_key,
                        salt=salt)
        step = statistics.median(t.tpot_s for t in load.timings)
        result.steps.append((batch, 0, batch * (input_tokens + out // 2), step))
        progress(f"decode role: batch {batch} at {input_tokens}-token context: "
                 f"{step * 1e3:.1f} ms/step")
        if step <= tpot_s:  # a batch within TPOT serves batch / (output x step) requests/s
            start = max(start, batch / (output_tokens * step))
    key = (input_tokens, output_tokens, ttft_s, tpot_s)
    result.search_start.append((*key, start))
    warmed = 0

    def warm_phase(rate: float) -> None:
        # open-loop phases send prompts of salts 0, 1, 2, ...: each new one is prefilled once
        nonlocal warmed, warm_tokens
        wanted = _phase_requests(rate, phase_s)
        if wanted > warmed:
            warm_tokens += _warm(url, model, input_tokens, range(warmed, wanted), api_key)
            warmed = wanted

    rate = open_loop_capacity(url, model, input_tokens, output_tokens, ttft_s, tpot_s, start,
                              api_key, result.open_loop_phases, progress, before_phase=warm_phase,
                              phase_s=phase_s)
    result.throughput.append((*key, rate))
    result.prompt_tokens_cached = _cached_share(cache_before, _prefix_cache(url, api_key),
                                                warm_tokens)
    share = result.prompt_tokens_cached
    progress("decode role: prompt tokens served from the prefix cache: "
             + ("not exported" if share is None else f"{share:.0%}"))
    return result


#: vLLM's prefix-cache counters, in prompt tokens (vllm v1 metrics)
_HITS, _QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def _prefix_cache(url: str, api_key: str | None) -> dict[str, float] | None:
    """The engine's prefix-cache counters now; None when it exports none."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    text = vllm_metrics.fetch_metrics_text(url, timeout=10, headers=headers)
    if _QUERIES not in text:
        return None
    return vllm_metrics.counter_totals(text, (_HITS, _QUERIES))


def _cached_share(before: dict[str, float] | None, after: dict[str, float] | None,
                  warm_tokens: int) -> float | None:
    """Prompt tokens the cache served between two readings, as a share of the measured
    requests' prompt tokens (those asked for less the ``warm_tokens`` of the warm-ups, whose
    first pass is what fills the cache)."""
    if before is None or after is None:
        return None
    asked = after[_QUERIES] - before[_QUERIES] - warm_tokens
    hits = after[_HITS] - before[_HITS]
    return min(1.0, hits / asked) if asked > 0 else None


def measure_roles(url: str, model: str, *, input_tokens: int, output_tokens: int, ttft_s: float,
                  tpot_s: float, ttft_budget_s: float, kv_transfer_s: float,
                  api_key: str | None = None, progress: Progress = lambda _m: None,
                  phase_s: float = openloop.PHASE_S) -> dict[str, RoleMeasurements]:
    """Both roles on one engine: prefill first (its prompts are all distinct from decode's);
    open-loop phases of ``phase_s``."""
    return {
        "prefill": measure_prefill_role(
            url, model, input_tokens=input_tokens, output_tokens=output_tokens, ttft_s=ttft_s,
            tpot_s=tpot_s, ttft_budget_s=ttft_budget_s, kv_transfer_s=kv_transfer_s,
            api_key=api_key, progress=progress, phase_s=phase_s),
        "decode": measure_decode_role(
            url, model, input_tokens=input_tokens, output_tokens=output_tokens, ttft_s=ttft_s,
            tpot_s=tpot_s, api_key=api_key, progress=progress, phase_s=phase_s),
    }
