"""One sim-engine replica served in *virtual* time: what it would measure with an infinitely fast
CPU and network.

The very same parts as :class:`coral_hpc.engine.runner.SimEngine` — the
:class:`~coral_hpc.engine.batching.Scheduler`, the :class:`~coral_hpc.engine.pipeline.PipelineClock`
and the :class:`~coral_hpc.engine.pipeline.StepModel` (step latencies from :mod:`coral_solver.perf`)
— driven by a discrete-event loop instead of a clock: one step loop per pipeline stage, a step
booked on every stage in turn, its tokens delivered when it leaves the last stage.

The paper comparison (``bench/paper_eval``) serves its trace samples with it, and the tests'
virtual replay (``tests/support/virtual_engine.py``) compares it with the real processes. A
request may arrive with ``external`` prompt tokens whose KV a prefill replica computed (the decode
role: admitted with them in the cache, as vLLM's KV connector loads them).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from coral_hpc.engine.batching import DEFAULT_BLOCK_SIZE, Batch, Scheduler, Sequence
from coral_hpc.engine.pipeline import Layout, PipelineClock, StepModel


@dataclass(frozen=True)
class EngineLimits:
    """The vLLM scheduler limits a replica was started with (the sim engine's = vLLM's defaults),
    and ``--sim-speed``: every step takes 1/speed of the modelled time."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = DEFAULT_BLOCK_SIZE
    gpu_memory_utilization: float = 0.9
    speed: float = 1.0


@dataclass(frozen=True)
class Request:
    """One request as the replica sees it: when it arrives, its lengths, KV it brings along."""

    at: float
    prompt_tokens: int
    max_tokens: int
    external: int = 0  #: prompt tokens already in the KV cache (from a prefill replica)


@dataclass(frozen=True)
class Outcome:
    """When the replica produced a request's first and last token, and how many (0: refused at
    arrival, because its prompt and output could never fit the KV cache — the sim engine's 400)."""

    first_s: float
    last_s: float
    tokens: int

    @property
    def refused(self) -> bool:
        return self.tokens == 0


def serve(layout: Layout, requests: list[Request],
          limits: EngineLimits = EngineLimits()) -> list[Outcome]:
    """Serve ``requests`` (sorted by arrival) on one replica of ``layout``; one outcome each, in
    order. A request the KV cache could never hold is answered at its arrival with no tokens."""
    model = StepModel(layout, limits.gpu_memory_utilization)
    engines = layout.stages
    scheduler = Scheduler(kv_capacity_tokens=model.kv_capacity_tokens(),
                          block_size=limits.block_size, max_num_seqs=limits.max_num_seqs,
                          max_num_batched_tokens=limits.max_num_batched_tokens,
                          num_engines=engines)
    clock = PipelineClock(engines)
    busy: list[Batch | None] = [None] * engines
    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, index); 0 = step end
    order = 0
    for i, request in enumerate(requests):
        heapq.heappush(events, (request.at, order := order + 1, 1, i))
    index_of: dict[int, int] = {}  # id(seq) -> request index
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    produced: dict[int, int] = {}

    def start_idle(now: float) -> None:
        nonlocal order
        for e in range(engines):
            if busy[e] is not None:
                continue
            batch = scheduler.schedule(e)
            if batch is None:
                continue
            busy[e] = batch
            times = model.batch_times(batch)
            if limits.speed != 1.0:
                times = tuple(t / limits.speed for t in times)
            end = clock.reserve(now, times)
            heapq.heappush(events, (end, order := order + 1, 0, e))

    while events:
        now, _, kind, index = heapq.heappop(events)
        if kind == 1:
            request = requests[index]
            seq = Sequence(str(index), request.prompt_tokens, request.max_tokens,
                           external=request.external)
            if not scheduler.fits(seq.total_tokens):
                first[index] = last[index] = now
                produced[index] = 0
                continue
            scheduler.add(seq)
            index_of[id(seq)] = index
        else:
            batch, busy[index] = busy[index], None
            # a completion event is pushed only for an engine that took a batch (above)
            assert batch is not None
            for event in scheduler.complete(batch):
                i = index_of[id(event.seq)]
                first.setdefault(i, now)
                last[i] = now
                produced[i] = event.index + 1
        start_idle(now)
    return [Outcome(first[i], last[i], produced[i]) for i in range(len(requests))]
