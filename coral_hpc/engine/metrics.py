"""Prometheus metrics of the sim engine under vLLM's names, so anything that scrapes a vLLM
replica (the gateway, the daemon, a dashboard) reads a sim replica the same way. The names the
daemon reads come from :mod:`coral_hpc.engine.vllm_metrics`, checked there against the real
engine's output.

Names and histogram buckets follow vLLM's ``vllm/engine/metrics.py`` / ``vllm/v1/metrics``:
gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:gpu_cache_usage_perc``
and its V1 name ``vllm:kv_cache_usage_perc`` (a 0..1 fraction despite the name); counters
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``
(by ``finished_reason``), ``vllm:num_preemptions_total`` (recompute preemptions when the KV
cache runs out); histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` and its
older name ``vllm:time_per_output_token_seconds``, ``vllm:e2e_request_latency_seconds``,
``vllm:request_queue_time_seconds``. ``vllm:cache_config_info`` carries the block size and block
count. ``coral_sim_info`` says what is simulated — this is not inference.

Latencies are observed in wall-clock seconds as clients see them, so with ``--sim-speed`` s they
are s times shorter than the modelled GPU's.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coral_hpc.engine import vllm_metrics as names
from coral_hpc.engine.runner import RequestHandle
from coral_replica_sim.batching import Scheduler, TokenEvent

#: vLLM's bucket boundaries (seconds).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

#: The sim never stops on EOS or a stop string: every request runs to max_tokens.
FINISHED_REASON = "length"


class _SchedulerGauges(Collector):
    """Gauges read from the scheduler at scrape time, so they are never stale."""

    def __init__(self, scheduler: Scheduler, model_name: str, info: dict[str, str]):
        self._scheduler = scheduler
        self._model = model_name
        self._info = info

    def collect(self) -> Iterable[Metric]:
        s = self._scheduler
        labels = ["model_name"]
        for name, doc, value in (
            (names.REQUESTS_RUNNING, "Number of requests in model execution batches.",
             s.num_running),
            (names.REQUESTS_WAITING, "Number of requests waiting to be processed.",
             s.num_waiting),
            (names.KV_CACHE_USAGE[1], "KV-cache usage. 1 means 100 percent usage.",
             s.kv_usage),
            (names.KV_CACHE_USAGE[0], "KV-cache usage. 1 means 100 percent usage.",
             s.kv_usage),
        ):  # fmt: skip
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric([self._model], float(value))
            yield family
        preemptions = CounterMetricFamily(
            names.PREEMPTIONS.removesuffix("_total"),
            "Cumulative number of preemption from the engine.",
            labels=labels,
        )  # fmt: skip
        preemptions.add_metric([self._model], float(s.preemptions))
        yield preemptions
        cache = GaugeMetricFamily(
            names.CACHE_CONFIG,
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks"],
        )
        cache.add_metric([str(s.block_size), str(s.total_blocks)], 1.0)
        yield cache
        info = GaugeMetricFamily(
            "coral_sim_info",
            "This replica is coral-hpc's simulated engine (no inference); what it simulates.",
            labels=sorted(self._info),
        )
        info.add_metric([self._info[k] for k in sorted(self._info)], 1.0)
        yield info


class EngineMetrics:
    """The registry of one sim server; also the engine's :class:`~coral_hpc.engine.runner.Observer`."""

    def __init__(self, scheduler: Scheduler, model_name: str, info: dict[str, str]):
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = model_name
        labels = ["model_name"]
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets)

        self.prompt_tokens = Counter(
            names.PROMPT_TOKENS.removesuffix("_total"), "Number of prefill tokens processed.",
            labels, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            names.GENERATION_TOKENS.removesuffix("_total"),
            "Number of generation tokens processed.", labels, registry=r
        ).labels(model_name)
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=r,
        )
        self.success.labels(model_name, FINISHED_REASON)  # exported as 0 before the first request
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(model_name)  # fmt: skip
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        ).labels(model_name)  # fmt: skip
        self.tpot = hist(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (older name of inter_token_latency).",
            ITL_BUCKETS,
        ).labels(model_name)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(model_name)  # fmt: skip
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(model_name)
        # vLLM's KV-connector counters (prompt tokens): queried, and found outside this engine
        self.external_queries = Counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.", labels, registry=r,
        ).labels(model_name)
        self.external_hits = Counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
            "of number of cached tokens.", labels, registry=r,
        ).labels(model_name)
        r.register(_SchedulerGauges(scheduler, model_name, info))

    def on_token(self, handle: RequestHandle, event: TokenEvent, now: float) -> None:
        """Count one produced token (called by the engine before it updates the handle)."""
        self.generation_tokens.inc()
        if event.index == 0:
            self.prompt_tokens.inc(handle.seq.prompt_tokens)
            self.ttft.observe(now - handle.arrival)
        elif handle.last_token_at is not None:
            gap = now - handle.last_token_at
            self.itl.observe(gap)
            self.tpot.observe(gap)
        if event.finished:
            self.success.labels(self._model, FINISHED_REASON).inc()
            self.e2e.observe(now - handle.arrival)

    def on_external_lookup(self, queried: int, hit: int) -> None:
        """Count a KV-connector lookup: ``queried`` prompt tokens, ``hit`` of them found."""
        self.external_queries.inc(queried)
        self.external_hits.inc(hit)

    def on_admitted(self, handle: RequestHandle, now: float) -> None:
        """Record how long a request waited before the engine admitted it."""
        self.queue_time.observe(now - handle.arrival)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
