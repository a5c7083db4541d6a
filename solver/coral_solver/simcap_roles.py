"""A prefill-only or a decode-only template's capacity by simulating its whole replica
(``Policy.capacity`` ``simulated`` for a disaggregated model): the same search, replica
simulator, arrivals and goal as an aggregated template's (:mod:`coral_solver.simcap`), each role
judged on its own share of the request's SLO, the shares the analytic role rating uses
(:mod:`coral_solver.perf_roles`):

- **prefill**: every request arrives with its prompt and ``max_tokens`` 1, so the replica does
  a prefill replica's work (chunked prefill, batching, the KV limit as for any replica). When
  its one token comes, its prompt's KV leaves over the node's link, a FIFO queue: a transfer
  waits for the one before it to leave the wire, then takes its bytes over the bandwidth, and
  arrives the link's latency later (perf.kv_transfer_s). A prompt meets its SLO when its prefill
  and its wait for the link fit :func:`coral_solver.perf.prefill_ttft_budget_s` of its own
  length: the TTFT less its KV hand-off and less one TPOT for the decode replica's first token.
  A pipeline's stages each send their own layers' KV at once over their own links, so the
  stage holding the most layers is the one that finishes last (a FIFO queue's departures only
  grow with its service times); its link is the one simulated.
- **decode**: requests arrive as a Poisson process when their hand-off starts; each lands on
  the replica's node over its link (the same FIFO queue) and is admitted with its prompt's KV
  already in the cache (``Request.external``: all but the last prompt token, which vLLM
  computes for its logits), holding its prompt and its output's KV from admission to its
  end. It meets its SLO when its mean time per output token after the first is within TPOT and
  its first token comes within one TPOT of the hand-off the prefill side was charged for (its
  arrival plus its transfer time): the TTFT the prefill budget leaves. The analytic decode
  rating asks the same in its own terms: an arrival finds a free KV slot (no queue) and the
  step stays within TPOT.

A template's capacity is the highest Poisson rate at which ``goal`` of the counted requests
meet their role's SLO (:func:`coral_solver.simcap.capacity`), no higher than the replica
sustains with every request waiting or its link moves back to back (:func:`ceiling`),
memoised with the role in the key (:func:`role_template_capacity`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from coral_replica_sim.replica import Layout, Request, StepModel
from coral_solver import catalog, perf, simcap
from coral_solver.simcap import Judged, Lengths

#: the roles simulated here (an aggregated replica's is :func:`coral_solver.simcap.capacity`)
ROLES = ("prefill", "decode")


class _Link:
    """One node's link as a FIFO queue of KV transfers: the wire carries one transfer's bytes
    at a time; the link's latency (alpha) delays its arrival but does not hold the wire, as the
    analytic link cap counts bytes only (:mod:`coral_solver.perf_roles`)."""

    def __init__(self, arch: catalog.ModelArch, layers: int) -> None:
        self._arch = arch
        self._layers = layers
        self.alpha_s = perf._calibration().pp_alpha_s
        self._free_at = -math.inf

    def transfer_s(self, prompt_tokens: int) -> float:
        """Seconds one prompt's KV takes alone (:func:`coral_solver.perf.kv_transfer_s`)."""
        return perf.kv_transfer_s(self._arch, self._layers, prompt_tokens)

    def send(self, ready_s: float, prompt_tokens: int) -> float:
        """Queue a prompt's KV, ready at ``ready_s``; return the seconds it waits for the wire."""
        start = max(ready_s, self._free_at)
        self._free_at = start + self.transfer_s(prompt_tokens) - self.alpha_s
        return start - ready_s


def _link(layout: Layout) -> _Link:
    return _Link(catalog.model_arch(layout.arch), max(layout.layers))


def prefill_attainment(layout: Layout, slo: perf.Slo, lengths: Lengths, rate: float,
                       goal: float, warmup: int = simcap.WARMUP) -> Judged:
    """Prompts of ``lengths`` arriving at ``rate`` on one prefill replica of ``layout``: the
    counted ones whose prefill and wait for the link fit their prefill budget (module doc)."""
    at = simcap.arrivals(lengths, rate, warmup)
    requests = [Request(float(at[i]), lengths.prompt[i], 1) for i in range(len(at))]
    link = _link(layout)
    budget = _prefill_budgets(layout, slo, lengths)

    def first_ok(i: int, first_s: float) -> bool:
        wait = link.send(first_s, requests[i].prompt_tokens)
        return first_s - requests[i].at + wait <= budget[i]

    # the link's wait is >= 0: a prompt done at now or later is late once now - at is over
    # its budget (exact, a float sum and difference are monotone in each term)
    late = simcap.Deadline([r.at + b for r, b in zip(requests, budget)],
                           lambda i, now: now - requests[i].at > budget[i])
    return simcap.judge(layout, requests, first_ok, tpot_s=slo.tpot_s, goal=goal, rate=rate,
                        warmup=warmup, deadline=late)


def decode_attainment(layout: Layout, slo: perf.Slo, lengths: Lengths, rate: float,
                      goal: float, warmup: int = simcap.WARMUP) -> Judged:
    """Requests of ``lengths`` whose hand-off starts at ``rate`` on one decode replica of
    ``layout``: the counted ones within TPOT whose first token comes within one TPOT of the
    hand-off the prefill side was charged for (module doc)."""
    at = simcap.arrivals(lengths, rate, warmup)
    link = _link(layout)
    requests: list[Request] = []
    due: list[float] = []
    for i, start in enumerate(at):
        prompt = lengths.prompt[i]
        alone = link.transfer_s(prompt)
        landed = float(start) + link.send(float(start), prompt) + alone
        requests.append(Request(landed, prompt, lengths.output[i], external=prompt - 1))
        due.append(float(start) + alone + slo.tpot_s)
    late = simcap.Deadline(due, lambda i, now: now > due[i])
    return simcap.judge(layout, requests, lambda i, first_s: first_s <= due[i],
                        tpot_s=slo.tpot_s, goal=goal, rate=rate, warmup=warmup, deadline=late)


def prefill_guess(layout: Layout, lengths: Lengths) -> float:
    """Prompts/s the replica finishes stepping mean prompts back to back, its slowest stage
    the bottleneck: where the search starts (a guess, not a bound)."""
    model = StepModel(layout, simcap.limits().gpu_memory_utilization)
    chunk = min(int(np.mean(lengths.prompt)), simcap.limits().max_num_batched_tokens)
    return 1.0 / max(model.stage_times(0, max(chunk, 1), 0))


_JUDGES: dict[str, Callable[..., Judged]] = {"prefill": prefill_attainment,
                                            "decode": decode_attainment}


def role_capacity(layout: Layout, slo: perf.Slo, lengths: Lengths, goal: float,
                  role: str) -> float:
    """The highest rate (requests/s, within ``simcap.REL_TOL``) at which ``goal`` of the
    requests meet ``role``'s SLO share on one ``role`` replica of ``layout``; 0.0 when even
    ``simcap.MIN_RATE`` does not."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    attain = _JUDGES[role]
    start = (prefill_guess(layout, lengths) if role == "prefill"
             else simcap.saturation_guess(layout, lengths))
    return simcap.capacity(layout, slo, lengths, goal, start=start,
                           judge=lambda rate: attain(layout, slo, lengths, rate, goal),
                           ceiling=lambda: ceiling(layout, lengths, role),
                           rated_zero=lambda: simcap.hopeless(
                               layout, lengths, _slack(layout, slo, lengths, role), goal,
                               loaded=role == "decode"))


def _slack(layout: Layout, slo: perf.Slo, lengths: Lengths, role: str) -> list[float]:
    """Seconds each request's first token may take alone, from its arrival (prefill: its
    budget, the link's wait being 0 alone) or from landing on the decode replica (one TPOT: its
    due time less its transfer alone)."""
    if role == "decode":
        return [slo.tpot_s] * len(lengths.prompt)
    return _prefill_budgets(layout, slo, lengths)


def _prefill_budgets(layout: Layout, slo: perf.Slo, lengths: Lengths) -> list[float]:
    """Each request's share of TTFT on a prefill replica of ``layout``
    (:func:`coral_solver.perf.prefill_ttft_budget_s`: the TTFT less its prompt's KV hand-off
    and the decode replica's first token)."""
    arch = catalog.model_arch(layout.arch)
    return [perf.prefill_ttft_budget_s(arch, max(layout.layers), slo, perf.Mix(p, o))
            for p, o in zip(lengths.prompt, lengths.output)]


def ceiling(layout: Layout, lengths: Lengths, role: str) -> float:
    """The most a ``role`` replica of ``layout`` sustains: what it finishes with every request
    waiting (:func:`coral_solver.simcap.backlog_rate`), and what its node's link moves, KV
    transfers back to back (bytes only, as :class:`_Link` holds the wire)."""
    if role == "prefill":
        requests = [Request(0.0, p, 1) for p in lengths.prompt]
    else:
        requests = [Request(0.0, p, o, external=p - 1)
                    for p, o in zip(lengths.prompt, lengths.output)]
    link = _link(layout)
    wire = sum(link.transfer_s(p) - link.alpha_s for p in lengths.prompt)
    moved = len(lengths.prompt) / wire if wire > 0 else math.inf
    return min(simcap.backlog_rate(layout, requests), moved)


@functools.lru_cache(maxsize=65536)
def role_template_capacity(arch: str, tp: int, gpu_types: tuple[str, ...],
                           layers: tuple[int, ...], slo: perf.Slo, lengths: Lengths,
                           goal: float, role: str) -> float:
    """:func:`role_capacity` of the ``role`` template (``arch`` key, TP degree, each stage's
    GPU type and layers), memoised by exactly that and the role, as
    :func:`coral_solver.simcap.template_capacity` is for aggregated templates."""
    return role_capacity(Layout(arch, tp, gpu_types, layers), slo, lengths, goal, role)


# a new profiles folder or measured profiles change step times: forget what was simulated
perf._CLEAR_ON_CONFIGURE.append(role_template_capacity.cache_clear)
