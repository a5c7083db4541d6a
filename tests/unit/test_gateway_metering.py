"""Demand meter: EWMA and peak-window rates on a fake clock; rejected requests are demand."""

from __future__ import annotations

import math

from coral_hpc.gateway.metering import DemandMeter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ewma_converges_to_a_steady_rate_and_peak_finds_the_burst():
    clock = Clock()
    meter = DemandMeter(ewma_tau_s=10, peak_window_s=120, peak_bin_s=5, clock=clock)
    # 60 s at 4 req/s, then a 5 s burst at 20 req/s, then 30 s at 4 req/s
    for second in range(95):
        rate = 20 if 60 <= second < 65 else 4
        for i in range(rate):
            clock.now = 1000 + second + i / rate
            meter.record_arrival("m", "k")
    clock.now = 1095.0
    snap = meter.snapshot()["models"]["m"]
    assert snap["requests_total"] == 60 * 4 + 5 * 20 + 30 * 4
    assert snap["peak_rps"] == 20.0
    # the EWMA of per-second counts, started at 0: steady part + what is left of the burst
    expected = 4 * (1 - math.exp(-95 / 10)) + 16 * sum(math.exp(-(95 - s - 1) / 10) * (1 - math.exp(-1 / 10))
                            for s in range(60, 65))
    assert abs(snap["ewma_rps"] - expected) < 2e-6
    assert 4.0 < snap["ewma_rps"] < 4.5     # 30 s (3 time constants) after the burst


def test_idle_time_decays_the_ewma():
    clock = Clock()
    meter = DemandMeter(ewma_tau_s=10, clock=clock)
    for i in range(10):
        clock.now = 1000 + i * 0.1
        meter.record_arrival("m", "k")
    clock.now = 1001.0
    first = meter.snapshot()["models"]["m"]["ewma_rps"]
    clock.now = 1031.0
    later = meter.snapshot()["models"]["m"]["ewma_rps"]
    assert math.isclose(later, first * math.exp(-3), rel_tol=1e-3)


def test_rejected_requests_count_as_demand_and_tokens_give_the_mix():
    clock = Clock()
    meter = DemandMeter(clock=clock)
    meter.record_arrival("m", "alice")
    meter.record_arrival("m", "alice", rejected=True)
    meter.record_arrival("m", "bob")
    meter.record_tokens("m", "alice", prompt=100, generated=20, estimated=False)
    meter.record_tokens("m", "bob", prompt=300, generated=40, estimated=True)
    snap = meter.snapshot(ready=lambda m: 0, models=("m", "idle"))
    m = snap["models"]["m"]
    assert (m["requests_total"], m["rejected_total"]) == (3, 1)
    assert (m["mean_prompt_tokens"], m["mean_generated_tokens"]) == (200, 30)
    assert m["estimated_usage_total"] == 1 and m["ready_replicas"] == 0
    assert snap["models"]["idle"]["requests_total"] == 0
    assert snap["keys"]["alice"] == {"requests_total": 2, "rejected_total": 1,
                                     "prompt_tokens_total": 100, "generated_tokens_total": 20}
