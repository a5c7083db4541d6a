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


# --------------------------------------------------------------------------- arrivals per window


def _meter_at(start: float, window_s: float = 10.0, kept: int = 5):
    wall = VirtualClock(start)
    return wall, DemandMeter(clock=wall, window_s=window_s, windows_kept=kept, wall=wall)


def test_arrivals_are_counted_per_closed_window_with_empty_windows_as_zeros():
    wall, meter = _meter_at(1000.0)
    wall.advance(1.0)
    for _ in range(3):
        meter.record_arrival("m", "k")
    wall.advance(10.0)  # 1011: window [1010, 1020)
    meter.record_arrival("m", "k", rejected=True)  # a rejected request is demand too
    wall.advance(25.0)  # 1036: [1020, 1030) had nothing; [1030, 1040) in progress
    meter.record_arrival("m", "k")
    snap = meter.snapshot(models=("m", "idle"))
    assert snap["window_s"] == 10.0 and snap["windows_end"] == 1030.0
    # the window the meter started in is never counted, even when it began that instant
    assert snap["models"]["m"]["arrival_windows"] == [1, 0]
    assert snap["models"]["idle"]["arrival_windows"] == [0, 0]


def test_the_window_the_gateway_started_in_is_not_counted():
    wall, meter = _meter_at(1005.0)  # halfway through [1000, 1010)
    meter.record_arrival("m", "k")
    wall.advance(10.0)  # 1015
    meter.record_arrival("m", "k")
    meter.record_arrival("m", "k")
    wall.advance(10.0)  # 1025
    assert meter.snapshot()["models"]["m"]["arrival_windows"] == [2]


def test_a_burst_and_a_long_silence_keep_only_the_newest_windows():
    wall, meter = _meter_at(995.0, kept=3)  # first counted window: [1000, 1010)
    wall.advance(5.0)
    for _ in range(50):
        meter.record_arrival("m", "k")  # a burst in [1000, 1010)
    wall.advance(20.0)  # 1020
    assert meter.snapshot()["models"]["m"]["arrival_windows"] == [50, 0]
    wall.advance(3600.0)  # an hour of nothing
    snap = meter.snapshot()
    assert snap["models"]["m"]["arrival_windows"] == [0, 0, 0]
    assert snap["windows_end"] == 4620.0


def test_a_wall_clock_set_back_counts_into_the_window_in_progress():
    wall, meter = _meter_at(995.0)
    wall.advance(20.0)  # 1015
    meter.record_arrival("m", "k")
    wall.advance(-30.0)  # 985: NTP stepped the clock back
    meter.record_arrival("m", "k")
    wall.advance(40.0)  # 1025
    assert meter.snapshot()["models"]["m"]["arrival_windows"] == [0, 2]


def test_the_daemon_reads_the_newest_windows_and_lets_a_silent_gateways_age_out():
    from coral_hpc.daemon.scrape import DemandScraper

    wall, meter = _meter_at(995.0, kept=20)
    for second in range(1000, 1100):
        wall.advance(second + 0.5 - wall())
        for _ in range(3 if second < 1050 else 1):
            meter.record_arrival("m", "k")
    wall.advance(1100.0 - wall())
    scraper = DemandScraper()
    scraper.intervals(meter.snapshot(models=("m",)), wall(), ["m"])
    found = scraper.windows_at(1100.0, span_s=200.0)["m"]
    assert (found.window_s, found.end) == (10.0, 1100.0)
    assert found.counts == (30,) * 5 + (10,) * 5
    # the gateway stopped answering: its last windows age out of the span
    assert scraper.windows_at(1250.0, span_s=200.0)["m"].counts == (10,) * 5
    assert scraper.windows_at(1400.0, span_s=200.0)["m"].counts == ()
    # a gateway that counts no windows (an older one) leaves none
    scraper.intervals({"models": {"m": {"requests_total": 5}}}, 1200.0, ["m"])
    assert scraper.windows == {}
