"""Open-loop capacity: Poisson arrivals at a fixed rate, every request streamed, judged by the
share of requests that met both the TTFT and the TPOT SLO (a failed request is not within).

This is how requests reach a served model (nobody waits for the last answer before asking),
and how the real-engine SLO check loads the gateway: ``coral-hpc profile`` and that check use
this one load generator and this one judgement, so a capacity it measured is the figure the
check holds the plan to. A closed loop (N clients, each asking again when answered) never
queues more than N requests and understates what an engine serves under random arrivals:
measured on the CPU build, a pipeline put at 7.3 req/s in closed loop served 13.2 req/s of
Poisson load within the SLO.

The generator is the same process as whatever measures, on the same host as the engine in
the local cluster, so it watches its own cost: how far behind its Poisson schedule it sent
and the CPU seconds it used. A generator that cannot keep up falls further behind with every
request, so its last request leaves late and the phase offered less than its rate: one whose
last request left more than :data:`MAX_BEHIND_SHARE` of the phase late counts as missed, and
no capacity is claimed that the client could not drive. (A moment's delay, the host busy with
something else, leaves a late request or two but no lasting lag: the rate was offered.)
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from coral_hpc.profile.prompts import prompt_ids

#: the goal: this share of requests within both SLOs (policy.slo_attainment's default, the
#: paper's 95 %)
GOAL = 0.95
#: a phase lasts at least this long …
PHASE_S = 20.0
#: … and long enough to expect this many requests: at a low rate the share within the SLO of
#: a few requests says little (one of 12 missed is already 92 %)
MIN_REQUESTS = 40
#: a request still running this many times its SLO budget (TTFT + TPOT x later tokens) after
#: it was sent is a miss whatever happens next, and is cancelled: an overloaded phase then ends
#: within seconds of its last arrival instead of waiting out every queued request
DEADLINE_FACTOR = 2.0
#: a generator whose last request left later than this share of the phase's length did not
#: offer the phase's rate (the module doc): 5 % late is 95 % of the rate offered
MAX_BEHIND_SHARE = 0.05
#: each step of the capacity search multiplies or divides the rate by this, then one
#: geometric bisection between the highest rate met and the lowest missed (about ±11 %)
SEARCH_FACTOR = 1.5
#: no search below this rate: a phase there would last minutes (MIN_REQUESTS)
MIN_RATE = 0.05
#: phases at most that repeat the rate the search found before it is claimed: one phase met is
#: one draw of the host's and the engine's noise (a shared login node, a busy 2-core test host),
#: and a capacity should hold more than once. A repeat that misses drops the claim to the next
#: rate met below it, which the second repeat checks in turn.
CONFIRMATIONS = 2


def phase_seconds(rate: float, seconds: float = PHASE_S, min_requests: int = MIN_REQUESTS) -> float:
    """How long a phase at ``rate`` requests/s lasts: ``seconds``, or longer to expect
    ``min_requests`` requests."""
    return max(seconds, min_requests / rate) if rate > 0 else seconds


@dataclass(frozen=True)
class Timing:
    """One streamed request that finished: time to first token, mean time per later token."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Phase:
    """One open-loop phase: each request's timing (None: failed, refused or past its
    deadline), how far behind schedule the generator sent (its 99th percentile and its last
    request), and the CPU it used."""

    rate: float
    seconds: float
    timings: tuple[Timing | None, ...]
    late_p99_s: float
    behind_at_end_s: float
    client_cpu_s: float
    wall_s: float

    @property
    def failed(self) -> int:
        return sum(t is None for t in self.timings)

    def within(self, ttft_s: float, tpot_s: float) -> float:
        """The share of requests within both SLOs (0 when none was sent)."""
        ok = sum(1 for t in self.timings if t and t.ttft_s <= ttft_s and t.tpot_s <= tpot_s)
        return ok / len(self.timings) if self.timings else 0.0

    def client_kept_up(self) -> bool:
        """Whether the generator offered the phase's rate (module doc)."""
        return self.behind_at_end_s <= MAX_BEHIND_SHARE * self.seconds

    def met(self, ttft_s: float, tpot_s: float, goal: float = GOAL) -> bool:
        """The judgement: enough requests within both SLOs, at the rate the phase claims."""
        return self.client_kept_up() and self.within(ttft_s, tpot_s) >= goal

    def client_cores(self) -> float:
        """The generator's own CPU over the phase's wall time (its cost on a shared host)."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0


async def _stream_one(session: aiohttp.ClientSession, url: str, body: bytes,
                      headers: dict[str, str]) -> Timing | None:
    """One streamed completion; its timing, or None unless it answered 200 with tokens.

    Only the arrival of each token chunk matters until the last one, so a chunk is not parsed:
    vLLM's token chunks carry ``"choices":[{…}]`` and its final usage chunk ``"choices":[]``,
    the one chunk decoded for the token count (TPOT = (last - first) / (tokens - 1))."""
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with session.post(f"{url}/v1/completions", data=body, headers=headers) as response:
        if response.status != 200:
            await response.read()
            return None
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            if b'"choices":[]' in line:
                usage = json.loads(line[6:]).get("usage") or {}
                tokens = int(usage.get("completion_tokens") or 0)
            elif b'"choices":' in line:
                last = time.perf_counter()
                first = first if first is not None else last
    if first is None or last is None or tokens < 1:
        return None
    return Timing(first - start, (last - first) / max(tokens - 1, 1))


async def _bounded(request: Coroutine[Any, Any, Timing | None], deadline_s: float) -> Timing | None:
    """The request's timing, or None once it fails or runs past ``deadline_s`` (cancelled:
    closing the stream aborts it in the engine)."""
    try:
        return await asyncio.wait_for(request, deadline_s)
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None


async def open_loop_phase(url: str, model: str, rate: float, seconds: float, input_tokens: int,
                          output_tokens: int, deadline_s: float, rng: random.Random,
                          api_key: str | None = None, first_salt: int = 0) -> Phase:
    """:func:`poisson_phase` inside a running event loop (several models' phases at once)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    late: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks: list[asyncio.Task[Timing | None]] = []
        t = 0.0
        began = time.perf_counter()
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            delay = began + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            late.append(max(0.0, time.perf_counter() - began - t))
            body = json.dumps({
                "model": model, "prompt": prompt_ids(input_tokens, first_salt + len(tasks)),
                "max_tokens": output_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True},
            }).encode()
            tasks.append(asyncio.create_task(
                _bounded(_stream_one(session, url, body, headers), deadline_s)))
        timings = tuple(await asyncio.gather(*tasks))
    behind = late[-1] if late else 0.0
    late.sort()
    p99 = late[min(len(late) - 1, int(0.99 * len(late)))] if late else 0.0
    return Phase(rate, seconds, timings, p99, behind, time.process_time() - cpu0,
                 time.perf_counter() - wall0)


def request_deadline(ttft_s: float, tpot_s: float, output_tokens: int) -> float:
    """Seconds after which a request is a miss whatever happens next (DEADLINE_FACTOR)."""
    return DEADLINE_FACTOR * (ttft_s + tpot_s * max(output_tokens - 1, 0))


def poisson_phase(url: str, model: str, rate: float, *, input_tokens: int, output_tokens: int,
                  ttft_s: float, tpot_s: float, seconds: float | None = None, seed: object = 0,
                  api_key: str | None = None, first_salt: int = 0) -> Phase:
    """Poisson arrivals at ``rate`` requests/s at ``url``'s ``/v1/completions`` (an engine or
    the gateway) for :func:`phase_seconds` (or ``seconds``): prompts of ``input_tokens`` token
    ids (:func:`~coral_hpc.profile.prompts.prompt_ids` of salts ``first_salt``, +1, …),
    ``output_tokens`` tokens out each (``ignore_eos``), streamed. The arrival times follow
    ``seed``, so a phase repeats."""
    length = phase_seconds(rate) if seconds is None else seconds
    return asyncio.run(open_loop_phase(url, model, rate, length, input_tokens, output_tokens,
                                       request_deadline(ttft_s, tpot_s, output_tokens),
                                       random.Random(str(seed)), api_key, first_salt))


@dataclass
class CapacitySearch:
    """The phases a search ran, in order: (rate, met), and the capacity it found: the highest
    rate met below the lowest rate missed (0 when no rate was met). A rate met once and missed
    when repeated counts as missed."""

    tried: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def capacity(self) -> float:
        missed = min((r for r, ok in self.tried if not ok), default=math.inf)
        return max((r for r, ok in self.tried if ok and r < missed), default=0.0)

    @property
    def confirmed(self) -> bool:
        """Whether the capacity was met in two phases (always false when it is 0)."""
        found = self.capacity
        return found > 0 and sum(1 for r, ok in self.tried if ok and r == found) >= 2


def search_capacity(met_at: Callable[[float], bool], start: float, *,
                    factor: float = SEARCH_FACTOR, bisections: int = 1,
                    max_phases: int = 8, min_rate: float = MIN_RATE,
                    confirmations: int = CONFIRMATIONS) -> CapacitySearch:
    """The highest rate ``met_at`` holds: from ``start``, multiply by ``factor`` while it
    holds (divide while it does not) until one rate holds and the next does not, then bisect
    that bracket geometrically ``bisections`` times (at most ``max_phases`` calls in all);
    then repeat the rate found until one is met twice (:data:`CONFIRMATIONS`: at most that
    many repeats may miss; :func:`_confirm`). ``met_at`` is called with a rate it has seen
    before only for a repeat."""
    search = CapacitySearch()
    rate = start
    while len(search.tried) < max_phases and rate >= min_rate:
        ok = met_at(rate)
        search.tried.append((rate, ok))
        if len(search.tried) >= 2 and search.tried[-2][1] != ok:
            break  # the outcome flipped: the capacity lies between the last two rates
        rate = rate * factor if ok else rate / factor
    for _ in range(bisections):
        missed = min((r for r, ok in search.tried if not ok), default=None)
        best = search.capacity
        if missed is None or best <= 0 or len(search.tried) >= max_phases:
            break
        rate = math.sqrt(best * missed)
        search.tried.append((rate, met_at(rate)))
    _confirm(search, met_at, factor, min_rate, confirmations)
    return search


def _confirm(search: CapacitySearch, met_at: Callable[[float], bool], factor: float,
             min_rate: float, misses_allowed: int) -> None:
    """Repeat the claimed rate until it is met twice or ``misses_allowed`` phases have missed.
    A repeat that misses drops the claim to the next rate met below it; where no rate below was
    tried, the search steps down from the lowest rate missed (÷ ``factor``), so one unlucky
    repeat of the lowest rate met does not leave a layout with no capacity at all. Nothing is
    repeated when no rate was ever met."""
    misses = 0
    while misses < misses_allowed and not search.confirmed:
        if search.capacity > 0:
            rate = search.capacity
        elif any(ok for _, ok in search.tried):
            rate = min(r for r, ok in search.tried if not ok) / factor
        else:
            return
        if rate < min_rate:
            return
        ok = met_at(rate)
        search.tried.append((rate, ok))
        misses += not ok
