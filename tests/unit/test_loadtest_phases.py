"""The pieces of the real-engine SLO check that decide what is measured
(coral_hpc.loadtest.phases and .host, which bench/slo_vllm.py and tests/vllm/test_serve_vllm.py
read): which measured figure is a model's capacity, how its demand is written into the
deployment, how long a phase runs, what the engine and the host saw during it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from coral_hpc.config import load_deployment
from coral_hpc.loadtest.host import (
    busiest_processes,
    host_cpu_share,
    host_cpu_ticks,
    process_cpu_ticks,
)
from coral_hpc.loadtest.phases import (
    engine_latency_means,
    engine_latency_totals,
    measured_capacity,
    phase_row,
    with_demand,
)
from coral_hpc.profile.openloop import phase_seconds
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "vllm-cpu.yaml"
PROFILES = REPO / "examples" / "vllm-cpu.profiles"
LAYOUT_FILES = ("coral-tiny-llama__a100__tp1.yaml",
                "pipelines/coral-tiny-llama-long__v100__tp1__pp2.yaml",
                "pipelines/coral-tiny-qwen2-long__v100+a100__tp1__pp2.yaml")


def test_capacity_is_the_point_at_the_models_mix_and_slo(tmp_path):
    deployment = load_deployment(EXAMPLE)
    files = [PROFILES / name for name in LAYOUT_FILES]
    expected = {yaml.safe_load(f.read_text())["model"]:
                yaml.safe_load(f.read_text())["throughput"][0]["requests_per_s"] for f in files}
    assert measured_capacity(files, deployment) == expected
    # a point at another SLO (or mix) is not the model's capacity, wherever it stands
    profile = yaml.safe_load(files[0].read_text())
    other = dict(profile["throughput"][0], tpot_s=0.05, requests_per_s=1000.0)
    profile["throughput"] = [other, *profile["throughput"]]
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    assert measured_capacity([path], deployment) == {profile["model"]: expected[profile["model"]]}


def test_a_profile_without_the_models_point_is_an_error(tmp_path):
    deployment = load_deployment(EXAMPLE)
    profile = yaml.safe_load((PROFILES / LAYOUT_FILES[0]).read_text())
    profile["throughput"][0]["input_tokens"] += 1
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    with pytest.raises(ValueError, match=r"profile\.yaml: no throughput point for tiny-chat"):
        measured_capacity([path], deployment)


def test_with_demand_sets_only_the_named_models(tmp_path: Path):
    text = with_demand(EXAMPLE.read_text(), {"tiny-chat": 1.234, "tiny-qwen2": 0.5})
    path = tmp_path / "models.yaml"
    path.write_text(text)
    before, after = load_deployment(EXAMPLE), load_deployment(path)
    assert after.model("tiny-chat").demand_rps == 1.234
    assert after.model("tiny-qwen2").demand_rps == 0.5
    assert after.model("tiny-llama").demand_rps == before.model("tiny-llama").demand_rps
    assert after.model("tiny-chat").vllm_args == before.model("tiny-chat").vllm_args


def test_a_phase_at_a_low_rate_runs_long_enough_for_its_requests():
    assert phase_seconds(10.0, 20.0) == 20.0
    assert phase_seconds(1.0, 20.0) == 40.0
    assert phase_seconds(0.0, 20.0) == 20.0


def test_a_phase_row_counts_failures_as_misses_and_an_embedding_model_is_refused():
    deployment = load_deployment(EXAMPLE)
    model = deployment.model("tiny-chat")
    ttft, tpot = model.slo.ttft_s, model.slo.tpot_s
    runs = [(ttft / 2, tpot / 2), (ttft * 2, tpot / 2), (ttft / 2, tpot * 2), None]
    row = phase_row(model, 2.0, runs)
    assert (row["requests"], row["failed"], row["within_slo"]) == (4, 1, 0.25)
    assert len(row["ttft_ms"]) == len(row["tpot_ms"]) == 3  # p50, p90, p99 of the 3 answered
    embedding = model.model_copy(update={"slo": model.slo.model_copy(
        update={"ttft_s": None, "tpot_s": None, "latency_ms": 100.0})})
    with pytest.raises(ValueError, match="tiny-chat.*no ttft_s or tpot_s"):
        phase_row(embedding, 2.0, runs)


def _serve_metrics(texts: list[str]):
    """A local HTTP server answering ``/metrics`` with each of ``texts`` in turn (real HTTP, the
    recorded engine's text): the engine the SLO check reads its histograms from."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server name
            body = texts.pop(0).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_engine_means_are_the_histograms_growth_over_the_phase():
    before_text = (REPO / "tests" / "data" / "vllm" / "metrics-vllm-0.32.0-cpu.txt").read_text()
    # the same engine after a phase of 10 requests: 3 s more TTFT in all, 1 s more queueing
    label = '{engine="0",model_name="tiny-llama"}'
    after_text = before_text
    for name, old, grown in (("time_to_first_token_seconds_sum", "26060.627678871155",
                              "26063.627678871155"),
                             ("time_to_first_token_seconds_count", "865.0", "875.0"),
                             ("request_queue_time_seconds_sum", "13237.709368185024",
                              "13238.709368185024")):
        line = f"vllm:{name}{label} {old}\n"
        assert before_text.count(line) == 1, line
        after_text = after_text.replace(line, f"vllm:{name}{label} {grown}\n")
    server = _serve_metrics([before_text, after_text])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        before, after = engine_latency_totals(url), engine_latency_totals(url)
    finally:
        server.shutdown()
    assert before["ttft"] == pytest.approx((26060.627678871155, 865.0))
    # queue time's count did not grow (no request left the queue): no mean, not a division by 0
    assert engine_latency_means(before, after) == {"ttft": 300.0, "queue": None}


def test_host_share_counts_busy_cores_and_stolen_time():
    # (busy, stolen, total) ticks on a 2-core host: 150 busy and 20 stolen of 200
    before, after = (1000, 10, 5000), (1150, 30, 5200)
    share = host_cpu_share(before, after)
    assert share["steal"] == 0.1
    assert share["cores_busy"] == round((os.cpu_count() or 1) * 150 / 200, 2)
    busy, steal, total = host_cpu_ticks()
    assert 0 <= steal <= total and 0 < busy <= total


def test_busiest_processes_rank_by_cores_used_over_the_phase():
    hz = os.sysconf("SC_CLK_TCK")
    before = {1: (0, "idle: a"), 2: (10 * hz, "worker: b"), 3: (0, "gone: c")}
    # over 10 s: 2 used 8 s (0.8 cores), 4 started and used 1 s, 1 used nothing; 3 ended
    after = {1: (0, "idle: a"), 2: (18 * hz, "worker: b"), 4: (1 * hz, "new: d")}
    assert busiest_processes(before, after, 10.0) == ["0.80 2 worker: b", "0.10 4 new: d"]
    assert busiest_processes(before, after, 10.0, top=1) == ["0.80 2 worker: b"]
    assert any(pid == os.getpid() for pid in process_cpu_ticks())
