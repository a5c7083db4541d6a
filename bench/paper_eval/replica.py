"""One replica of any role served in virtual time: the sim engine's scheduler and step times.

The same parts as ``tests/support/virtual_engine.py`` (the sim engine's
:class:`~coral_hpc.engine.batching.Scheduler` and :class:`~coral_hpc.engine.pipeline.PipelineClock`,
one step loop per pipeline stage, step times from :mod:`coral_solver.perf`), driven by a
discrete-event
loop, with what a disaggregated replica needs besides: each request may arrive with ``external``
prompt tokens whose KV a prefill replica computed (the decode role: admitted with them in the
cache, computing only the last prompt token, as vLLM's KV connector does), and the result is each
request's first- and last-token times, so a prefill replica's output can feed a decode one.

Step times are the sim engine's own (:meth:`~coral_hpc.engine.pipeline.StepModel.batch_times`:
a step's prompt chunks attend per sequence, Σ chunk·(computed + chunk/2)).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from coral_hpc.engine.batching import Batch, Scheduler, Sequence
from coral_hpc.engine.pipeline import Layout, PipelineClock, StepModel

#: The sim engine's (= vLLM's) scheduler defaults.
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Request:
    """One request as the replica sees it: when it arrives, its lengths, KV it brings along."""

    at: float
    prompt_tokens: int
    max_tokens: int
    external: int = 0  #: prompt tokens already in the KV cache (from a prefill replica)


@dataclass(frozen=True)
class Outcome:
    """When the replica produced a request's first and last token, and how many."""

    first_s: float
    last_s: float
    tokens: int


def stage_times(layout: Layout, batch: Batch, model: StepModel | None = None
                ) -> tuple[float, ...]:
    """Seconds each stage spends on ``batch``: the sim engine's ``StepModel.batch_times``
    (``model``: the layout's step model, when already built)."""
    return (model if model is not None else StepModel(layout)).batch_times(batch)


def serve(layout: Layout, requests: list[Request]) -> list[Outcome]:
    """Serve ``requests`` (sorted by arrival) on one replica of ``layout``; one outcome each.

    A request the KV cache could never hold is answered at its arrival with no tokens."""
    model = StepModel(layout)
    engines = layout.stages
    scheduler = Scheduler(
        kv_capacity_tokens=model.kv_capacity_tokens(),
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        num_engines=engines,
    )
    clock = PipelineClock(engines)
    busy: list[Batch | None] = [None] * engines
    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, index); 0 = step end
    order = 0
    for i, r in enumerate(requests):
        order += 1
        heapq.heappush(events, (r.at, order, 1, i))
    index_of: dict[int, int] = {}
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
            end = clock.reserve(now, stage_times(layout, batch, model))
            order += 1
            heapq.heappush(events, (end, order, 0, e))

    while events:
        now, _, kind, index = heapq.heappop(events)
        if kind == 1:
            r = requests[index]
            seq = Sequence(str(index), r.prompt_tokens, r.max_tokens, external=r.external)
            if not scheduler.fits(seq.total_tokens):
                first[index] = last[index] = now
                produced[index] = 0
                continue
            scheduler.add(seq)
            index_of[id(seq)] = index
        else:
            batch, busy[index] = busy[index], None
            for event in scheduler.complete(batch):
                i = index_of[id(event.seq)]
                first.setdefault(i, now)
                last[i] = now
                produced[i] = event.index + 1
        start_idle(now)
    return [Outcome(first[i], last[i], produced[i]) for i in range(len(requests))]
