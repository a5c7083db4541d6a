"""The sim engine's step loop on a real event loop, with millisecond step times."""

from __future__ import annotations

import asyncio

from coral_hpc.engine.runner import SimEngine
from coral_replica_sim.batching import Scheduler


def _constant(seconds: float, stages: int = 1):
    def stage_times(batch):
        return (seconds,) * stages

    return stage_times


async def _tokens(handle) -> list[int | None]:
    got = []
    while True:
        event = await handle.events.get()
        got.append(None if event is None else event.index)
        if event is None or event.finished:
            return got


def test_every_request_gets_exactly_its_tokens_and_the_engine_goes_idle():
    async def main():
        engine = SimEngine(Scheduler(kv_capacity_tokens=4096), _constant(0.001))
        engine.start()
        handles = [engine.submit(10, n) for n in (1, 3, 7)]
        results = await asyncio.gather(*(_tokens(h) for h in handles))
        assert await engine.wait_idle(1.0)
        await engine.stop()
        return results

    assert asyncio.run(main()) == [[0], [0, 1, 2], list(range(7))]


def test_queued_request_starts_only_after_kv_frees():
    async def main():
        # 4 blocks of 16 tokens; each prompt takes 3: the second waits for the first.
        engine = SimEngine(Scheduler(kv_capacity_tokens=64), _constant(0.002))
        engine.start()
        first, second = engine.submit(40, 8), engine.submit(40, 8)  # 3 blocks each at most
        await asyncio.sleep(0)
        first_done = asyncio.create_task(_tokens(first))
        await _tokens(second)
        assert first_done.done()
        assert second.first_token_at >= first.finished_at
        await engine.stop()

    asyncio.run(main())


def test_abort_frees_the_cache_for_the_next_request_and_ends_the_stream():
    async def main():
        # 4 blocks of 16 tokens; the hog's prompt takes 3 and it would run 8 steps of 100 ms.
        engine = SimEngine(Scheduler(kv_capacity_tokens=64), _constant(0.1))
        engine.start()
        hog, queued = engine.submit(40, 8), engine.submit(40, 2)
        await hog.events.get()  # hog is running
        assert engine.scheduler.num_waiting == 1
        engine.abort(hog)
        assert await _tokens(queued) == [0, 1]
        assert (await _tokens(hog))[-1] is None  # its stream ends with the abort marker
        assert queued.finished_at - hog.first_token_at < 0.5  # did not wait for the hog's 7 steps
        assert await engine.wait_idle(1.0)
        await engine.stop()

    asyncio.run(main())


def test_speed_divides_the_step_time():
    async def main(speed: float) -> float:
        engine = SimEngine(Scheduler(kv_capacity_tokens=4096), _constant(0.02), speed=speed)
        engine.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await _tokens(engine.submit(4, 10))
        elapsed = loop.time() - t0
        await engine.stop()
        return elapsed

    # 10 steps of 20 ms: 0.2 s at speed 1; at speed 10 one tenth of that. The sim can only be
    # late, never early, so the lower bounds are exact.
    slow, fast = asyncio.run(main(1.0)), asyncio.run(main(10.0))
    assert slow >= 0.2 and fast >= 0.02
    assert fast < slow / 3


def test_pipeline_stages_overlap_micro_batches_of_the_virtual_engines():
    """Two stages, each 2 ms per decoding sequence in the batch (2 ms for the prompt step).
    Eight 20-token requests: the prompt step, then 19 decode steps.
    one engine: batches of 8 take 16 + 16 ms -> 4 ms + 19 x 32 ms = 0.61 s;
    two engines (vLLM's PP): batches of 4 take 8 + 8 ms, and while one is on stage 2 the other
    is on stage 1, so each engine gets a token every 16 ms -> about 4 + 19 x 16 = 0.31 s."""

    def per_seq(batch):
        return (0.002 * max(batch.decode_seqs, 1),) * 2

    async def main(engines: int) -> float:
        engine = SimEngine(Scheduler(kv_capacity_tokens=4096, num_engines=engines), per_seq)
        engine.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*(_tokens(engine.submit(4, 20)) for _ in range(8)))
        elapsed = loop.time() - t0
        await engine.stop()
        return elapsed

    one, two = asyncio.run(main(1)), asyncio.run(main(2))
    assert one >= 0.612
    assert 0.308 <= two < one * 0.7, (one, two)
