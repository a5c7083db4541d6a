"""coral-hpc profile's open-loop generator (coral_hpc.profile.openloop) over real HTTP against a
server whose capacity is known by construction: it streams one request at a time, one token
every TOKEN_S, so it serves at most 1 / (OUTPUT_TOKENS x TOKEN_S) = 12.5 requests/s. Below that
every request is within the SLO; far above it the queue grows and the phase is missed, and the
generator gives up on requests past their deadline instead of waiting out the queue; the
capacity search lands between a rate the server holds easily and what it can sustain.

Wall-clock: the server's speed is its sleeps, not the host's; the generator's own work (a few
dozen requests a second) is a small share of one core on any host of this kind."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading

import pytest
from aiohttp import web

from coral_hpc.profile import openloop

TOKEN_S = 0.02
OUTPUT_TOKENS = 4
CAPACITY = 1 / (OUTPUT_TOKENS * TOKEN_S)  # 12.5 requests/s, one at a time
TTFT_S, TPOT_S = 0.5, 0.1


class OneAtATime:
    """An OpenAI-style streaming completions server that computes one request at a time."""

    def __init__(self) -> None:
        self.lock: asyncio.Lock | None = None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert self.lock is not None
        async with self.lock:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(body["max_tokens"]):
                await asyncio.sleep(TOKEN_S)
                chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": f"t{i}"}]}
                await response.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
                                     .encode())
            usage = {"id": "cmpl-1", "choices": [],
                     "usage": {"completion_tokens": body["max_tokens"]}}
            await response.write(f"data: {json.dumps(usage, separators=(',', ':'))}\n\n"
                                 "data: [DONE]\n\n".encode())
            return response


@pytest.fixture(scope="module")
def server_url():
    app_state = OneAtATime()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict = {}

    async def start() -> None:
        app_state.lock = asyncio.Lock()
        app = web.Application()
        app.router.add_post("/v1/completions", app_state.completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"http://127.0.0.1:{holder['port']}"
    asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _phase(url: str, rate: float, seconds: float, seed: str) -> openloop.Phase:
    return openloop.poisson_phase(url, "m", rate, input_tokens=8, output_tokens=OUTPUT_TOKENS,
                                  ttft_s=TTFT_S, tpot_s=TPOT_S, seconds=seconds, seed=seed)


def test_well_below_capacity_every_request_is_within(server_url):
    phase = _phase(server_url, CAPACITY / 6, 4.0, "low")
    assert len(phase.timings) >= 3 and phase.failed == 0
    assert phase.within(TTFT_S, TPOT_S) == 1.0
    assert phase.met(TTFT_S, TPOT_S)
    # TPOT is the gap between the server's tokens, not the first token's wait nor the usage
    # chunk after the last one (either would move it by 5 ms or more). The typical request
    # shows that to the millisecond. One request's mean over its 3 gaps can also carry a pause
    # of this process (a garbage collection, the host's scheduler) that server and client
    # share, so each request on its own is held to the SLO above, not to the server's sleep.
    tpots = [t.tpot_s for t in phase.timings]
    assert statistics.median(tpots) == pytest.approx(TOKEN_S, abs=0.003)


def test_far_above_capacity_the_phase_is_missed_and_ends_near_its_last_arrival(server_url):
    seconds = 3.0
    phase = _phase(server_url, CAPACITY * 2.5, seconds, "high")
    assert phase.within(TTFT_S, TPOT_S) < openloop.GOAL
    assert not phase.met(TTFT_S, TPOT_S)
    deadline = openloop.request_deadline(TTFT_S, TPOT_S, OUTPUT_TOKENS)
    assert phase.failed > 0  # the queued ones past their deadline
    assert phase.wall_s < seconds + deadline + 2.0


def test_the_search_finds_a_rate_between_an_easy_one_and_what_the_server_sustains(server_url):
    seconds = 5.0

    def met_at(rate: float) -> bool:
        return _phase(server_url, rate, seconds, f"search-{rate:.3f}").met(TTFT_S, TPOT_S)

    search = openloop.search_capacity(met_at, CAPACITY / 3, factor=1.5, bisections=1)
    # a queue of TTFT_S x CAPACITY requests may build over a phase without a miss
    sustainable = CAPACITY + TTFT_S * CAPACITY / seconds
    assert CAPACITY / 3 <= search.capacity <= sustainable, search.tried
