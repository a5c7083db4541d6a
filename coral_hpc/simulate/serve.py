"""A model's requests routed to a plan's replicas and served in virtual time.

* **Routing**: a model's requests go to its plan rows in proportion to their planned capacity
  (smooth weighted round robin, as the gateway's weights), and round robin over a row's replicas.
  With ``admission`` (the paper comparison's rule), when a plan serves less than the demand the
  gateway admits that share of the requests (evenly spread) and refuses the rest: refused
  requests count as missed. Without it (``coral-hpc simulate``: the gateway refuses only when
  no replica is READY), every request of a model with a replica is served.
* **Replica**: the sim engine's own scheduler (``coral_replica_sim.batching``: continuous batching,
  chunked prefill, KV-cache limit, preemption) and step times from :mod:`coral_solver.perf`,
  driven in virtual time (:func:`coral_replica_sim.replica.serve`). Replicas of one row
  receive statistically identical shares, so one per row is simulated and its figures count
  ``count`` times.
* **Disaggregated** models: every prefill replica is simulated, the KV hand-off takes
  :func:`coral_solver.perf_roles.kv_transfer_s`, then replica 0 of each decode row.
* **Within SLO**: a request whose TTFT and mean TPOT both meet the model's SLO. A request held
  while its model woke from zero (``ModelWorkload.waited``) counts its wait in its TTFT.

Because replica latencies come from the planner's own performance model, the SLO figures show
that plans keep their promises under the trace's burstiness (self-consistency), not that vLLM
would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coral_hpc.simulate.traces import ModelWorkload
from coral_replica_sim.replica import EngineLimits, Layout, Outcome, Request
from coral_replica_sim.replica import serve as _serve_replica
from coral_solver import catalog, perf, perf_roles
from coral_solver.types import ModelSpec, Plan, PlanRow, Template

#: The sim engine's (= vLLM's) scheduler limits, as every simulated replica starts.
LIMITS = EngineLimits()


def serve_replica(layout: Layout, requests: list[Request]) -> list[Outcome]:
    """Serve ``requests`` (sorted by arrival) on one replica of ``layout``; one outcome each.

    A request the KV cache could never hold is answered at its arrival with no tokens."""
    return _serve_replica(layout, requests, LIMITS)


def _same_gpu(gpu_type: str) -> str:
    return gpu_type


def _deal(weights: list[float], n: int) -> list[list[int]]:
    """Smooth weighted round robin: which of ``n`` requests (in order) goes to which weight."""
    total = sum(weights)
    credit = [0.0] * len(weights)
    out: list[list[int]] = [[] for _ in weights]
    for i in range(n):
        for k, w in enumerate(weights):
            credit[k] += w
        k = max(range(len(weights)), key=lambda j: credit[j])
        credit[k] -= total
        out[k].append(i)
    return out


def _layout(template: Template, arch: str, gpu_of: Callable[[str], str] = _same_gpu) -> Layout:
    """The engine layout of ``template``; ``gpu_of`` maps a stage's GPU type to the catalog's
    (the paper comparison's regional types, ``h100@east``, are H100s)."""
    return Layout(
        arch,
        template.tp,
        tuple(gpu_of(s.gpu_type) for s in template.stages),
        tuple(s.layers for s in template.stages),
    )


@dataclass
class Served:
    """What one model's requests of a window got (estimated over every replica)."""

    requests: int = 0
    output_tokens: int = 0
    good: float = 0.0
    good_output_tokens: float = 0.0
    refused: int = 0
    #: served requests over their TTFT / over their TPOT (a request may miss both): which
    #: objective a plan misses
    missed_ttft: float = 0.0
    missed_tpot: float = 0.0

    def count(
        self, ttft: float, tpot: float | None, tokens: int, model: ModelSpec, weight: float
    ) -> None:
        """Book one simulated request standing for ``weight`` requests."""
        if tokens > 0 and ttft <= model.ttft_s and (tpot is None or tpot <= model.tpot_s):
            self.good += weight
            self.good_output_tokens += weight * tokens
        if tokens > 0 and ttft > model.ttft_s:
            self.missed_ttft += weight
        if tokens > 0 and tpot is not None and tpot > model.tpot_s:
            self.missed_tpot += weight


#: Served windows already simulated: (layout, requests) -> outcomes. Methods often plan the same
#: rows (the greedy baselines coincide without disaggregation), and a replica's outcome depends
#: only on its layout and its requests, so each is simulated once per setup.
_SERVED: dict[tuple, list] = {}


def _serve(layout: Layout, requests: list[Request]) -> list[Outcome]:
    key = (layout, tuple(requests))
    if key not in _SERVED:
        _SERVED[key] = serve_replica(layout, requests)
    return _SERVED[key]


def _tpot(o: Outcome) -> float | None:
    return (o.last_s - o.first_s) / (o.tokens - 1) if o.tokens > 1 else None


def _aggregated(
    rows: list[PlanRow], picks: list[list[int]], at, prompt, output, model: ModelSpec, out: Served,
    gpu_of: Callable[[str], str] = _same_gpu, waited=None,
) -> None:
    """Requests served by replicas of both phases: replica 0 of each row is simulated."""
    for row, mine_all in zip(rows, picks):
        mine = mine_all[:: row.count]
        if not mine:
            continue
        outcomes = _serve(
            _layout(row.template, model.arch, gpu_of),
            [Request(float(at[i]), int(prompt[i]), int(output[i])) for i in mine],
        )
        weight = len(mine_all) / len(mine)  # every replica of the row, from replica 0's share
        for i, o in zip(mine, outcomes):
            if at[i] >= 0.0:  # before 0: warm-up, served but not booked (serve_window)
                out.count(o.first_s - float(at[i]) + _waited(waited, i), _tpot(o), o.tokens,
                          model, weight)


def _waited(waited, i: int) -> float:
    """Seconds request ``i`` was held before it reached a replica (a wake from zero)."""
    return 0.0 if waited is None else float(waited[i])


def _disaggregated(
    prefill: list[PlanRow],
    decode: list[PlanRow],
    chosen: list[int],
    at,
    prompt,
    output,
    model: ModelSpec,
    out: Served,
    gpu_of: Callable[[str], str] = _same_gpu,
    waited=None,
) -> None:
    """Requests served by a prefill replica, then (after the KV transfer) a decode replica.

    Every prefill replica is simulated (prompt-only steps are few), so every request has its
    hand-off time; replica 0 of each decode row is simulated, with vLLM's disaggregated timing:
    the client's first token comes from the decode replica (computing the last prompt token).
    The KV transfer takes ``coral_solver.perf_roles.kv_transfer_s`` of the prefill replica's largest
    stage (stages send their layers' KV at once)."""
    arch = catalog.model_arch(model.arch)
    ready: dict[int, float] = {}
    for row, mine_all in zip(
        prefill, _deal([r.count * r.throughput for r in prefill], len(chosen))
    ):
        layers = max(s.layers for s in row.template.stages)
        for k in range(row.count):
            mine = [chosen[j] for j in mine_all[k :: row.count]]
            if not mine:
                continue
            outcomes = _serve(
                _layout(row.template, model.arch, gpu_of),
                [Request(float(at[i]), int(prompt[i]), 1) for i in mine],
            )
            for i, o in zip(mine, outcomes):
                if o.tokens:
                    mix = perf.Mix(input_tokens=int(prompt[i]), output_tokens=1)
                    ready[i] = o.first_s + perf_roles.kv_transfer_s(arch, layers, mix)
    handed = sorted(ready, key=lambda i: ready[i])
    for row, mine_all in zip(decode, _deal([r.count * r.throughput for r in decode], len(handed))):
        mine = [handed[j] for j in mine_all[:: row.count]]
        if not mine:
            continue
        outcomes = _serve(
            _layout(row.template, model.arch, gpu_of),
            [
                Request(
                    ready[i], int(prompt[i]), int(output[i]), external=int(prompt[i]) - 1
                )
                for i in mine
            ],
        )
        weight = len(mine_all) / len(mine)
        for i, o in zip(mine, outcomes):
            if at[i] >= 0.0:  # before 0: warm-up, served but not booked (serve_window)
                out.count(o.first_s - float(at[i]) + _waited(waited, i), _tpot(o), o.tokens,
                          model, weight)


def _capacity_by_role(
    plan: Plan, model: ModelSpec,
) -> tuple[dict[str, list[PlanRow]], float, float]:
    """The model's running rows of ``plan`` by role ("both", "prefill", "decode"), the
    aggregated capacity (req/s) and the disaggregated one: a prefill/decode pair serves only as
    fast as the slower of its two sides."""
    rows = [r for r in plan.rows if r.model == model.name and r.count > 0]
    by_role = {role: [r for r in rows if r.role == role] for role in ("both", "prefill", "decode")}
    both = sum(r.count * r.throughput for r in by_role["both"])
    split = min(
        sum(r.count * r.throughput for r in by_role[role]) for role in ("prefill", "decode")
    )
    return by_role, both, split


def serve_window(
    plan: Plan, model: ModelSpec, load: ModelWorkload, start: float, sim_s: float,
    warmup_s: float = 0.0, admission: bool = True, gpu_of: Callable[[str], str] = _same_gpu,
) -> Served:
    """Route the model's requests of [start, start + sim_s) to the plan's replicas and serve them.

    ``warmup_s``: the requests of the ``warmup_s`` seconds before ``start`` are served too, so
    the replicas are not empty at ``start``, but not counted.

    Aggregated and disaggregated capacity share the requests in proportion; within each, rows
    share them in proportion to their capacity (the gateway's weights). When the plan serves
    less than the demand and ``admission`` is on, the gateway admits that share (evenly spread)
    and refuses the rest; off, every request is served (queues grow instead). ``gpu_of`` maps a
    stage's GPU type to the catalog's (:func:`_layout`)."""
    idx = load.window(start - warmup_s, start + sim_s)
    at, prompt, output = load.at[idx] - start, load.prompt[idx], load.output[idx]
    waited = None if load.waited is None else load.waited[idx]  # held during a wake
    counted = at >= 0.0
    out = Served(requests=int(counted.sum()), output_tokens=int(output[counted].sum()))
    by_role, both, split = _capacity_by_role(plan, model)
    capacity = both + split
    if capacity <= 0 or len(at) == 0:
        out.refused = out.requests
        return out
    share = min(1.0, capacity / model.demand_rps) if admission and model.demand_rps > 0 else 1.0
    admitted = [i for i in range(len(at)) if int((i + 1) * share) > int(i * share)]
    out.refused = out.requests - int(counted[admitted].sum())
    paths = _deal([both, split], len(admitted))
    aggregated = [admitted[j] for j in paths[0]]
    if aggregated:
        picks = _deal([r.count * r.throughput for r in by_role["both"]], len(aggregated))
        _aggregated(
            by_role["both"],
            [[aggregated[j] for j in p] for p in picks],
            at,
            prompt,
            output,
            model,
            out,
            gpu_of,
            waited,
        )
    if paths[1]:
        _disaggregated(
            by_role["prefill"],
            by_role["decode"],
            [admitted[j] for j in paths[1]],
            at,
            prompt,
            output,
            model,
            out,
            gpu_of,
            waited,
        )
    return out
