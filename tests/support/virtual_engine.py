"""The sim engine's own scheduler and step times driven in *virtual* time: what the engine would
measure with an infinitely fast CPU and network.

The HTTP replay (:mod:`tests.support.replay`) measures the real processes on a small machine, where
the gateway, the client and the engines share two cores. This module runs the very same
:class:`coral_hpc.engine.batching.Scheduler`, :class:`coral_hpc.engine.pipeline.PipelineClock` and
:class:`coral_hpc.engine.pipeline.StepModel` (the step latencies from :mod:`coral_solver.perf`) as a
discrete-event simulation, mirroring :class:`coral_hpc.engine.runner.SimEngine`: one step loop per
virtual engine (one per pipeline stage), a step booked on every stage in turn, its tokens delivered
when it leaves the last stage. The difference between the two is what the machine adds; where
both miss an SLO the disagreement is between the engine and the plan, not the test rig.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from coral_hpc.engine.batching import Batch, Scheduler, Sequence
from coral_hpc.engine.pipeline import Layout, PipelineClock, StepModel
from coral_solver.types import PlanRow
from tests.support.replay import ReplaySummary, RequestResult, Slo
from tests.support.trace_slice import Workload


@dataclass(frozen=True)
class EngineShape:
    """What one replica runs and the vLLM scheduler limits it was started with (sim defaults)."""

    layout: Layout
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    speed: float = 1.0  #: ``--sim-speed``: every step takes 1/speed of the modelled time


def simulate(shape: EngineShape, workload: Workload) -> list[RequestResult]:
    """Serve ``workload`` on one replica in virtual time; one result per arrival, in order."""
    model = StepModel(shape.layout, shape.gpu_memory_utilization)
    scheduler = Scheduler(kv_capacity_tokens=model.kv_capacity_tokens(),
                          block_size=shape.block_size, max_num_seqs=shape.max_num_seqs,
                          max_num_batched_tokens=shape.max_num_batched_tokens,
                          num_engines=shape.layout.stages)
    clock = PipelineClock(shape.layout.stages)
    engines = shape.layout.stages
    busy: list[Batch | None] = [None] * engines
    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, index); kind 0 = step end
    order = 0
    for i, arrival in enumerate(workload.arrivals):
        heapq.heappush(events, (arrival.at, order := order + 1, 1, i))
    seqs: dict[int, Sequence] = {}
    index_of: dict[int, int] = {}  # id(seq) -> arrival index
    first: dict[int, float] = {}
    last: dict[int, float] = {}

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
            end = clock.reserve(now, [t / shape.speed for t in times])
            heapq.heappush(events, (end, order := order + 1, 0, e))

    while events:
        now, _, kind, index = heapq.heappop(events)
        if kind == 1:
            arrival = workload.arrivals[index]
            seq = Sequence(str(index), arrival.prompt_tokens, arrival.max_tokens)
            scheduler.add(seq)
            seqs[index] = seq
            index_of[id(seq)] = index
        else:
            batch, busy[index] = busy[index], None
            for event in scheduler.complete(batch):
                i = index_of[id(event.seq)]
                first.setdefault(i, now)
                last[i] = now
        start_idle(now)

    results = []
    for i, arrival in enumerate(workload.arrivals):
        n = seqs[i].generated
        results.append(RequestResult(
            at=arrival.at, prompt_tokens=arrival.prompt_tokens, max_tokens=arrival.max_tokens,
            send_lag_s=0.0, status=200, ttft_s=first[i] - arrival.at,
            tpot_s=(last[i] - first[i]) / (n - 1) if n > 1 else None,
            e2e_s=last[i] - arrival.at, completion_tokens=n, usage_prompt_tokens=arrival.prompt_tokens,
        ))
    return results


def simulate_replicas(shapes: Seq[tuple[EngineShape, float]], model: str, workload: Workload,
                      slo: Slo) -> ReplaySummary:
    """Split ``workload`` over replicas in proportion to their weights (the gateway's planned
    shares, dealt out in arrival order by smooth weighted round robin) and serve each in virtual
    time."""
    total = sum(w for _, w in shapes)
    credit = [0.0] * len(shapes)
    assigned: list[list[int]] = [[] for _ in shapes]
    for i in range(len(workload.arrivals)):
        for k, (_, w) in enumerate(shapes):
            credit[k] += w
        k = max(range(len(shapes)), key=lambda j: credit[j])
        credit[k] -= total
        assigned[k].append(i)
    results: list[RequestResult | None] = [None] * len(workload.arrivals)
    for (shape, _), picks in zip(shapes, assigned):
        if not picks:
            continue
        part = Workload(tuple(workload.arrivals[i] for i in picks), workload.duration_s,
                        workload.source)
        for i, result in zip(picks, simulate(shape, part)):
            results[i] = result
    return ReplaySummary(model, slo, workload.source + " [virtual time]", workload.rate_rps,
                         workload.duration_s, tuple(r for r in results if r is not None))


def shapes_of(rows: Seq[PlanRow], arch: str, speed: float = 1.0) -> list[tuple[EngineShape, float]]:
    """(engine shape, routing weight) of every replica the plan rows start, as the stack does."""
    return [
        (EngineShape(Layout(arch, row.template.tp,
                            tuple(s.gpu_type for s in row.template.stages),
                            tuple(s.layers for s in row.template.stages)), speed=speed),
         row.throughput)
        for row in rows for _ in range(row.count)
    ]
