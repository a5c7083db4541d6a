"""Demand meter: cumulative counts per model and key; rejected requests are demand."""

from __future__ import annotations

from coral_hpc.gateway.metering import DemandMeter
from tests.support.virtual_time import VirtualClock


def test_rejected_requests_count_as_demand_and_tokens_give_the_mix():
    clock = VirtualClock()
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
