"""A template's capacity by simulating the whole replica: the highest Poisson arrival rate at
which at least ``goal`` (``Policy.slo_attainment``, default 0.95) of the model's requests meet
both their TTFT and their TPOT **end to end**.

One definition, from the project's own replica simulator (:mod:`coral_replica_sim.replica`, the
scheduler the sim engine runs): every stage and hand-off of the pipeline, continuous batching,
chunked prefill, the KV-cache limit and preemption, for the model's request-length
*distribution* (:class:`Lengths`: a trace's or meter's sample, or the declared means with a
stated distribution) — not a per-stage figure with the TTFT split evenly over the stages.

How a rate is judged (:func:`attainment`): ``WARMUP + COUNTED`` requests with unit-rate
exponential gaps drawn once from a fixed seed, scaled to the rate (common random numbers: every
rate sees the same arrivals and lengths, so the search is deterministic on any machine and
attainment moves with the rate only). The first ``WARMUP`` fill the replica from empty and are
not counted. A request meets its SLO when its first token comes within TTFT of its arrival and
its mean time per output token after the first is within TPOT (a one-token answer has no TPOT);
a request the KV cache could never hold misses. The run stops as soon as more of the counted
requests have missed than the goal allows, each miss counted as soon as it is certain (a first
token not come by its deadline, a running request already over TPOT: :class:`_Tally`), so a
rate that fails stops early with the verdict of the full run.

How the rate is found (:func:`capacity`): from a saturation estimate, halve until a rate meets
the goal (or none above ``MIN_RATE`` does: capacity 0), double while it does, then bisect
geometrically to ``REL_TOL``; the highest rate that met the goal is returned. No rate above
what the replica finishes with every request waiting (:func:`backlog_rate`) counts as met:
there the queue grows without end, which a finite sample under a loose SLO may not show (700
requests of a tiny model fit a 4 s TTFT however fast they come, and the doubling never ended).
That ceiling is simulated only once a rate would pass, and a template whose requests miss their
first token more often than the goal allows even served alone (:func:`hopeless`) is rated 0
without probing rates. Neither changes a figure (bench/results/simcap_speed.md: Stage 1's
figures before and after, and its time).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from coral_replica_sim.replica import EngineLimits, Layout, Request, StepModel, serve_watched
from coral_solver import perf, perf_queue

#: Requests whose outcome is counted per judged rate. The binomial standard error of an
#: attainment of 0.95 over 500 requests is sqrt(0.95 x 0.05 / 500) = 0.97 percentage points:
#: fine enough to tell 95 % from 93 %, the resolution Stage 1 needs (a statistical choice, not
#: a fitted one).
COUNTED = 500
#: Requests served first and not counted, so the counted ones find the replica in its loaded
#: state rather than empty (the same warm-up idea as ``coral_hpc.simulate``'s window warm-up).
WARMUP = 200
#: Seed of the arrival gaps and sampled lengths: fixed, so capacities are reproducible.
SEED = 20261203
#: Rate resolution of the search: the bisection stops when the failing rate is within 2 % of
#: the passing one (finer than what the ~1-point attainment error above moves the rate by).
REL_TOL = 0.02
#: Below this rate (requests/s) a template is rated 0: it serves less than one request a
#: minute within SLO (no planner would use it; the halving must end somewhere). The analytic
#: capacity's floor too (coral_solver.perf_queue), so both rate a template alike.
MIN_RATE = perf_queue.MIN_RATE


@dataclass(frozen=True)
class Lengths:
    """A request-length distribution as a fixed sample of (prompt, output) token pairs, and
    where it came from (named in reports and cache keys)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.prompt or len(self.prompt) != len(self.output):
            raise ValueError("lengths: need as many output lengths as prompt lengths, and some")
        if min(self.prompt) < 1 or min(self.output) < 1:
            raise ValueError(f"lengths ({self.source}): every prompt and output must be >= 1 token")

    @classmethod
    def exponential(cls, input_tokens: int, output_tokens: int, n: int = WARMUP + COUNTED,
                    max_model_len: int | None = None, seed: int = SEED) -> Lengths:
        """The declared means with the stated distribution: prompt and output lengths each
        geometric (the discrete exponential, support 1, 2, ...) with those means, independent
        — what the analytic model assumes of a mix (``coral_solver.perf._concurrent_slots``).
        With ``max_model_len`` a prompt is cut to leave one output token and an output to what
        the prompt leaves (the engine refuses longer), which lowers the means a little."""
        if input_tokens < 1 or output_tokens < 1:
            raise ValueError("lengths: mean input and output tokens must be >= 1")
        rng = np.random.default_rng(seed)
        prompt = rng.geometric(1.0 / input_tokens, n)
        output = rng.geometric(1.0 / output_tokens, n)
        if max_model_len is not None:
            prompt = np.minimum(prompt, max_model_len - 1)
            output = np.minimum(output, max_model_len - prompt)
        return cls(tuple(int(p) for p in prompt), tuple(int(o) for o in output),
                   f"exponential(mean {input_tokens} in, {output_tokens} out"
                   + (f", cut at {max_model_len})" if max_model_len else ")"))

    @classmethod
    def sample(cls, pairs: list[tuple[int, int]], source: str, n: int = WARMUP + COUNTED,
               seed: int = SEED) -> Lengths:
        """``n`` pairs drawn (with replacement, fixed seed) from observed (prompt, output)
        pairs, e.g. a trace's or the gateway meter's, keeping each request's two lengths
        together."""
        if not pairs:
            raise ValueError(f"lengths ({source}): no requests to sample from")
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(pairs), n)
        return cls(tuple(int(pairs[i][0]) for i in picks),
                   tuple(int(pairs[i][1]) for i in picks), source)


@dataclass(frozen=True)
class Judged:
    """One judged rate: requests counted, met both objectives, and whether the run stopped
    early (then ``met`` counts only those seen before the stop, and the goal was missed)."""

    rate: float
    counted: int
    met: int
    stopped: bool

    @property
    def attainment(self) -> float:
        return self.met / self.counted if self.counted else 0.0


@functools.lru_cache(maxsize=8)
def _unit_gaps(n: int, seed: int) -> tuple[float, ...]:
    """Unit-rate exponential gaps, drawn once: every rate scales the same ones."""
    return tuple(float(g) for g in np.random.default_rng(seed + 1).exponential(1.0, n))


def limits() -> EngineLimits:
    """The engine limits every replica starts with: the calibration's (what coral-hpc starts
    vLLM with), as Stage 1's analytic model reads them."""
    cal = perf._calibration()
    return EngineLimits(max_num_seqs=cal.max_num_seqs,
                        max_num_batched_tokens=cal.max_num_batched_tokens,
                        gpu_memory_utilization=cal.gpu_memory_utilization)


def attainment(layout: Layout, slo: perf.Slo, lengths: Lengths, rate: float, goal: float,
               warmup: int = WARMUP) -> Judged:
    """Serve ``lengths`` (in order) arriving as a Poisson process of ``rate`` requests/s on one
    replica of ``layout``; count the requests after the first ``warmup`` that meet TTFT and
    TPOT. Stops once the misses make ``goal`` unreachable."""
    at = arrivals(lengths, rate, warmup)
    requests = [Request(float(at[i]), lengths.prompt[i], lengths.output[i])
                for i in range(len(at))]
    ttft = slo.ttft_s
    # a first token at now or later is at least now - at after its arrival (exact: a float
    # difference is monotone in its first term)
    late = Deadline((at + ttft).tolist(), lambda i, now: now - requests[i].at > ttft)
    return judge(layout, requests, lambda i, first_s: first_s - requests[i].at <= ttft,
                 tpot_s=slo.tpot_s, goal=goal, rate=rate, warmup=warmup, deadline=late)


def arrivals(lengths: Lengths, rate: float, warmup: int = WARMUP) -> np.ndarray:
    """Arrival times (s) of ``lengths``' requests as a Poisson process of ``rate`` requests/s:
    the fixed unit-rate gaps, scaled (common random numbers, module docstring)."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    n = len(lengths.prompt)
    if n <= warmup:
        raise ValueError(f"lengths: {n} requests, need more than the {warmup} warm-up ones")
    return np.cumsum(np.asarray(_unit_gaps(n, SEED))) / rate


#: first_ok(request index, first token s) -> the first token came in time; asked once per
#: request, warm-up ones included, in the order the first tokens come
FirstOk = Callable[[int, float], bool]


@dataclass(frozen=True)
class Deadline:
    """When a request's first token is late whatever else happens, so a run can count the miss
    then instead of when the token comes (a judge's early stop, exact): ``late(i, now)`` is True
    only if ``first_ok`` fails every first token at ``now`` or later (it must stay True as
    ``now`` grows); ``by[i]`` is about when it turns True (it only orders the checks)."""

    by: Sequence[float]
    late: Callable[[int, float], bool]


class _Tally:
    """The counted requests' misses as a run goes (:func:`judge`): each request's miss is
    counted once, when it is certain — a refusal, a first token ``first_ok`` rejects, a first
    token not come by its :class:`Deadline`, a finish over TPOT, or a request still running
    whose mean time per output token is over TPOT already (its last token comes later still)."""

    def __init__(self, requests: list[Request], first_ok: FirstOk, tpot_s: float,
                 warmup: int, deadline: Deadline | None) -> None:
        self._first_ok = first_ok
        self._tpot_s = tpot_s
        self._warmup = warmup
        self._max_tokens = [r.max_tokens for r in requests]
        self._first_s: dict[int, float] = {}  # request -> its first token's time
        self._missed: set[int] = set()  # counted requests certain to miss
        self._done: set[int] = set()  # finished or refused
        self._deadline = deadline
        self._order = (sorted(range(warmup, len(requests)), key=deadline.by.__getitem__)
                       if deadline is not None else [])
        self._next = 0  # the next of _order whose first token has not been checked late
        self._slow: list[tuple[float, int]] = []  # (about when over TPOT, request) running

    @property
    def missed(self) -> int:
        return len(self._missed)

    def _miss(self, i: int) -> None:
        if i >= self._warmup:
            self._missed.add(i)

    def token(self, i: int, first_s: float, last_s: float, tokens: int, finished: bool) -> None:
        """A watch call of :func:`coral_replica_sim.replica.serve_watched`, then the checks of
        what is late at ``last_s`` (the event's time)."""
        if finished:
            self._done.add(i)
        if tokens == 0:  # refused: it could never fit the KV cache
            self._miss(i)
        elif i not in self._first_s:
            self._first_s[i] = first_s
            if not self._first_ok(i, first_s):  # asked even if late: it may keep state
                self._miss(i)
            elif not finished and self._max_tokens[i] > 1 and i >= self._warmup:
                heapq.heappush(self._slow, (first_s + self._tpot_s * (self._max_tokens[i] - 1),
                                            i))
        if (finished and tokens > 1 and i not in self._missed
                and (last_s - first_s) / (tokens - 1) > self._tpot_s):
            self._miss(i)
        self._late(last_s)

    def _late(self, now: float) -> None:
        """Count the misses certain at ``now``: first tokens past their deadline, and running
        requests whose mean time per output token, were they to finish now, is over TPOT
        (both checked exactly, ``by`` and the heap's keys only order them)."""
        order, deadline = self._order, self._deadline
        while deadline is not None and self._next < len(order):
            j = order[self._next]
            if j not in self._first_s and j not in self._done:
                if deadline.by[j] >= now or not deadline.late(j, now):
                    break
                self._miss(j)
            self._next += 1
        while self._slow and self._slow[0][0] < now:
            j = self._slow[0][1]
            if j not in self._done and j not in self._missed:
                if (now - self._first_s[j]) / (self._max_tokens[j] - 1) <= self._tpot_s:
                    break
                self._miss(j)
            heapq.heappop(self._slow)


def judge(layout: Layout, requests: list[Request], first_ok: FirstOk, *, tpot_s: float,
          goal: float, rate: float, warmup: int = WARMUP,
          deadline: Deadline | None = None) -> Judged:
    """Serve ``requests`` on one replica of ``layout`` and count those after the first
    ``warmup`` whose first token ``first_ok`` accepts and whose mean time per output token after
    the first is within ``tpot_s`` (a one-token answer has none); a request the KV cache could
    never hold misses. Stops once the misses make ``goal`` unreachable, counting each miss as
    soon as it is certain (:class:`_Tally`; ``deadline``: when a first token is late), so a
    rate that fails stops early; the verdict is the full run's. ``rate``: the arrival rate the
    requests were drawn at (reported)."""
    counted = len(requests) - warmup
    allowed = math.floor((1.0 - goal) * counted + 1e-9)  # misses the goal allows
    tally = _Tally(requests, first_ok, tpot_s, warmup, deadline)

    def watch(i: int, first_s: float, last_s: float, tokens: int, finished: bool) -> bool:
        tally.token(i, first_s, last_s, tokens, finished)
        return tally.missed > allowed

    _first, _last, _produced, stopped = serve_watched(layout, requests, limits(), watch)
    return Judged(rate, counted, counted - tally.missed, stopped)


def saturation_guess(layout: Layout, lengths: Lengths) -> float:
    """Requests/s the replica would finish with its batch full of mean-length sequences
    (``max_num_seqs`` or what the KV cache holds, split over the stages' micro-batches), every
    step decode only: where the search starts (a guess, not a bound: the search moves from it)."""
    lim = limits()
    model = StepModel(layout, lim.gpu_memory_utilization)
    n_in = float(np.mean(lengths.prompt))
    n_out = float(np.mean(lengths.output))
    held = max(1, int(model.kv_capacity_tokens() // (n_in + n_out / 2.0)))
    seqs = max(1, min(lim.max_num_seqs, held))
    per_engine = max(1, seqs // layout.stages)
    times = model.stage_times(per_engine, 0, int(per_engine * (n_in + n_out / 2.0)))
    # S micro-batches in flight; a round of every micro-batch through the slowest stage
    round_s = max(sum(times), layout.stages * max(times))
    return per_engine * layout.stages / (n_out * round_s)


def backlog_rate(layout: Layout, requests: list[Request]) -> float:
    """Requests/s one replica of ``layout`` takes in when every one of ``requests`` is waiting
    from the start: ``len(requests)`` over the time the last of them produced its first token.
    Until then a queue waits, so the replica runs full and takes in a request as one leaves
    (it finishes about as many as it takes in, Little's law): the most it sustains, a Poisson
    rate above it only queues more and more. The makespan would not do: the last long
    requests of the burst finish alone, in steps far from full."""
    burst = [replace(r, at=0.0) for r in requests]
    started: set[int] = set()

    def watch(i: int, _first_s: float, _last_s: float, _tokens: int, _finished: bool) -> bool:
        started.add(i)  # a first token or a refusal: nothing later moves this one's first
        return len(started) == len(burst)  # the rest of the run cannot move ``end``

    first, _last, _produced, _ = serve_watched(layout, burst, limits(), watch)
    end = max(first.values(), default=0.0)
    return len(requests) / end if end > 0 else math.inf


def hopeless(layout: Layout, lengths: Lengths, slack: Sequence[float], goal: float,
             warmup: int = WARMUP, loaded: bool = False) -> bool:
    """Whether more of the counted requests than ``goal`` allows miss their first token even
    served alone on the idle replica: request ``i``'s prompt alone (``loaded``: with all but its
    last prompt token's KV already in the cache, a decode replica's hand-off) must bring its
    first token within ``slack[i]`` s. A request's first token comes no sooner with others in
    the replica than alone (they only add to its steps and queue it; an assumption of the
    scheduler and step model, checked to 1e-9 s by tests/unit/test_simcap_speed.py, not
    proven), so then
    no rate meets the goal and the search may rate the template 0 without probing rates."""
    counted = len(lengths.prompt) - warmup
    allowed = math.floor((1.0 - goal) * counted + 1e-9)
    alone: dict[int, float] = {}  # prompt tokens -> first token s, alone
    missed = 0
    for i in range(warmup, len(lengths.prompt)):
        prompt = lengths.prompt[i]
        if prompt not in alone:
            request = Request(0.0, prompt, 1, external=prompt - 1 if loaded else 0)
            first, _last, produced, _ = serve_watched(layout, [request], limits(), None)
            alone[prompt] = first[0] if produced[0] else math.inf  # refused: never in time
        missed += alone[prompt] > slack[i]
        if missed > allowed:
            return True
    return False


def capacity(layout: Layout, slo: perf.Slo, lengths: Lengths, goal: float = 0.95,
             start: float | None = None,
             judge: Callable[[float], Judged] | None = None,
             ceiling: float | Callable[[], float] | None = None,
             rated_zero: Callable[[], bool] | None = None) -> float:
    """The highest rate (requests/s, within ``REL_TOL``) at which at least ``goal`` of the
    requests meet TTFT and TPOT on one replica of ``layout``; 0.0 when even ``MIN_RATE`` does
    not (or a request could never fit). ``start``: where the search starts (default
    :func:`saturation_guess`); ``judge``: rate -> :class:`Judged` (default :func:`attainment`);
    ``ceiling``: rates above it fail unjudged, or what simulates it (default, with the default
    judge: the :func:`backlog_rate` of ``lengths``; none with another judge); ``rated_zero``:
    True when no rate can pass, e.g. :func:`hopeless` (default, with the default judge: each
    prompt's TTFT alone), so the search returns 0.0 at once."""
    if not 0.0 < goal <= 1.0:
        raise ValueError(f"goal (slo_attainment) must be in (0, 1], got {goal}")
    if judge is None:
        if ceiling is None:
            ceiling = functools.partial(backlog_rate, layout, [
                Request(0.0, p, o) for p, o in zip(lengths.prompt, lengths.output)])
        if rated_zero is None:
            rated_zero = functools.partial(hopeless, layout, lengths,
                                           [slo.ttft_s] * len(lengths.prompt), goal)
    if rated_zero is not None and rated_zero():
        return 0.0
    # a ceiling to simulate is simulated once, and only when a rate would pass (a template no
    # rate passes never needs it); the verdicts are those of checking it first
    known: list[float] = [ceiling] if isinstance(ceiling, (int, float)) else []

    def ok(rate: float) -> bool:
        if known and rate > known[0]:
            return False  # not sustained, though the sample may not show it
        judged = judge(rate) if judge is not None else attainment(layout, slo, lengths, rate,
                                                                   goal)
        if judged.stopped or judged.attainment < goal:
            return False
        if not known and callable(ceiling):
            known.append(ceiling())
        return not known or rate <= known[0]

    rate = start if start is not None and start > 0 else saturation_guess(layout, lengths)
    if ok(rate):
        lo = rate
        hi = rate * 2.0
        while ok(hi):
            lo, hi = hi, hi * 2.0
    else:
        hi = rate
        lo = rate / 2.0
        while not ok(lo):
            if lo < MIN_RATE:
                return 0.0
            hi, lo = lo, lo / 2.0
    while hi / lo > 1.0 + REL_TOL:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


@functools.lru_cache(maxsize=65536)
def template_capacity(arch: str, tp: int, gpu_types: tuple[str, ...], layers: tuple[int, ...],
                      slo: perf.Slo, lengths: Lengths, goal: float) -> float:
    """:func:`capacity` of the template (``arch`` key, TP degree, each stage's GPU type and
    layers), memoised by exactly that: templates of models alike in architecture, SLO and
    length distribution are simulated once per process."""
    return capacity(Layout(arch, tp, gpu_types, layers), slo, lengths, goal)


# a new profiles folder or measured profiles change step times: forget what was simulated
perf._CLEAR_ON_CONFIGURE.append(template_capacity.cache_clear)
