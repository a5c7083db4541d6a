"""The tail-TPOT test over the output-length distribution: what share of requests meets its TPOT.

A request of n output tokens has n - 1 intervals after its first token, and meets its TPOT when
they last at most n - 1 rounds of the TPOT share: it misses exactly when the requests arriving in
that window (its lifetime at the limit) load the stage beyond what the share tolerates. A short
request averages over few steps, so one long prompt in its window breaks it; a long one averages
many. One mean-length request at a z-quantile cannot see that (a prompt-heavy mix, 2,048 in /
28 out, was rated up to 2x the replica simulator's capacity): :func:`tpot_attainment` instead sums
P(a request of n tokens meets its TPOT) over the output lengths n, geometric with the declared
mean (the discrete exponential :class:`coral_solver.simcap.Lengths.exponential` draws and
:func:`coral_solver.perf_queue._concurrent_slots` assumes).

What a window brings is its arrivals' prompt tokens: a count of arrivals, each prompt
exponential (geometric) with the mix's mean, so one long prompt can break a short request
where the mean prompt would not. The count is Poisson given the load's level, and the level
persists near saturation (a queue's fluctuations relax over ~1/(1 - rho)^2 of the time they
take at light load): its variance is mean / spare, spare = 1 - rho, which a Poisson count of
gamma-distributed mean has exactly (the negative binomial; at long windows its normal quantile
is the surge 1 + z / sqrt(spare x mean) the mean-length test drew). A request must meet both
the plain Poisson count (at a few counts: no arrival at all is e^-mean) and the persistent one.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

#: Share of requests whose output lengths lie beyond the summed range, counted as missing (a
#: numerical truncation of the geometric distribution, conservative: 1 % of the miss budget of
#: coral_solver.perf_queue.MISS_PER_OBJECTIVE, 2.5 %).
TRUNCATED_MASS = 2.5e-4
#: Output lengths summed one by one; above, bins each BIN_GROWTH times as long as the last (a
#: request's share of the meeting chance moves little across 6 % of its length; each bin takes
#: the lesser end's: numerical choices, not fitted ones).
EXACT_LENGTHS = 128
BIN_GROWTH = 1.0625
#: Counts below this are summed exactly; beyond, _within_large's approximations (a numerical
#: choice, not a fitted one; tests/unit/test_perf_tail.py holds the sum to the exact one).
_EXACT_COUNTS = 60


@functools.lru_cache(maxsize=1024)
def output_lengths(n_out: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64],
                                        npt.NDArray[np.float64]]:
    """(first lengths, last lengths, probabilities) of bins of geometric output lengths with
    mean ``n_out``: each length up to :data:`EXACT_LENGTHS` alone, then bins each
    :data:`BIN_GROWTH` times the last, truncated where at most :data:`TRUNCATED_MASS` remains
    (that rest is left out: counted as missing)."""
    p = 1.0 / n_out
    if p >= 1.0:
        return np.ones(1), np.ones(1), np.ones(1)
    last = max(1, math.ceil(math.log(TRUNCATED_MASS) / math.log1p(-p)))
    edges = list(range(1, min(last, EXACT_LENGTHS) + 1))
    while edges[-1] < last:
        edges.append(min(last, math.ceil(edges[-1] * BIN_GROWTH)))
    start = np.array(edges, dtype=float)
    stop = np.append(start[1:], last + 1.0)  # each bin is [start, stop)
    mass = (1.0 - p) ** (start - 1.0) - (1.0 - p) ** (stop - 1.0)
    return start, stop - 1.0, mass


def tpot_attainment(per_interval: float, spare: float, tolerated: float, n_out: int) -> float:
    """Share of requests (geometric output lengths, mean ``n_out``) that meet their TPOT.

    ``per_interval``: mean arrivals per TPOT interval at the limit (lam x TPOT); a request of n
    tokens sees a count with mean m = ``per_interval`` x (n - 1) and variance m / ``spare`` in its
    window, and meets its TPOT when that count is at most ``tolerated`` x m (``tolerated``: the
    largest surge of the mean load the stage's step keeps within the share). One-token requests
    have no TPOT and always meet it. A bin of lengths counts the lesser of its two ends' shares.
    Non-decreasing in ``tolerated``."""
    ends, first_at, last_at, mass = _bin_ends(n_out)
    mean = per_interval * (ends - 1.0)
    # the arrivals are Poisson whatever the load's level (at a few counts: no arrival at all
    # is e^-mean, which the gamma mix of levels would raise); the level persists (at many
    # counts: the wider negative binomial): a request must meet both, the lesser share
    met = _within_both(mean, tolerated, min(max(spare, 1e-9), 1.0))
    return float(mass @ np.minimum(met[first_at], met[last_at]))


@functools.lru_cache(maxsize=1024)
def _bin_ends(n_out: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp],
                                   npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """(every distinct end of :func:`output_lengths`' bins, ascending; where each bin's first and
    last length lie in it; the bins' probabilities): a length up to :data:`EXACT_LENGTHS` is
    both ends of its bin, and is judged once."""
    first, last, mass = output_lengths(n_out)
    ends, where = np.unique(np.concatenate([first, last]), return_inverse=True)
    return ends, where[:first.size], where[first.size:], mass


def _within_both(mean: npt.NDArray[np.float64], tolerated: float, spare: float
                 ) -> npt.NDArray[np.float64]:
    """The lesser, for the count's variance mean / ``spare`` and for Poisson (spare 1), of
    P(the prompt tokens of a window's arrivals <= ``tolerated`` x their mean): K arrivals
    (mean ``mean``), each prompt exponential (the mix's lengths are).

    The sum of k exponential prompts stays within u mean prompts exactly when a Poisson count of
    mean u reaches k (the k-th event of a unit-rate process comes by time u), so the share is
    P(K <= U), U Poisson with mean ``tolerated`` x ``mean``, independent of K: summed exactly
    while U stays within :data:`_EXACT_COUNTS` (8 of its standard deviations), else
    :func:`_within_large`. The two variances share which counts are summed exactly and U's
    table."""
    out = np.ones_like(mean)
    u = tolerated * mean
    small = (mean > 0) & (u + 8.0 * np.sqrt(u) + 1.0 < _EXACT_COUNTS)
    if small.any():
        m_small = mean[small]
        # U's probabilities and K's Poisson CDF from one table of both means
        n = m_small.size
        terms, first = _poisson_terms(np.concatenate([u[small], m_small]))
        u_pmf = terms[:n] * first[:n, None]
        poisson_cdf = np.cumsum(terms[n:], axis=1) * first[n:, None]
        if spare < 1.0 - 1e-9:
            within = np.minimum((_negative_binomial_cdf(m_small, spare) * u_pmf).sum(axis=1),
                                1.0)
            within = np.minimum(within, np.minimum((poisson_cdf * u_pmf).sum(axis=1), 1.0))
        else:  # the two counts are the same Poisson one
            within = np.minimum((poisson_cdf * u_pmf).sum(axis=1), 1.0)
        out[small] = within
    large = (mean > 0) & ~small
    if large.any():
        m_large, u_large = mean[large], u[large]
        n = m_large.size
        # both variances in one call: the persistent count's, then Poisson's
        both = _within_large(np.concatenate([m_large, m_large]),
                             np.concatenate([u_large, u_large]),
                             np.concatenate([np.full(n, spare), np.ones(n)]))
        out[large] = np.minimum(both[:n], both[n:])
    return out


#: Gauss-Hermite nodes and weights (probabilists', 16 points) for an expectation over a normal.
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(16)


def _within_large(mean: npt.NDArray[np.float64], u: npt.NDArray[np.float64],
                  spare: float | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """P(K <= U) where U's mean ``u`` is large: U taken normal (its skew 1 / sqrt(u) is small),
    the expectation over it by Gauss-Hermite; K, skewed when overdispersed, as the gamma of its
    mean and variance (shape mean x spare, scale 1 / spare), its CDF by Wilson-Hilferty's cube
    root at U + 1/2 (continuity). ``spare``: one for all, or one per mean."""
    spare_col = np.asarray(spare, dtype=float).reshape(-1, 1) if np.ndim(spare) else spare
    shape = (mean * spare)[:, None]
    at = np.maximum(u[:, None] + np.sqrt(u)[:, None] * _NODES[None, :] + 0.5, 0.0)
    w = (np.cbrt(at * spare_col / shape) - (1.0 - 1.0 / (9.0 * shape))) * 3.0 * np.sqrt(shape)
    cdf: npt.NDArray[np.float64] = _normal_cdf(w) @ (_WEIGHTS / _WEIGHTS.sum())
    return cdf


def _poisson_terms(mean: npt.NDArray[np.float64]
                   ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(P(count = j) / P(count = 0) for j = 0 .. :data:`_EXACT_COUNTS` - 1, P(count = 0)) of
    Poisson counts of ``mean``: the terms' ratios mean / j, their running products. A caller
    takes the probabilities (x P(count = 0)) or their running sums, the CDF."""
    j = np.arange(1, _EXACT_COUNTS, dtype=float)
    ratio = mean[:, None] / j[None, :]
    terms = np.cumprod(np.concatenate([np.ones((mean.size, 1)), ratio], axis=1), axis=1)
    return terms, np.exp(-mean)


def _negative_binomial_cdf(mean: npt.NDArray[np.float64], spare: float
                           ) -> npt.NDArray[np.float64]:
    """P(count <= j) for j = 0 .. :data:`_EXACT_COUNTS` - 1 of a count with ``mean`` and
    variance mean / ``spare`` (< 1): the negative binomial (success chance spare, r = mean x
    spare / (1 - spare)): the terms' ratios, their running products (the probabilities), their
    running sums."""
    j = np.arange(_EXACT_COUNTS, dtype=float)
    r = mean * spare / (1.0 - spare)
    first = np.exp(r * math.log(spare))
    ratio = (r[:, None] + j[None, :-1]) * ((1.0 - spare) / j[None, 1:])
    terms = np.cumprod(np.concatenate([np.ones((mean.size, 1)), ratio], axis=1), axis=1)
    table: npt.NDArray[np.float64] = np.cumsum(terms, axis=1) * first[:, None]
    return table


#: Abramowitz & Stegun, Handbook of Mathematical Functions, 7.1.26: erf(x) = 1 - t (a1 + t (a2
#: + ...)) exp(-x^2), t = 1 / (1 + p x), x >= 0, absolute error <= 1.5e-7 (numpy has no erf).
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _normal_cdf(w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The standard normal CDF at ``w``, vectorised (A&S 7.1.26)."""
    x = np.abs(w) / math.sqrt(2.0)
    t = 1.0 / (1.0 + _AS_P * x)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    erfc = poly * np.exp(-x * x)
    return np.where(w >= 0, 1.0 - 0.5 * erfc, 0.5 * erfc)
