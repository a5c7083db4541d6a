"""The gateway process counts arrivals per ``policy.demand_window_s`` window and sends them in
``/internal/demand``: what ``policy.plan_for: pNN`` is taken of. A real gateway on loopback with
1-s windows; the only model has no replica, so every request is a 503 — demand all the same."""

from __future__ import annotations

import time

import httpx
import yaml

from harness.gateway import start_gateway, write_models_yaml, write_table

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_arrivals_per_window_reach_the_daemons_endpoint(tmp_path):
    models = write_models_yaml(tmp_path, ["m"])
    data = yaml.safe_load(models.read_text())
    data["policy"] = {"plan_for": "p95", "demand_window_s": 1, "replan_interval_s": 30}
    models.write_text(yaml.safe_dump(data))
    table = tmp_path / "routing-table.json"
    write_table(table, 1, {"m": []})
    gateway = start_gateway(tmp_path, models, table)
    try:
        first = httpx.get(gateway.url + "/internal/demand").json()
        assert first["window_s"] == 1.0
        # the gateway keeps 30 one-second windows: the re-plan interval
        time.sleep(1.2)  # past the window the gateway started in, which it does not count
        for _ in range(7):
            assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT,
                              timeout=10).status_code == 503
        time.sleep(2.2)  # the burst's window closed; at least one empty one after it
        snap = httpx.get(gateway.url + "/internal/demand").json()
    finally:
        gateway.stop()
    windows = snap["models"]["m"]["arrival_windows"]
    assert sum(windows) == 7 == snap["models"]["m"]["requests_total"]
    assert windows[-1] == 0 and len(windows) <= 30
    assert snap["windows_end"] > first["windows_end"]
