"""The gateway's wake helpers: one wake file per model while it wakes, Retry-After from the
daemon's estimate, the client's header, and a hold that ticks and gives up."""

from __future__ import annotations

import asyncio
import json
import socket

from coral_hpc.gateway.http_server import Request, Response, StreamResponse
from coral_hpc.gateway.proxy import Gateway, GatewaySettings
from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, WakeInfo, write_routing_table
from coral_hpc.gateway.wake import (
    WakePolicy,
    WakeSignal,
    chosen_mode,
    clear_wake,
    hold,
    pending_wakes,
    retry_after_s,
)


def test_one_wake_file_per_model_per_resignal_period(tmp_path):
    now = [100.0]
    signal = WakeSignal(tmp_path / "wake", clock=lambda: now[0])
    assert [signal.ask("m") for _ in range(20)] == [True] + [False] * 19
    assert signal.ask("other")
    assert set(pending_wakes(tmp_path / "wake")) == {"m", "other"}
    assert oct((tmp_path / "wake").stat().st_mode & 0o777) == "0o700"
    clear_wake(tmp_path / "wake", "m")
    now[0] += 5.0
    assert signal.ask("m") and signal.signals == 3


def test_retry_after_follows_the_estimate_within_bounds():
    assert retry_after_s(None, 10, now=0) == 10
    assert retry_after_s(WakeInfo("cold", 95.2), 10, now=0) == 96
    assert retry_after_s(WakeInfo("waking", 95, ready_by=1000.0), 10, now=700.0) == 300
    assert retry_after_s(WakeInfo("waking", 95, ready_by=10.0), 10, now=700.0) == 1
    assert retry_after_s(WakeInfo("waking", 95, ready_by=1e9), 10, now=0) == 3600


def test_the_client_header_chooses_the_mode():
    policy = WakePolicy("hold", 30)
    assert chosen_mode(policy, {"coral-wake": "Reject"}) == "reject"
    assert chosen_mode(policy, {"coral-wake": "later"}) == "hold"
    assert chosen_mode(WakePolicy("reject", 30), {}) == "reject"


def test_hold_ticks_at_once_and_then_every_tick_and_returns_what_it_found():
    ticks = []
    found = iter([None] * 6 + ["replica"])

    async def tick():
        ticks.append(asyncio.get_running_loop().time())

    result = asyncio.run(hold(lambda: next(found), 10.0, tick=tick, tick_s=0.5))
    # six empty looks take at least 1.5 s: a tick at once, then none closer than 0.5 s
    assert result == "replica" and len(ticks) >= 2
    assert all(b - a >= 0.49 for a, b in zip(ticks, ticks[1:]))


def test_hold_gives_up_at_the_timeout_or_when_the_wake_is_impossible():
    assert asyncio.run(hold(lambda: None, 0.3)) is None
    assert asyncio.run(hold(lambda: None, 30.0, gone=lambda: True)) is None


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_held_stream_whose_replica_is_found_at_the_first_look_is_answered_as_any_other(
        tmp_path):
    # The routing table brings a replica between the request's first pick and the hold's first
    # look: no stream head went out, so the request is answered as any other (here its only
    # replica refuses connections: a plain 502), not through a head that was never sent.
    table = tmp_path / "table.json"
    url = f"http://127.0.0.1:{_closed_port()}"
    write_routing_table(table, RoutingTable(1, {"m": (ReplicaRoute("old", url, 1.0),)}))
    gw = Gateway(GatewaySettings(models=("m",), table_path=table, max_retries=0,
                                 wake={"m": WakePolicy("hold", 5.0)}))
    gw.files.reload()
    gw.router.replicas("m")[0].healthy = False  # in the table but out: no catch-up on arrival
    write_routing_table(table, RoutingTable(2, {"m": (ReplicaRoute("new", url, 1.0),)}))
    request = Request("POST", "/v1/chat/completions", {}, "127.0.0.1", None)  # type: ignore
    request.body = json.dumps({"model": "m", "stream": True, "max_tokens": 4,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()

    async def main() -> Response | StreamResponse:
        try:
            return await gw.request_path.handle(request)
        finally:
            await gw.replicas.stop()

    answer = asyncio.run(main())
    assert isinstance(answer, Response) and answer.status == 502, answer
    assert b"1 replica(s) of 'm' failed" in answer.body
