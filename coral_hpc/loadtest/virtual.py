"""The sim engine's own scheduler and step times driven in *virtual* time: what the engine would
measure with an infinitely fast CPU and network.

The HTTP replay (:mod:`coral_hpc.loadtest.replay`) measures the real processes on a small
machine, where the gateway, the client and the engines share two cores. This module serves the same
requests through :mod:`coral_replica_sim.replica`: the very same scheduler, pipeline clock and
step model (the step latencies from :mod:`coral_solver.perf`) as a discrete-event simulation,
mirroring :class:`coral_hpc.engine.runner.SimEngine`. The difference between the two is what
the machine adds; where both miss an SLO the disagreement is between the engine and the plan,
not the test rig.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from coral_hpc.loadtest.replay import ReplaySummary, RequestResult, Slo
from coral_hpc.loadtest.workload import Workload
from coral_replica_sim.replica import EngineLimits, Layout, Request, serve
from coral_solver.types import PlanRow


@dataclass(frozen=True)
class EngineShape:
    """What one replica runs and the vLLM scheduler limits it was started with (sim defaults)."""

    layout: Layout
    limits: EngineLimits = EngineLimits()


def simulate(shape: EngineShape, workload: Workload) -> list[RequestResult]:
    """Serve ``workload`` on one replica in virtual time; one result per arrival, in order.

    A request the KV cache could never hold gets the sim engine's answer, 400 at its arrival."""
    outcomes = serve(shape.layout,
                     [Request(a.at, a.prompt_tokens, a.max_tokens) for a in workload.arrivals],
                     shape.limits)
    results = []
    for arrival, o in zip(workload.arrivals, outcomes):
        if o.refused:
            results.append(RequestResult(
                at=arrival.at, prompt_tokens=arrival.prompt_tokens, max_tokens=arrival.max_tokens,
                send_lag_s=0.0, status=400, error="longer than the replica's KV cache"))
            continue
        n = o.tokens
        results.append(RequestResult(
            at=arrival.at, prompt_tokens=arrival.prompt_tokens, max_tokens=arrival.max_tokens,
            send_lag_s=0.0, status=200, ttft_s=o.first_s - arrival.at,
            tpot_s=(o.last_s - o.first_s) / (n - 1) if n > 1 else None,
            e2e_s=o.last_s - arrival.at, completion_tokens=n,
            usage_prompt_tokens=arrival.prompt_tokens,
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
                            tuple(s.layers for s in row.template.stages)),
                     EngineLimits(speed=speed)),
         row.throughput)
        for row in rows for _ in range(row.count)
    ]
