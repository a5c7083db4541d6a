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

The count of arrivals in a window is Poisson given the load's level, and the level persists near
saturation (a queue's fluctuations relax over ~1/(1 - rho)^2 of the time they take at light
load): the count's variance is its mean / spare, spare = 1 - rho. A Poisson count whose mean is
gamma distributed has exactly that variance (the negative binomial); at long windows its normal
quantile is the surge 1 + z / sqrt(spare x mean) the mean-length test drew.
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
#: Counts up to this are summed exactly; above it a gamma with the count's mean and variance is
#: used (Wilson-Hilferty): at a count of 40 and above its CDF is within 5e-3 of the exact sum,
#: mostly below it (a numerical choice, not a fitted one).
_EXACT_COUNTS = 40


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
    first, last, mass = output_lengths(n_out)
    ends = np.concatenate([first, last])
    mean = per_interval * (ends - 1.0)
    allowed = np.floor(tolerated * mean + 1e-9)
    met = _count_cdf(allowed, mean, min(max(spare, 1e-9), 1.0))
    return float(mass @ np.minimum(met[:first.size], met[first.size:]))


def _count_cdf(k: npt.NDArray[np.float64], mean: npt.NDArray[np.float64], spare: float
               ) -> npt.NDArray[np.float64]:
    """P(count <= k) of a count with ``mean`` and variance mean / ``spare``: negative binomial
    (success probability spare, r = mean x spare / (1 - spare)); Poisson when spare is 1."""
    out = np.ones_like(mean)
    small = (k < _EXACT_COUNTS) & (mean > 0)
    if small.any():
        out[small] = _exact_cdf(k[small], mean[small], spare)
    large = (k >= _EXACT_COUNTS) & (mean > 0)
    if large.any():
        # the gamma with the count's mean and variance (shape mean x spare, scale 1 / spare;
        # its skew 2 / sqrt(mean x spare) at least the count's (2 - spare) / sqrt(...)), its
        # CDF by Wilson-Hilferty's cube root, at k + 1/2 (continuity)
        shape = mean[large] * spare
        ratio = (k[large] + 0.5) * spare / shape
        w = (np.cbrt(ratio) - (1.0 - 1.0 / (9.0 * shape))) * 3.0 * np.sqrt(shape)
        out[large] = _normal_cdf(w)
    return out


def _exact_cdf(k: npt.NDArray[np.float64], mean: npt.NDArray[np.float64], spare: float
               ) -> npt.NDArray[np.float64]:
    """P(count <= k) summed term by term (every k below :data:`_EXACT_COUNTS`), all at once: the
    terms' ratios, their running products (the probabilities), their running sums."""
    j = np.arange(int(k.max()) + 1, dtype=float)
    if spare >= 1.0 - 1e-9:
        first = np.exp(-mean)
        ratio = mean[:, None] / (j[None, 1:])
    else:
        r = mean * spare / (1.0 - spare)
        first = np.exp(r * math.log(spare))
        ratio = (r[:, None] + j[None, :-1]) * ((1.0 - spare) / j[None, 1:])
    terms = np.cumprod(np.concatenate([np.ones((mean.size, 1)), ratio], axis=1), axis=1)
    cdf: npt.NDArray[np.float64] = np.cumsum(terms, axis=1) * first[:, None]
    at_k: npt.NDArray[np.float64] = np.take_along_axis(cdf, k.astype(int)[:, None], axis=1)[:, 0]
    return np.minimum(at_k, 1.0)


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
