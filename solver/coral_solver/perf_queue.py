"""The queueing side of one stage's SLO test: what :func:`coral_solver.perf.throughput_from_coeffs`
searches with.

How many sequences the KV cache holds at once (:func:`_concurrent_slots`), the Erlang-C wait for
one of them (:func:`_erlang_c_wait_tail`), the tail TPOT's fixed point (:func:`_tail_step`), the
SLO test of one decode batch (:class:`_Feasibility`, on a stage's mean steps :class:`_StageSteps`)
and the search for the largest batch that passes it (:func:`_first_feasible_batch`,
:func:`_largest_feasible_batch`). Units: seconds, tokens, requests per second.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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


#: Growth factor of the batches probed for the first feasible one (see _first_feasible_batch).
_PROBE_GROWTH = 1.25


def _first_feasible_batch(feasible: Callable[[int], tuple[bool, float]], b_max: int
                          ) -> tuple[int, float]:
    """(smallest probed feasible batch, its mean step) or (0, 0.0) when none is.

    Feasibility is not monotone at the small end: the tail-TPOT surge factor
    1 + z / sqrt(spare x S x b) is largest at b = 1, so with prompt-heavy mixes (e.g. Azure code,
    2,048 in / 28 out) a lone sequence fails where larger batches pass. Batches 1, 2, 3, ... are
    probed growing by at most ``_PROBE_GROWTH`` per step (about 25 probes up to 256), and the
    first that passes starts the search for the largest one.
    """
    b = 1
    while b <= b_max:
        ok, t = feasible(b)
        if ok:
            return b, t
        b = max(b + 1, int(b * _PROBE_GROWTH))
    return 0, 0.0


def _largest_feasible_batch(feasible: Callable[[int], tuple[bool, float]], lo: int,
                            t_lo: float, b_max: int) -> tuple[int, float]:
    """(largest feasible batch in [lo, b_max], its mean step), by bisection: ``lo`` is feasible
    with mean step ``t_lo``, and feasibility is monotone from ``lo`` up (the caller's claim)."""
    hi = b_max
    ok, t_hi = feasible(hi)
    if ok:
        return hi, t_hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
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

    def prompt(self) -> float:
        """The step that runs one sequence's whole prompt."""
        return step_time(self.c, 1, self.n_in, self.ctx, self.prefill_ctx, self.over,
                         self.n_stages, self.alpha, self.bw)

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

    def __call__(self, b: int) -> tuple[bool, float]:
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
        if not self._tail_tpot_ok(b, t):
            return False, t
        return self._kv_wait_ok(b, t), t

    def _tail_tpot_ok(self, b: int, t: float) -> bool:
        """The TPOT of a request that sees the 1 - MISS quantile of arrivals meets the share."""
        # TPOT is per request. The S x b requests arriving during one request's lifetime are
        # Poisson; one that sees the 1 - MISS quantile of them sees the stage as if the rate
        # were lam' = lam (1 + z / sqrt(n)). Its batch and its prompts per step both grow,
        # which lengthens the step, which grows the batch (Little): solve that fixed point;
        # near saturation it runs away, which the mean alone would not show. And near
        # saturation the load stays high for long (a queue's fluctuations relax over
        # ~1/(1 - rho)^2 of the time they take at light load), so a lifetime samples fewer
        # independent arrivals: sqrt(n) = sqrt(S b) x (1 - rho), where 1 - rho = (empty step) /
        # (mean step) is the share of a step not spent on per-request work. Checked against
        # the engine in virtual time (bench/slo.py): >= 95 % at the capacity this returns.
        S, R, n_out, step = self.steps.n_stages, self.ring, self.n_out, self.steps.at
        spare = self.step_empty / t
        surge = 1.0 + _Z / math.sqrt(spare * S * b)
        tail = _tail_step(lambda x: step(b * surge * x / t, R * b * surge * x / (t * n_out)),
                          t, self.tpot_s)
        return not tail > self.tpot_s

    def _kv_wait_ok(self, b: int, t: float) -> bool:
        """At most MISS_PER_OBJECTIVE of requests wait for a KV slot longer than TTFT leaves."""
        # TTFT: queue for a KV slot (M/M/c with the slots above; a request holds one for
        # n_out rounds of S steps), then its prompt step on each of the S stages.
        S, slots = self.steps.n_stages, self.slots
        lam = b / (self.n_out * t)
        service = self.n_out * S * t + S * self.prompt_step
        a = lam * service
        budget = self.ttft_s - S * (t + self.prompt_step)
        if budget <= 0 or a >= slots:
            return False
        tail = _erlang_c_wait_tail(slots, a, slots / service - lam, budget)
        return tail <= MISS_PER_OBJECTIVE
