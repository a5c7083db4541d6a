"""A measured profile's engine steps as the model of that (arch, gpu, tp): either one factor on
the catalogue's roofline or a step model fitted to the steps themselves, whichever describes
them better.

``coral-hpc profile`` measures an engine's steps (decode batches and whole prompts). The
planner used to scale the catalogue's roofline by the median measured ÷ model ratio: right
when the roofline has the step's shape and is only off in level. Where it has not (vLLM's CPU
build on a node the catalogue calls a V100: prompts cost ~0.7 ms a token, the roofline's a few
microseconds, so one factor fitted to the decode steps leaves prompts 10-100x too cheap;
bench/results/capacity_band.md, the planner 50-85x the measured capacity), the steps fitted
as overhead + s per token (decode and prompt) + s per KV token read (non-negative least
squares, as bench/paper_pp.py fits them) describe them. Of the two, the one with the smaller
median |log(model / measured)| over the measured steps is used: no threshold, no tuned
constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from coral_solver.perf_model import StageCoeffs, step_time
from coral_solver.perf_profiles import MeasuredProfile, StepPoint


@dataclass(frozen=True)
class StepFit:
    """Steps of a whole ``layers``-layer engine: ``overhead_s`` + ``per_token_s`` x (decode
    sequences + prompt tokens) + ``per_kv_token_s`` x (KV tokens read + prompt tokens)."""

    overhead_s: float
    per_token_s: float
    per_kv_token_s: float
    layers: int

    def seconds(self, p: StepPoint) -> float:
        """The fitted step time of a measured point."""
        return (self.overhead_s + self.per_token_s * (p.decode_seqs + p.prefill_tokens)
                + self.per_kv_token_s * (p.context_tokens + p.prefill_tokens))


def nonnegative_least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]
                              ) -> tuple[float, ...]:
    """The x >= 0 that minimises ||rows x - y||: exact, by enumerating the active sets.

    Clipping an unconstrained fit's negative coefficients to 0 is not this: the others keep
    values fitted beside the clipped one (on the CPU profile of bench/capacity_band.py the KV
    term came out negative and the overhead stayed 13.0 ms, where a refit without the term
    gives ~8.9 ms). By the KKT conditions the optimum is the unconstrained least-squares fit on
    its own support (its free coefficients' gradient is 0), so among every subset of columns
    left free (the rest at 0) whose least-squares fit is non-negative, the least residual is
    the optimum. Where a subset's columns are dependent, a non-negative fit of equal residual
    exists on a smaller subset, which the enumeration also tries. 2^columns fits: for the few
    coefficients of a step model, not a general solver (scipy, which has one, is not a
    dependency)."""
    a, b = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    columns = a.shape[1]
    best, best_residual = np.zeros(columns), float(b @ b)  # every coefficient 0
    for support in range(1, 1 << columns):
        free = [j for j in range(columns) if support >> j & 1]
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if (sol < 0).any():
            continue
        x = np.zeros(columns)
        x[free] = sol
        r = a @ x - b
        if float(r @ r) < best_residual:
            best, best_residual = x, float(r @ r)
    return tuple(float(c) for c in best)


def fit_steps(points: tuple[StepPoint, ...], layers: int) -> StepFit | None:
    """Non-negative least-squares fit of the steps (:func:`nonnegative_least_squares`), or None
    where the points cannot pin three coefficients: fewer than three, or no prompt step, or no
    decode step, or no per-token cost left."""
    if len(points) < 3 or not any(p.prefill_tokens for p in points) or not any(
            p.decode_seqs and not p.prefill_tokens for p in points):
        return None
    rows = [[1.0, p.decode_seqs + p.prefill_tokens, p.context_tokens + p.prefill_tokens]
            for p in points]
    over, per_token, per_kv = nonnegative_least_squares(rows, [p.seconds for p in points])
    return StepFit(over, per_token, per_kv, layers) if per_token > 0 else None


def stage_coeffs(fit: StepFit, layers: int, hidden: int) -> StageCoeffs:
    """Coefficients of a stage holding ``layers`` layers: the per-token terms in proportion to
    the layers, the engine overhead whole (it is per step, as the calibration's), additive
    (overlap 1), the hand-off's activations ``hidden`` x 2 bytes a token as the roofline's."""
    share = layers / fit.layers
    return StageCoeffs(flops_per_token=fit.per_token_s * share, lm_head_flops=0.0,
                       attn_flops=0.0, flops=1.0, attn_flops_rate=1.0, dense_bytes=0.0,
                       expert_bytes=0.0, expert_pick=0.0, weight_bw=1.0,
                       kv_bytes_per_token=fit.per_kv_token_s * share, kv_bw=1.0, overlap=1.0,
                       floor_s=0.0, comm_alpha_s=0.0, comm_s_per_token=0.0,
                       hidden_bytes=hidden * 2.0, overhead_s=fit.overhead_s)


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def measured_step_model(profiles: Iterable[MeasuredProfile],
                        base: Callable[[int], StageCoeffs], overhead_s: float
                        ) -> StepFit | float:
    """The step model of (arch, gpu, tp) from its measured profiles: a :class:`StepFit` of the
    profile with the most steps where it describes them better than the scaled roofline, else
    the roofline's correction, the median measured ÷ model ratio over every measured step (1.0
    without any). ``base(layers)``: the roofline's coefficients of a stage of ``layers``;
    ``overhead_s``: the calibration's engine overhead per step."""
    ratios: list[float] = []
    richest: MeasuredProfile | None = None
    for profile in profiles:
        c = base(profile.layers)
        ratios += [p.seconds / _roofline(c, p, overhead_s) for p in profile.step_latency]
        if profile.step_latency and (richest is None or len(profile.step_latency) > len(
                richest.step_latency)):
            richest = profile
    if not ratios or richest is None:
        return 1.0
    correction = _median(ratios)
    fit = fit_steps(richest.step_latency, richest.layers)
    if fit is None:
        return correction
    c = base(richest.layers)
    scaled = _median([abs(math.log(correction * _roofline(c, p, overhead_s) / p.seconds))
                      for p in richest.step_latency])
    fitted = _median([abs(math.log(max(fit.seconds(p), 1e-12) / p.seconds))
                      for p in richest.step_latency])
    return fit if fitted < scaled else correction


def _roofline(c: StageCoeffs, p: StepPoint, overhead_s: float) -> float:
    """The roofline's step time of a measured point (one stage, no hand-off)."""
    return step_time(c, p.decode_seqs, p.prefill_tokens, p.context_tokens,
                     p.prefill_tokens / 2.0, overhead_s, 1, 0.0, 1.0)
