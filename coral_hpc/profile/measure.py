"""Measure one running engine over its OpenAI API and ``/metrics`` (plain HTTP, no vLLM import).

Prompts are lists of token ids, so each has exactly the length asked for whatever the tokenizer;
``ignore_eos`` keeps every request to its ``max_tokens``. Streaming gives each request's TTFT and
its time per output token (TPOT: the gaps between streamed tokens).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from coral_hpc.engine import vllm_metrics
from coral_hpc.errors import PermanentError
from coral_hpc.profile import openloop
from coral_hpc.profile.prompts import prompt_ids


@dataclass(frozen=True)
class RequestTiming:
    """One streamed request: time to first token, mean time per later token, tokens out."""

    ttft_s: float
    tpot_s: float
    tokens: int


@dataclass(frozen=True)
class LoadResult:
    """``concurrency`` requests at once, repeated ``rounds`` times (closed loop)."""

    concurrency: int
    timings: tuple[RequestTiming, ...]
    elapsed_s: float

    @property
    def requests_per_s(self) -> float:
        return len(self.timings) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def fraction_within(self, ttft_s: float, tpot_s: float) -> float:
        ok = [t for t in self.timings if t.ttft_s <= ttft_s and t.tpot_s <= tpot_s]
        return len(ok) / len(self.timings) if self.timings else 0.0


@dataclass
class EngineMeasurements:
    """What one engine run measured."""

    kv_capacity_tokens: int | None = None
    prefill: list[tuple[int, float]] = field(default_factory=list)  # (prompt tokens, seconds)
    decode: list[tuple[int, int, float]] = field(default_factory=list)  # (seqs, context, s)
    throughput: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    #: ^ (input, output, ttft_s, tpot_s, requests/s that met them): open-loop (Poisson)
    closed_loop: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    #: ^ the same, the closed-loop sweep's figure (the open-loop search starts there)
    open_loop_phases: list[dict[str, float | bool]] = field(default_factory=list)
    #: ^ every open-loop phase the search ran: rate, share within, met, the generator's cores


class EngineFailed(PermanentError, RuntimeError):
    """The engine being measured failed: its job ended or never answered ``/health``, or its
    requests failed. Not a coral-hpc bug: the engine's log says why (``coral-hpc profile``
    exits 5)."""


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def stream_completion(url: str, model: str, prompt: list[int], max_tokens: int,
                      api_key: str | None = None, timeout: float = 300.0) -> RequestTiming:
    """One streamed ``/v1/completions`` request at temperature 0; its timing.

    A chunk's text may be empty (a byte-level token that completes no character yet), so the
    first chunk with a choice marks the first token and the final usage counts the tokens:
    TPOT = (last chunk - first chunk) / (tokens - 1)."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, _headers(api_key))
    start = time.perf_counter()
    first = last = None
    tokens = 0
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first if first is not None else last
            if chunk.get("usage"):
                tokens = int(chunk["usage"].get("completion_tokens") or 0)
    if first is None or last is None or tokens < 1:
        raise EngineFailed(f"{url}: a streamed completion returned no tokens")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return RequestTiming(first - start, tpot, tokens)


def run_load(url: str, model: str, concurrency: int, input_tokens: int, output_tokens: int,
             rounds: int = 2, api_key: str | None = None, salt: int = 0) -> LoadResult:
    """``concurrency`` requests at once, ``rounds`` times over: each thread sends its next
    request when its last one finished (closed loop)."""
    timings: list[RequestTiming] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        for r in range(rounds):
            try:
                t = stream_completion(url, model, prompt_ids(input_tokens, salt + index * 31 + r),
                                      output_tokens, api_key)
            except BaseException as exc:  # noqa: BLE001 - reported below, once
                with lock:
                    errors.append(exc)
                return
            with lock:
                timings.append(t)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise EngineFailed(f"{url}: {len(errors)} request(s) failed: {errors[0]!r}")
    return LoadResult(concurrency, tuple(timings), time.perf_counter() - start)


def kv_capacity_tokens(url: str, api_key: str | None = None) -> int | None:
    """KV-cache tokens from vLLM's ``vllm:cache_config_info`` (num_gpu_blocks × block_size)."""
    return vllm_metrics.kv_capacity_tokens(
        vllm_metrics.fetch_metrics_text(url, timeout=10, headers=_headers(api_key)))


#: Closed-loop client counts of the throughput sweep, in order (it stops at the first that misses
#: the SLO): no measured throughput point ever had more requests in flight than the last.
CONCURRENCY_LEVELS = (1, 2, 4, 8, 16, 32)


def closed_loop_capacity(url: str, model: str, n_in: int, n_out: int, ttft: float, tpot: float,
                         api_key: str | None, progress: Callable[[str], None]) -> float:
    """The most requests/s of a closed-loop sweep over CONCURRENCY_LEVELS whose requests all
    met both SLOs (it stops at the first level that misses): where the open-loop search
    starts."""
    best = 0.0
    for concurrency in CONCURRENCY_LEVELS:
        load = run_load(url, model, concurrency, n_in, n_out, rounds=2, api_key=api_key,
                        salt=5000 + concurrency)
        progress(f"closed loop, SLO {ttft:g}s/{tpot:g}s, mix {n_in}/{n_out}, concurrency "
                 f"{concurrency}: {load.requests_per_s:.2f} req/s, "
                 f"{load.fraction_within(ttft, tpot):.0%} within")
        if load.fraction_within(ttft, tpot) < 0.95:
            break
        best = max(best, load.requests_per_s)
    return best


def open_loop_capacity(url: str, model: str, n_in: int, n_out: int, ttft: float, tpot: float,
                       start: float, api_key: str | None, record: list[dict[str, float | bool]],
                       progress: Callable[[str], None],
                       before_phase: Callable[[float], None] | None = None,
                       fresh_prompts: bool = False, phase_s: float = openloop.PHASE_S) -> float:
    """The highest Poisson arrival rate at which the goal share of requests met both SLOs
    (:mod:`coral_hpc.profile.openloop`), searched from ``start`` (0: nothing to search, the
    engine missed the SLO even one request at a time) and met twice (its repeat draws other
    arrival times: ``repeat`` in the record). Every phase is appended to ``record``;
    ``before_phase(rate)`` runs before each (e.g. to put the phase's prompts in the cache);
    ``fresh_prompts``: each phase's prompts follow the last phase's instead of starting again
    at salt 0, so a prefix-caching engine does not answer a later phase's prompts from its
    cache (where the prompts' salts are all used once, they repeat: ``prompts.prompt_ids``).
    ``phase_s``: each phase's length, or longer to expect openloop.MIN_REQUESTS requests."""
    if start <= 0:
        return 0.0
    sent = 0
    seen: dict[float, int] = {}

    def met_at(rate: float) -> bool:
        if before_phase is not None:
            before_phase(rate)
        nonlocal sent
        # a repeat of a rate (the search confirming what it found) draws other arrival times
        repeat = seen[rate] = seen.get(rate, -1) + 1
        seed = f"profile-{rate:.4f}" + (f"-repeat{repeat}" if repeat else "")
        seconds = openloop.phase_seconds(rate, phase_s)
        phase = openloop.poisson_phase(url, model, rate, input_tokens=n_in,
                                       output_tokens=n_out, ttft_s=ttft, tpot_s=tpot,
                                       seconds=seconds, seed=seed, api_key=api_key,
                                       first_salt=sent if fresh_prompts else 0)
        sent += len(phase.timings)
        met = phase.met(ttft, tpot)
        record.append({"requests_per_s": round(rate, 4), "repeat": repeat,
                       "seconds": round(seconds, 1), "requests": len(phase.timings),
                       "within_slo": round(phase.within(ttft, tpot), 4), "met": met,
                       "client_late_p99_s": round(phase.late_p99_s, 4),
                       "client_behind_at_end_s": round(phase.behind_at_end_s, 4),
                       "client_cores": round(phase.client_cores(), 3)})
        progress(f"open loop, SLO {ttft:g}s/{tpot:g}s, mix {n_in}/{n_out}, Poisson {rate:.2f} "
                 f"req/s{' (repeated)' if repeat else ''}: "
                 f"{phase.within(ttft, tpot):.0%} within of {len(phase.timings)}, "
                 f"client late p99 {phase.late_p99_s * 1e3:.0f} ms "
                 f"(at the end {phase.behind_at_end_s * 1e3:.0f} ms), "
                 f"{phase.client_cores():.2f} cores -> {'met' if met else 'missed'}")
        return met

    search = openloop.search_capacity(met_at, start)
    if search.capacity > 0:
        progress(f"open loop, SLO {ttft:g}s/{tpot:g}s, mix {n_in}/{n_out}: capacity "
                 f"{search.capacity:.2f} req/s, "
                 + ("met twice" if search.confirmed else "met once (its repeats missed)"))
    return search.capacity


def measure_engine(
    url: str, model: str, *, slos: Sequence[tuple[int, int, float, float]],
    prefill_lengths: Sequence[int] = (32, 128, 384), batch_sizes: Sequence[int] = (1, 2, 4, 8),
    decode_tokens: int = 24, api_key: str | None = None,
    progress: Callable[[str], None] = lambda _m: None, phase_s: float = openloop.PHASE_S,
) -> EngineMeasurements:
    """Measure a running engine: KV capacity; prefill step (TTFT of one request) per prompt
    length; decode step (median TPOT) per batch size; per (input, output, TTFT, TPOT) in
    ``slos``, the highest Poisson arrival rate at which 95 % of requests met both
    (:func:`open_loop_capacity`, searched from a closed-loop sweep's figure, in phases of
    ``phase_s``)."""
    result = EngineMeasurements(kv_capacity_tokens=kv_capacity_tokens(url, api_key))
    stream_completion(url, model, prompt_ids(8), 2, api_key)  # warm-up, not recorded
    for length in prefill_lengths:
        timing = stream_completion(url, model, prompt_ids(length, salt=length), 1, api_key)
        result.prefill.append((length, timing.ttft_s))
        progress(f"prefill {length} tokens: {timing.ttft_s * 1e3:.1f} ms")
    for batch in batch_sizes:
        load = run_load(url, model, batch, 32, decode_tokens, rounds=1, api_key=api_key,
                        salt=1000 + batch)
        step = statistics.median(t.tpot_s for t in load.timings)
        result.decode.append((batch, batch * (32 + decode_tokens // 2), step))
        progress(f"decode batch {batch}: {step * 1e3:.1f} ms/step")
    for n_in, n_out, ttft, tpot in slos:
        closed = closed_loop_capacity(url, model, n_in, n_out, ttft, tpot, api_key, progress)
        result.closed_loop.append((n_in, n_out, ttft, tpot, closed))
        result.throughput.append((n_in, n_out, ttft, tpot, open_loop_capacity(
            url, model, n_in, n_out, ttft, tpot, closed, api_key, result.open_loop_phases,
            progress, phase_s=phase_s)))
    return result
