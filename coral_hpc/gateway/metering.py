"""Demand metering: what clients asked for, per model and per API key.

Two outputs from one set of counts:

* Prometheus counters and histograms (``/metrics``) for people and dashboards;
* :meth:`DemandMeter.snapshot` (``/internal/demand``) for the daemon: per model and per key,
  cumulative requests, rejections and tokens (and the mean request mix, for people). The daemon
  stores their deltas and ``coral_hpc.demand`` smooths them into the rates ``demand: auto`` plans
  from, rebuilt from the stored intervals so a restart of either process loses nothing; the
  gateway keeps no rates of its own.
* Per model, the arrivals of each closed short window (``policy.demand_window_s``, aligned to
  the wall clock) of the last ``policy.demand_windows`` windows, empty ones included: what a
  ``policy.plan_for`` percentile is taken of. The window in progress when the gateway started
  is not counted (it saw only part of it); a gateway restart starts the windows afresh.

Requests turned away for lack of capacity (503, no READY replica) count as demand too: they are
exactly the traffic the plan failed to serve. Tokens come from the responses' ``usage`` fields; when
a stream carries none, generated tokens are counted as content chunks (vLLM sends one token per
chunk) and prompt tokens estimated at 4 characters per token, and the request is counted in
``estimated_usage`` so the daemon knows how much of the mix is estimated.
"""

from __future__ import annotations

import math
import time
from collections import deque
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


class _Arrivals:
    """Arrivals per window of one model: the window in progress and the closed ones kept."""

    __slots__ = ("index", "count", "closed")

    def __init__(self, index: int, zeros: int, kept: int) -> None:
        self.index = index            # the window in progress (wall time // window_s)
        self.count = 0
        self.closed: deque[int] = deque([0] * min(zeros, kept), maxlen=kept)


class DemandMeter:
    """Counts arrivals and tokens per model and per key; cheap on the request path."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = 10.0,
                 windows_kept: int = 20, wall: Callable[[], float] = time.time) -> None:
        if window_s <= 0 or windows_kept < 1:
            raise ValueError(f"window_s must be > 0 and windows_kept >= 1, got {window_s}, "
                             f"{windows_kept}")
        self._clock = clock
        self._models: dict[str, _ModelWindow] = {}
        self._keys: dict[str, list[int]] = {}   # key -> [requests, rejected, prompt, generated]
        self._started = clock()
        self._wall = wall
        self._window_s = float(window_s)
        self._kept = int(windows_kept)
        self._arrivals: dict[str, _Arrivals] = {}
        # the window in progress now began before the meter: the first whole one is the next
        self._first = math.floor(wall() / self._window_s) + 1

    def _arrivals_at(self, model: str, index: int) -> _Arrivals:
        """``model``'s windows, the one in progress moved on to ``index``: the windows it passed
        are closed (those it skipped had no arrival)."""
        found = self._arrivals.get(model)
        if found is None:
            # the meter ran since _first without an arrival for this model: empty windows
            found = self._arrivals[model] = _Arrivals(index, index - self._first, self._kept)
        elif index > found.index:
            if found.index >= self._first:
                found.closed.append(found.count)
            found.closed.extend([0] * min(index - found.index - 1, self._kept))
            found.index, found.count = index, 0
        return found

    def _window(self, model: str) -> _ModelWindow:
        window = self._models.get(model)
        if window is None:
            window = self._models[model] = _ModelWindow()
        return window

    def record_arrival(self, model: str, key: str, rejected: bool = False) -> None:
        """One request for ``model`` from ``key``; ``rejected`` when no replica could take it."""
        window = self._window(model)
        window.requests += 1
        # a wall clock set back counts into the window in progress
        self._arrivals_at(model, math.floor(self._wall() / self._window_s)).count += 1
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
        index = math.floor(self._wall() / self._window_s)
        out_models: dict[str, dict] = {}
        for model in sorted(set(self._models) | set(models)):
            window = self._window(model)
            arrivals = self._arrivals_at(model, index)
            done = window.completed
            out_models[model] = {
                "requests_total": window.requests,
                "rejected_total": window.rejected,
                "prompt_tokens_total": window.prompt_tokens,
                "generated_tokens_total": window.generated_tokens,
                "mean_prompt_tokens": round(window.prompt_tokens / done, 3) if done else None,
                "mean_generated_tokens": round(window.generated_tokens / done, 3) if done else None,
                "estimated_usage_total": window.estimated,
                # arrivals per closed window, oldest first; the newest ends at windows_end
                "arrival_windows": list(arrivals.closed),
                **({"ready_replicas": ready(model)} if ready else {}),
            }
        return {
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "uptime_s": round(now - self._started, 3),
            "window_s": self._window_s,
            "windows_end": index * self._window_s,
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
