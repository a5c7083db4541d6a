"""Demand metering: what clients asked for, per model and per API key.

Two outputs from one set of counts:

* Prometheus counters and histograms (``/metrics``) for people and dashboards;
* :meth:`DemandMeter.snapshot` (``/internal/demand``) for the daemon: per model and per key,
  cumulative requests, rejections and tokens (and the mean request mix, for people). The daemon
  stores their deltas and ``coral_hpc.demand`` smooths them into the rates ``demand: auto`` plans
  from, rebuilt from the stored intervals so a restart of either process loses nothing; the
  gateway keeps no rates of its own.

Requests turned away for lack of capacity (503, no READY replica) count as demand too: they are
exactly the traffic the plan failed to serve. Tokens come from the responses' ``usage`` fields; when
a stream carries none, generated tokens are counted as content chunks (vLLM sends one token per
chunk) and prompt tokens estimated at 4 characters per token, and the request is counted in
``estimated_usage`` so the daemon knows how much of the mix is estimated.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

#: Histogram buckets (seconds) spanning a sub-millisecond embedding to a long generation.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                   120, 300)


class _ModelWindow:
    """Cumulative counts of one model."""

    __slots__ = ("requests", "rejected", "prompt_tokens", "generated_tokens", "estimated",
                 "completed")

    def __init__(self) -> None:
        self.requests = 0
        self.rejected = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.estimated = 0            # completed requests whose tokens were estimated
        self.completed = 0            # requests whose tokens were counted


class DemandMeter:
    """Counts arrivals and tokens per model and per key; cheap on the request path."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._models: dict[str, _ModelWindow] = {}
        self._keys: dict[str, list[int]] = {}   # key -> [requests, rejected, prompt, generated]
        self._started = clock()

    def _window(self, model: str) -> _ModelWindow:
        window = self._models.get(model)
        if window is None:
            window = self._models[model] = _ModelWindow()
        return window

    def record_arrival(self, model: str, key: str, rejected: bool = False) -> None:
        """One request for ``model`` from ``key``; ``rejected`` when no replica could take it."""
        window = self._window(model)
        window.requests += 1
        per_key = self._keys.get(key)
        if per_key is None:
            per_key = self._keys[key] = [0, 0, 0, 0]
        per_key[0] += 1
        if rejected:
            window.rejected += 1
            per_key[1] += 1

    def record_tokens(self, model: str, key: str, prompt: int, generated: int,
                      estimated: bool) -> None:
        """Tokens of one finished request."""
        window = self._window(model)
        window.prompt_tokens += prompt
        window.generated_tokens += generated
        window.completed += 1
        if estimated:
            window.estimated += 1
        per_key = self._keys.setdefault(key, [0, 0, 0, 0])
        per_key[2] += prompt
        per_key[3] += generated

    def snapshot(self, ready: Callable[[str], int] | None = None,
                 models: tuple[str, ...] = ()) -> dict:
        """The JSON the daemon reads from ``/internal/demand``."""
        now = self._clock()
        out_models: dict[str, dict] = {}
        for model in sorted(set(self._models) | set(models)):
            window = self._window(model)
            done = window.completed
            out_models[model] = {
                "requests_total": window.requests,
                "rejected_total": window.rejected,
                "prompt_tokens_total": window.prompt_tokens,
                "generated_tokens_total": window.generated_tokens,
                "mean_prompt_tokens": round(window.prompt_tokens / done, 3) if done else None,
                "mean_generated_tokens": round(window.generated_tokens / done, 3) if done else None,
                "estimated_usage_total": window.estimated,
                **({"ready_replicas": ready(model)} if ready else {}),
            }
        return {
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "uptime_s": round(now - self._started, 3),
            "models": out_models,
            "keys": {
                key: {"requests_total": v[0], "rejected_total": v[1],
                      "prompt_tokens_total": v[2], "generated_tokens_total": v[3]}
                for key, v in sorted(self._keys.items())
            },
        }


class _Children:
    """Prometheus children for one (model, key): labels() looked up once, not per request."""

    __slots__ = ("requests", "rejected", "prompt", "generated", "latency", "ttft")

    def __init__(self, metrics: "GatewayMetrics", model: str, key: str) -> None:
        self.requests = metrics.requests.labels(model, key)
        self.rejected = metrics.rejected.labels(model, key)
        self.prompt = metrics.prompt_tokens.labels(model, key)
        self.generated = metrics.generated_tokens.labels(model, key)
        self.latency = metrics.latency.labels(model)
        self.ttft = metrics.ttft.labels(model)


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, ready_replicas: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("coral_gateway_requests", "Requests per model and API key",
                                ["model", "key"], registry=r)
        self.rejected = Counter("coral_gateway_rejected_capacity",
                                "Requests answered 503 because no replica was READY (still demand)",
                                ["model", "key"], registry=r)
        self.errors = Counter("coral_gateway_errors", "Requests that failed, by reason",
                              ["model", "reason"], registry=r)
        self.client_errors = Counter("coral_gateway_client_errors",
                                     "Requests refused before routing (400/401/404/413)",
                                     ["status"], registry=r)
        self.retries = Counter("coral_gateway_retries", "Requests retried on another replica",
                               ["model"], registry=r)
        self.prompt_tokens = Counter("coral_gateway_prompt_tokens", "Prompt tokens",
                                     ["model", "key"], registry=r)
        self.generated_tokens = Counter("coral_gateway_generated_tokens", "Generated tokens",
                                        ["model", "key"], registry=r)
        self.latency = Histogram("coral_gateway_request_seconds",
                                 "Time from request to the last byte of the answer", ["model"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("coral_gateway_first_chunk_seconds",
                              "Streams: time from request to the first chunk", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self._ready = ready_replicas
        self._children: dict[tuple[str, str], _Children] = {}
        r.register(self._ReadyCollector(self))

    class _ReadyCollector:
        """Ready and total replicas per model, computed at scrape time from the router."""

        def __init__(self, outer: "GatewayMetrics") -> None:
            self.outer = outer

        def collect(self):
            ready = GaugeMetricFamily("coral_gateway_ready_replicas",
                                      "Replicas taking requests now", labels=["model"])
            listed = GaugeMetricFamily("coral_gateway_table_replicas",
                                       "Replicas in the routing table", labels=["model"])
            for model, (healthy, total) in sorted(self.outer._ready().items()):
                ready.add_metric([model], healthy)
                listed.add_metric([model], total)
            yield ready
            yield listed

    def children(self, model: str, key: str) -> _Children:
        """The cached metric children of (model, key)."""
        found = self._children.get((model, key))
        if found is None:
            found = self._children[(model, key)] = _Children(self, model, key)
        return found
