"""The queueing side of one stage's SLO test: what :func:`coral_solver.perf.throughput_from_coeffs`
searches with.

How many sequences the KV cache holds at once (:func:`_concurrent_slots`), the Erlang-C wait for
one of them (:func:`_erlang_c_wait_tail`), the tail TPOT's fixed point (:func:`_tail_step`; the
share of requests over output lengths that meets it is :mod:`coral_solver.perf_tail`'s), the
SLO test of one decode batch (:class:`_Feasibility`, on a stage's mean steps :class:`_StageSteps`)
and the search for the largest batch that passes it (:func:`_largest_feasible_batch`). Units:
seconds, tokens, requests per second.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from coral_solver import perf_tail
from coral_solver.perf_model import StageCoeffs, step_time

#: Share of requests a stage may let miss each objective (TTFT and TPOT): together they stay
#: within the 5 % a replica may miss (issue 6: >= 95 % of requests within both SLOs).
MISS_PER_OBJECTIVE = 0.025
#: One-sided normal quantile of 1 - MISS_PER_OBJECTIVE.
_Z = 1.96
#: Aitken rounds for the tail TPOT's fixed point; one that has not settled by then is called
#: infeasible.
_TAIL_ROUNDS = 6


def _erlang_c_wait_tail(c: int, a: float, rate_gap: float, t: float) -> float:
    """P(wait > t) in an M/M/c queue: c servers, offered load a = lambda x service (a < c),
    ``rate_gap`` = c/service - lambda. Erlang C, summed in log space (numpy, no Python loop)."""
    k = np.arange(c, dtype=float)
    log_terms = k * math.log(a) - _log_factorials(c)
    log_tail = c * math.log(a) - math.lgamma(c + 1.0) + math.log(c / (c - a))
    top = log_terms.max()
    head = top + math.log(np.exp(log_terms - top).sum())
    m = max(head, log_tail)
    p_wait = math.exp(log_tail - m) / (math.exp(head - m) + math.exp(log_tail - m))
    return p_wait * math.exp(-rate_gap * max(t, 0.0))


@functools.lru_cache(maxsize=64)
def _log_factorials(c: int) -> npt.NDArray[np.float64]:
    """log k! for k = 0 .. c-1."""
    out = np.zeros(c)
    np.cumsum(np.log(np.arange(1, c, dtype=float)), out=out[1:])
    return out


def _tail_step(f: Callable[[float], float], start: float, limit: float) -> float:
    """The least fixed point t = f(t) above ``start`` of an increasing, nearly linear step map,
    or ``math.inf`` when iterating from ``start`` runs away (or past ``limit``).

    Aitken's extrapolation from two iterates: exact for a linear map, so a few rounds settle the
    piecewise-linear roofline where plain iteration near saturation needs dozens.
    """
    t0 = start
    for _ in range(_TAIL_ROUNDS):
        t1 = f(t0)
        if t1 > limit:
            return math.inf
        if t1 - t0 <= 1e-3 * t0:
            return t1
        t2 = f(t1)
        if t2 > limit:
            return math.inf
        rise1, rise2 = t1 - t0, t2 - t1
        if rise2 >= rise1:
            return math.inf  # not contracting: the tail grows without bound
        t0 = t0 + rise1 * rise1 / (rise1 - rise2)
        if t0 > limit:
            return math.inf
    return math.inf


def _concurrent_slots(cap: int, n_in: int, n_out: int, max_seqs: int) -> int:
    """Sequences the KV cache holds at once with 1 - MISS_PER_OBJECTIVE confidence.

    Token counts are taken exponential with the mix's means (all the mix says). A running
    sequence observed at a random moment holds its prompt plus a uniform share of a
    length-biased output: mean in + out (not in + out/2: long outputs stay longer), variance
    in^2 + out^2. c sequences fit when c x mean + z sqrt(c) x sd <= capacity; the vLLM-style
    engine otherwise preempts and queues (checked against coral_hpc.engine in virtual time).
    """
    mean = float(n_in + n_out)
    sd = math.hypot(n_in, n_out)
    # c*mean + z*sd*sqrt(c) - cap = 0, a quadratic in sqrt(c)
    root = (-_Z * sd + math.sqrt((_Z * sd) ** 2 + 4.0 * mean * cap)) / (2.0 * mean)
    return min(max_seqs, int(root * root))


#: Relative resolution of the batch search: the largest feasible mean batch is found to 0.1 %,
#: so the capacity is too (it grows at most in proportion to the batch). A numerical choice, not
#: a fitted one: finer than the integer batches the search took before (1 % at b = 100, 25 % at
#: b = 4), and the bound on how far capacity may rise when a step gets slower (none, up to this).
BATCH_RESOLUTION = 1e-3
#: Below this rate (requests/s) a stage is rated 0: it serves less than one request a minute
#: (no planner would use it; the search must end somewhere). :mod:`coral_solver.simcap` rates a
#: simulated template by the same floor.
MIN_RATE = 1.0 / 60.0
#: Halvings of the batch the search tries at most before rating the stage 0 (a guard: with a
#: positive empty step the rate falls below MIN_RATE long before).
_MAX_HALVINGS = 64
#: Relative resolution of the tolerated surge (perf_tail's allowed count is its floor x the
#: window's mean count): a numerical choice, as BATCH_RESOLUTION.
SURGE_RESOLUTION = 1e-3


def _largest_feasible_batch(feasible: Callable[[float], tuple[bool, float]], b_max: float,
                            n_out: int) -> tuple[float, float]:
    """(largest feasible mean decode batch in (0, ``b_max``] to :data:`BATCH_RESOLUTION`, its
    mean step), or (0.0, 0.0) when none serving at least :data:`MIN_RATE` requests/s is.

    Feasibility must be monotone in the batch (the caller's claim). The batch is a mean, so a
    real number: searching whole batches made capacity jump by a whole sequence's share, which
    a slower step could turn into a gain (a batch one larger passing at the slower step, at a
    rate above the faster step's last passing one). Halves from ``b_max`` until a batch passes,
    then bisects between it and the last failing one.
    """
    ok, t = feasible(b_max)
    if ok:
        return b_max, t
    hi, lo = b_max, b_max / 2.0
    for _ in range(_MAX_HALVINGS):
        ok, t_lo = feasible(lo)
        if ok:
            break
        if lo / (n_out * t_lo) < MIN_RATE:  # the rate only falls with the batch
            return 0.0, 0.0
        hi, lo = lo, lo / 2.0
    else:
        return 0.0, 0.0
    while hi - lo > BATCH_RESOLUTION * lo:
        mid = 0.5 * (lo + hi)
        ok, t_mid = feasible(mid)
        if ok:
            lo, t_lo = mid, t_mid
        else:
            hi = mid
    return lo, t_lo


@dataclass(frozen=True)
class _StageSteps:
    """Mean step times of one stage (``n_stages`` of a pipeline) for one mix of ``n_in`` prompt
    tokens, with the engine overhead ``over`` and hand-offs priced by ``alpha`` + bytes / ``bw``.

    ``ctx``: KV tokens a decode step reads per running sequence; ``prefill_ctx``: the mean
    context a prompt token attends to (see :func:`coral_solver.perf_model.step_time`).
    """

    c: StageCoeffs
    n_in: int
    over: float
    n_stages: int
    alpha: float
    bw: float
    ctx: float
    prefill_ctx: float

    def at(self, b: float, prompts: float) -> float:
        """Mean step with ``b`` sequences decoding and ``prompts`` whole prompts per step.

        vLLM schedules a waiting prompt whole in the next step, so a share p of the steps carries
        k whole prompts and the rest decode only (the roofline would hide prompts spread thinly).
        """
        c, S, over, alpha, bw = self.c, self.n_stages, self.over, self.alpha, self.bw
        p = min(1.0, prompts)
        k = max(1.0, prompts)
        decode_only = step_time(c, b, 0.0, b * self.ctx, 0.0, over, S, alpha, bw)
        with_prompts = step_time(c, b, k * self.n_in, b * self.ctx, self.prefill_ctx, over, S,
                                 alpha, bw)
        return (1.0 - p) * decode_only + p * with_prompts

    def prompt(self, n_in: float | None = None) -> float:
        """The step that runs one sequence's whole prompt (of ``n_in`` tokens, else the mix's
        mean, attending to half of itself on average)."""
        if n_in is None:
            return step_time(self.c, 1, self.n_in, self.ctx, self.prefill_ctx, self.over,
                             self.n_stages, self.alpha, self.bw)
        return step_time(self.c, 1, n_in, self.ctx, n_in / 2.0, self.over, self.n_stages,
                         self.alpha, self.bw)

    def empty(self) -> float:
        """A step with nothing to do: the overhead and the hand-off alone."""
        return step_time(self.c, 0, 0.0, 0.0, 0.0, self.over, self.n_stages, self.alpha, self.bw)


@dataclass(frozen=True)
class _Feasibility:
    """Whether a decode batch of ``b`` per micro-batch meets the stage's SLO share:
    called with b, returns (passes, mean step).

    ``ring``: micro-batches whose prompts each stage's step pays for (S, or 1 when prompts
    stall only their own micro-batch); ``tpot_s``: the stage's TPOT share; ``ttft_s``: the
    whole TTFT (each of the S stages spends its prompt step and one step of its own);
    ``poisson_tail`` False: only the mean tests (a closed loop's load).
    """

    steps: _StageSteps
    n_out: int
    slots: int
    ring: int
    tpot_s: float
    ttft_s: float
    poisson_tail: bool
    prompt_step: float
    step_empty: float

    def __call__(self, b: float) -> tuple[bool, float]:
        # A sequence advances one token per round of all S micro-batches; the S x b sequences
        # in flight see about S x b prompts arrive during one request's n_out rounds (Little),
        # and a prompt stalls the whole pipeline ring (every micro-batch follows the long step
        # through every stage), so each stage pays S x b / n_out prompts per step of its own
        # (R = S; R = 1, its own micro-batch's b / n_out, with PROMPTS_STALL_RING False).
        mean_prompts = self.ring * b / self.n_out
        t = self.steps.at(b, mean_prompts)
        if t > self.tpot_s:
            return False, t
        if not self.poisson_tail:
            return self.ttft_s - self.steps.n_stages * (t + self.prompt_step) > 0, t
        # both must pass; the KV wait is the cheaper test, so it goes first
        return self._kv_wait_ok(b, t) and self._tail_tpot_ok(b, t), t

    def _tail_tpot_ok(self, b: float, t: float) -> bool:
        """At least 1 - MISS of requests, over their output lengths, meet the TPOT share."""
        # TPOT is per request. A request of n tokens misses the share exactly when it lives
        # longer than n - 1 rounds of S steps of the share, and whether it does is decided by
        # the requests arriving within that window: lam x TPOT per interval on average (not
        # the mean lifetime's, which grows with every fixed cost of a step, so a slower step
        # would draw a smaller surge and be rated higher; bench/results/capacity_band.md).
        # One that sees x times the mean arrivals sees the stage as if the rate were lam x:
        # its batch and its prompts per step both grow, which lengthens the step, which grows
        # the batch (Little): the largest x whose fixed point stays within the share is what
        # the stage tolerates (near saturation it runs away, which the mean alone would not
        # show). Over geometric output lengths, the share of requests whose window's prompt
        # tokens stay within x times their mean (perf_tail: exponential prompts, a count of
        # variance mean / spare, spare = (empty step) / (mean step), the share of a step not
        # spent on per-request work).
        lam = b / (self.n_out * t)
        tolerated = self._tolerated_surge(b, t)
        met = perf_tail.tpot_attainment(lam * self.steps.n_stages * self.tpot_s,
                                        self.step_empty / t, tolerated, self.n_out)
        return met >= 1.0 - MISS_PER_OBJECTIVE

    def _tolerated_surge(self, b: float, t: float) -> float:
        """The largest surge x of the arrival rate (>= 1: the mean passes) whose tail step's
        fixed point stays within the TPOT share, to :data:`SURGE_RESOLUTION`; inf when the step
        never reaches the share (no per-request cost)."""
        R, n_out, step, share = self.ring, self.n_out, self.steps.at, self.tpot_s

        def ok(x: float) -> bool:
            tail = _tail_step(lambda y: step(b * x * y / t, R * b * x * y / (t * n_out)),
                              t, share)
            return not tail > share

        lo, hi = 1.0, 2.0
        for _ in range(_MAX_HALVINGS):
            if not ok(hi):
                break
            lo, hi = hi, 2.0 * hi
        else:
            return math.inf
        while hi - lo > SURGE_RESOLUTION * lo:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    def _kv_wait_ok(self, b: float, t: float) -> bool:
        """At most MISS_PER_OBJECTIVE of requests, over their prompt lengths, wait for a KV slot
        longer than TTFT leaves after their own prompt."""
        # TTFT: queue for a KV slot (M/M/c with the slots above; a request holds one for
        # n_out rounds of S steps), then its prompt step on each of the S stages. Prompt
        # lengths are geometric with the mix's mean (simcap.Lengths.exponential's): a long
        # prompt leaves less of the TTFT, or none (a 2,048-token mean has 5 % of prompts
        # above 6,100 tokens), which the mean prompt alone does not show.
        S, slots = self.steps.n_stages, self.slots
        lam = b / (self.n_out * t)
        service = self.n_out * S * t + S * self.prompt_step
        a = lam * service
        if a >= slots:
            return False
        waits = _erlang_c_wait_tail(slots, a, slots / service - lam, 0.0)
        steps, mass = self._prompt_steps
        budget = self.ttft_s - S * (t + steps)
        late = np.where(budget > 0.0, waits * np.exp(-(slots / service - lam)
                                                       * np.maximum(budget, 0.0)), 1.0)
        return float(mass @ late) + perf_tail.TRUNCATED_MASS <= MISS_PER_OBJECTIVE

    @functools.cached_property
    def _prompt_steps(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(the prompt step of each bin of geometric prompt lengths, at its longer end; the
        bins' probabilities): perf_tail's bins, with the mix's mean prompt."""
        _, last, mass = perf_tail.output_lengths(self.steps.n_in)
        return np.array([self.steps.prompt(n) for n in last]), mass
