"""The engine /metrics names coral-hpc reads (coral_hpc.engine.vllm_metrics), checked against a
real vLLM 0.32.0 (CPU build) replica's /metrics recorded by bench/slo_vllm.py
(tests/data/vllm/metrics-vllm-0.32.0-cpu.txt: the head of tiny-llama's two-node pipeline in
examples/vllm-cpu.yaml, after the 1x load) and against the
sim engine's own output, which must read the same way."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coral_hpc.daemon.metrics import DaemonMetrics
from coral_hpc.engine import vllm_metrics
from coral_hpc.engine.metrics import EngineMetrics
from coral_replica_sim.batching import Scheduler

RECORDED = Path(__file__).parents[1] / "data" / "vllm" / "metrics-vllm-0.32.0-cpu.txt"


def test_the_real_engines_output_has_every_name_read():
    text = RECORDED.read_text()
    load = vllm_metrics.parse_engine_metrics(text)
    # the recording was taken after load: the counters moved, the engine was idle again
    assert load.prompt_tokens > 0 and load.generation_tokens > 0
    assert load.running == 0 and load.waiting == 0
    assert 0.0 <= load.kv_cache_usage <= 1.0
    # the recording is the head of tiny-llama's two-node pipeline, which holds 2 of its 4 layers:
    # VLLM_CPU_KVCACHE_SPACE=1 (GiB) over 2 layers × 2 KV heads × 64 × 2 (K, V) × 2 bytes = 1 KiB
    # a token → 2**30 / 1024 tokens (PP 1, all 4 layers: 524,288, examples/vllm-cpu.profiles)
    assert load.kv_capacity_tokens == vllm_metrics.kv_capacity_tokens(text) == 1_048_576
    # V1 exports the new KV-usage name, not the old one
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert vllm_metrics.KV_CACHE_USAGE[0] in names
    assert set(vllm_metrics.REQUIRED) <= names


def test_the_sim_engine_reads_as_the_real_one():
    scheduler = Scheduler(kv_capacity_tokens=4096, block_size=16)
    metrics = EngineMetrics(scheduler, "m", {"gpu": "a100"})
    metrics.prompt_tokens.inc(7)
    metrics.generation_tokens.inc(3)
    load = vllm_metrics.parse_engine_metrics(metrics.render().decode())
    assert (load.prompt_tokens, load.generation_tokens, load.running, load.waiting) == (7, 3, 0, 0)
    assert load.kv_capacity_tokens == 4096
    real = {s.name for f in text_string_to_metric_families(RECORDED.read_text())
            for s in f.samples if s.name.startswith("vllm:")}
    sim = {s.name for f in text_string_to_metric_families(metrics.render().decode())
           for s in f.samples if s.name.startswith("vllm:")}
    # every name the sim exports that the daemon or profile reads, the real engine exports too
    read = set(vllm_metrics.REQUIRED) | {vllm_metrics.KV_CACHE_USAGE[0], vllm_metrics.CACHE_CONFIG}
    assert read <= sim and read <= real


def test_missing_names_are_named():
    with pytest.raises(vllm_metrics.EngineMetricsError) as err:
        vllm_metrics.parse_engine_metrics("# TYPE foo gauge\nfoo 1.0\n")
    message = str(err.value)
    assert "vllm:num_requests_running" in message and "vllm:kv_cache_usage_perc" in message


def test_labels_are_summed_over_engines():
    text = RECORDED.read_text()
    # a second data-parallel engine with the same numbers doubles the sums, not the KV use
    extra = "\n".join(line.replace('engine="0"', 'engine="1"') for line in text.splitlines()
                      if line.startswith(("vllm:num_requests", "vllm:prompt_tokens_total",
                                          "vllm:kv_cache_usage_perc")) and 'engine="0"' in line)
    doubled = text.replace("# TYPE vllm:num_requests_waiting", extra + "\n# TYPE "
                           "vllm:num_requests_waiting", 1) if extra else text
    one = vllm_metrics.parse_engine_metrics(text)
    two = vllm_metrics.parse_engine_metrics(doubled)
    assert extra, "the recording labels its series by engine"
    assert two.prompt_tokens == 2 * one.prompt_tokens
    assert two.kv_cache_usage == one.kv_cache_usage


class _Serve(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_fetch_and_the_daemons_gauges():
    _Serve.body = RECORDED.read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        load = vllm_metrics.fetch_engine_load(url)
        assert load is not None and load.generation_tokens > 0
        # a port nobody answers on is no load, not an error
        assert vllm_metrics.fetch_engine_load("http://127.0.0.1:9") is None
    finally:
        server.shutdown()
    metrics = DaemonMetrics()
    metrics.set_engine_loads(["a", "b"], [("a", load), ("a", load), ("a", None)])
    value = metrics.registry.get_sample_value
    assert value("coral_engine_generation_tokens", {"model": "a"}) == 2 * load.generation_tokens
    assert value("coral_engine_replicas_scraped", {"model": "a"}) == 2
    assert value("coral_engine_replicas_unscraped", {"model": "a"}) == 1
    assert value("coral_engine_requests_running", {"model": "b"}) == 0


def test_latency_histograms_are_in_the_real_engines_output():
    totals = vllm_metrics.histogram_totals(
        RECORDED.read_text(),
        (vllm_metrics.TTFT_SECONDS, vllm_metrics.QUEUE_TIME_SECONDS, "vllm:no_such_seconds"))
    assert totals[vllm_metrics.TTFT_SECONDS] == pytest.approx((26060.627678871155, 865.0))
    assert totals[vllm_metrics.QUEUE_TIME_SECONDS] == pytest.approx((13237.709368185024, 822.0))
    assert totals["vllm:no_such_seconds"] == (0.0, 0.0)
