"""The fast path: a :class:`~coral_solver.allocate_model.LinearModel` handed to HiGHS as a matrix.

One persistent ``highspy.Highs`` per model: the scarce-demand phases and the column restriction
change costs and bounds in place instead of rebuilding anything.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import highspy
import numpy as np

from coral_solver.allocate_model import LinearModel


@dataclass
class SolveResult:
    """One HiGHS solve: status in words, the point, objective, proven bound and gap."""

    status: str  # "optimal" | "feasible" (limit hit with a solution) | "infeasible" | "no_solution"
    x: np.ndarray | None
    objective: float
    bound: float
    gap: float
    seconds: float
    reduced_costs: np.ndarray | None = None


def _gap(objective: float, bound: float) -> float:
    if not np.isfinite(objective) or not np.isfinite(bound):
        return float("inf")
    return abs(objective - bound) / max(abs(objective), 1e-9)


_BANNER_SHOWN = False


def _new_highs() -> highspy.Highs:
    """A Highs instance. HiGHS prints its banner on stdout from C++ at the first construction in
    a process (``output_flag`` can only be set after it): that would corrupt ``--json`` output
    and clutter every ``plan``, so that one construction writes to /dev/null."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        return highspy.Highs()
    _BANNER_SHOWN = True
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class HighsSolver:
    """min cost·x over a LinearModel, solved by HiGHS; costs and bounds mutable between solves."""

    def __init__(self, lm: LinearModel, seed: int = 0, options: dict | None = None) -> None:
        self.lm = lm
        self.h = _new_highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("random_seed", seed)
        for name, value in (options or {}).items():
            self.h.setOptionValue(name, value)
        inf = self.h.getInfinity()
        lp = highspy.HighsLp()
        lp.num_col_ = lm.num_cols
        lp.num_row_ = lm.num_rows
        lp.col_cost_ = np.asarray(lm.cost, float)
        lp.col_lower_ = np.clip(np.asarray(lm.col_lower, float), -inf, inf)
        lp.col_upper_ = np.clip(np.asarray(lm.col_upper, float), -inf, inf)
        lp.row_lower_ = np.clip(np.asarray(lm.row_lower, float), -inf, inf)
        lp.row_upper_ = np.clip(np.asarray(lm.row_upper, float), -inf, inf)
        start, index, value = lm.csc()
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = index
        lp.a_matrix_.value_ = value
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
            for i in lm.integer
        ]
        self.h.passModel(lp)
        self._inf = inf
        self.col_lower = np.asarray(lm.col_lower, float).copy()
        self.col_upper = np.asarray(lm.col_upper, float).copy()
        self.cost = np.asarray(lm.cost, float).copy()
        self.starts_rejected = 0  # MIP starts whose reported objective did not match the point

    def set_options(self, options: dict) -> None:
        """HiGHS options for the solves that follow on this instance."""
        for name, value in options.items():
            self.h.setOptionValue(name, value)

    def set_cost(self, cost: np.ndarray) -> None:
        idx = np.arange(self.lm.num_cols, dtype=np.int32)
        self.cost = np.asarray(cost, float).copy()
        self.h.changeColsCost(len(idx), idx, self.cost)

    def set_col_bounds(self, cols, lower, upper) -> None:
        cols = np.atleast_1d(np.asarray(cols, dtype=np.int32))
        lower = np.broadcast_to(np.asarray(lower, float), cols.shape)
        upper = np.broadcast_to(np.asarray(upper, float), cols.shape)
        self.col_lower[cols] = lower
        self.col_upper[cols] = upper
        self.h.changeColsBounds(len(cols), cols, np.clip(lower, -self._inf, self._inf),
                                np.clip(upper, -self._inf, self._inf))

    def set_row_bounds(self, row: int, lower: float, upper: float) -> None:
        self.h.changeRowBounds(int(row), max(lower, -self._inf), min(upper, self._inf))

    def solve(self, time_limit: float, gap: float, relax: bool = False,
              start: np.ndarray | None = None) -> SolveResult:
        """Solve as a MIP (or its LP relaxation with ``relax``) within ``time_limit`` seconds.

        ``start``: a point believed feasible, given to HiGHS as its first incumbent (it checks
        feasibility itself and ignores an infeasible one). With HiGHS 1.16, ``setSolution``
        after a cost change was once seen to report an objective that did not match the returned
        point, so the answer is checked: the objective is recomputed from the point, and on any
        mismatch the solve is repeated cold."""
        began = time.perf_counter()
        if start is not None and not relax:
            result = self._run(time_limit, gap, relax, start)
            if result.x is None or abs(result.objective - float(self.cost @ result.x)) <= \
                    1e-7 * max(1.0, abs(result.objective)):
                return result
            self.starts_rejected += 1
            time_limit = max(time_limit - (time.perf_counter() - began), 0.01)
        return self._run(time_limit, gap, relax, None)

    def _run(self, time_limit: float, gap: float, relax: bool,
             start: np.ndarray | None) -> SolveResult:
        h = self.h
        limit = max(float(time_limit), 0.01)
        if relax:
            # HiGHS 1.16 checks an LP's time limit against the instance's run clock, which adds
            # up over every earlier run (a MIP's limit counts from its own start): without this
            # an LP late in a re-solve stops at once with "time limit" and no bound
            limit += h.getRunTime()
        h.setOptionValue("time_limit", limit)
        h.setOptionValue("mip_rel_gap", float(gap))
        h.setOptionValue("solve_relaxation", bool(relax))
        h.clearSolver()
        if start is not None:
            # clipped into the current bounds: a start that then breaks a row is ignored by HiGHS
            point = np.clip(np.asarray(start, float), self.col_lower, self.col_upper)
            idx = np.arange(self.lm.num_cols, dtype=np.int32)
            h.setSolution(len(idx), idx, point)
        began = time.perf_counter()
        h.run()
        seconds = time.perf_counter() - began
        status = h.getModelStatus()
        info = h.getInfo()
        has_point = info.primal_solution_status == 2  # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value) if has_point else None
        objective = info.objective_function_value if has_point else float("inf")
        if relax:
            bound = objective
        else:
            bound = info.mip_dual_bound
        Status = highspy.HighsModelStatus
        if status == Status.kOptimal:
            word = "optimal"
        elif status in (Status.kInfeasible,):
            word = "infeasible"
        elif has_point:
            word = "feasible"
        else:
            word = "no_solution"
        reduced = None
        if relax and word == "optimal":
            reduced = np.asarray(h.getSolution().col_dual)
        return SolveResult(word, x, objective, bound, _gap(objective, bound) if not relax else 0.0,
                           seconds, reduced)

