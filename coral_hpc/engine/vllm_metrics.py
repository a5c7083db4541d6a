"""What coral-hpc reads from an engine's Prometheus ``/metrics``: vLLM's metric names in one place,
and one parser for them.

The real engine (vLLM 0.32, V1 engine; a recorded output is ``tests/data/vllm/``) and the sim
engine (:mod:`coral_hpc.engine.metrics`, which exports these same names) are read the same way:

- load: ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (gauges), KV-cache use
  ``vllm:kv_cache_usage_perc`` (a 0..1 fraction despite the name; before V1
  ``vllm:gpu_cache_usage_perc``);
- token counters: ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, and
  ``vllm:num_preemptions_total`` (requests recomputed when the KV cache ran out);
- KV capacity: ``vllm:cache_config_info``'s ``num_gpu_blocks`` × ``block_size`` labels (what
  ``coral-hpc profile`` measures).

vLLM labels every series by ``model_name`` and ``engine`` (one per data-parallel engine):
:func:`parse_engine_metrics` sums over them. The exposition format is parsed by
``prometheus_client``'s parser, not by hand.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

#: gauges: requests in the running batch / in the queue
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
#: KV-cache use, 0..1: V1's name first, then the older one
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
#: counters (the sample names; the family names lack ``_total``)
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
#: info gauge whose labels carry the cache configuration
CACHE_CONFIG = "vllm:cache_config_info"
#: latency histograms (seconds): TTFT as the engine's API server saw it, and the part of it a
#: request waited in the scheduler's queue (read by bench/slo_vllm.py to place a latency tail)
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
QUEUE_TIME_SECONDS = "vllm:request_queue_time_seconds"

#: every name :class:`EngineLoad` needs (one of the KV-usage names suffices)
REQUIRED = (REQUESTS_RUNNING, REQUESTS_WAITING, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS)


class EngineMetricsError(ValueError):
    """The text is not an engine's metrics: names missing or unparseable."""


@dataclass(frozen=True)
class EngineLoad:
    """One engine's load and cumulative token counts at one scrape."""

    running: int
    waiting: int
    kv_cache_usage: float          # 0..1, the most used engine's
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    kv_capacity_tokens: int | None  # num_gpu_blocks × block_size; None when not exported


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except ValueError as exc:
        raise EngineMetricsError(f"not Prometheus text: {exc}") from exc
    return out


def _capacity(samples: dict[str, list[tuple[dict[str, str], float]]]) -> int | None:
    for labels, _value in samples.get(CACHE_CONFIG, []):
        try:
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            continue
    return None


def kv_capacity_tokens(text: str) -> int | None:
    """KV-cache tokens from ``vllm:cache_config_info`` (num_gpu_blocks × block_size); None when
    the engine does not export it (or not yet: the blocks are known once the engine is up)."""
    return _capacity(_samples(text))


def parse_engine_metrics(text: str) -> EngineLoad:
    """The load and token counters in an engine's ``/metrics`` text, summed over its label sets
    (``model_name``, ``engine``). Raises :class:`EngineMetricsError` naming every missing name:
    an engine that exports none of them is not vLLM (or renamed them)."""
    samples = _samples(text)
    missing = [n for n in REQUIRED if n not in samples]
    if not any(n in samples for n in KV_CACHE_USAGE):
        missing.append(" or ".join(KV_CACHE_USAGE))
    if missing:
        raise EngineMetricsError(f"engine metrics lack {', '.join(missing)}")

    def total(name: str) -> float:
        return sum(value for _labels, value in samples[name])

    usage_name = next(n for n in KV_CACHE_USAGE if n in samples)
    return EngineLoad(
        running=int(total(REQUESTS_RUNNING)), waiting=int(total(REQUESTS_WAITING)),
        kv_cache_usage=max(value for _labels, value in samples[usage_name]),
        prompt_tokens=int(total(PROMPT_TOKENS)),
        generation_tokens=int(total(GENERATION_TOKENS)),
        preemptions=int(total(PREEMPTIONS)), kv_capacity_tokens=_capacity(samples))


def histogram_totals(text: str, names: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """Per histogram name: (sum, count) of its observations so far, summed over its label sets
    (0, 0 where the engine has not exported it)."""
    samples = _samples(text)

    def total(name: str) -> float:
        return sum(value for _labels, value in samples.get(name, []))

    return {name: (total(f"{name}_sum"), total(f"{name}_count")) for name in names}


def counter_totals(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Per counter name (e.g. ``vllm:prefix_cache_hits_total``): its value summed over its
    label sets (0 where the engine has not exported it)."""
    samples = _samples(text)
    return {name: sum(value for _labels, value in samples.get(name, [])) for name in names}


def fetch_metrics_text(url: str, timeout: float = 5.0,
                       headers: dict[str, str] | None = None) -> str:
    """GET ``url/metrics`` as text (raises ``OSError``/``urllib.error.URLError`` on failure)."""
    request = urllib.request.Request(f"{url.rstrip('/')}/metrics", headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode("utf-8", "replace")


def fetch_engine_load(url: str, timeout: float = 2.0) -> EngineLoad | None:
    """The engine's load at ``url``; None when it does not answer or exports no engine metrics
    (a scrape that fails is no fact about the replica's health: ``/health`` decides that)."""
    try:
        return parse_engine_metrics(fetch_metrics_text(url, timeout))
    except (OSError, urllib.error.URLError, EngineMetricsError, ValueError):
        return None
