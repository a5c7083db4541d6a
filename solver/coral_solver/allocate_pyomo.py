"""The reference path: the same :class:`~coral_solver.allocate_model.LinearModel` as a Pyomo model.

Variables and constraints keep the definition's family names and labels
(``nu[template]``, ``sigma[template, gpu, partition]``, ``cover[model]`` …) so a reader can print
or inspect the model. Solved by HiGHS through Pyomo's APPSI interface. Building through Pyomo is
slower than the matrix hand-off, which is why :mod:`coral_solver.allocate` uses that by default; the
tests check both reach the same optimum.
"""

from __future__ import annotations

import time

import numpy as np
import pyomo.environ as pyo
from pyomo.contrib.appsi.base import TerminationCondition
from pyomo.contrib.appsi.solvers import Highs
from pyomo.core.expr.numeric_expr import LinearExpression

from coral_solver.allocate_highs import SolveResult, _gap
from coral_solver.allocate_model import LinearModel


def _bound(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def to_pyomo(lm: LinearModel, cost: np.ndarray | None = None,
             col_lower: np.ndarray | None = None, col_upper: np.ndarray | None = None):
    """Build a Pyomo ConcreteModel of ``lm`` (optionally with other costs or column bounds)."""
    cost = np.asarray(lm.cost if cost is None else cost, float)
    lower = np.asarray(lm.col_lower if col_lower is None else col_lower, float)
    upper = np.asarray(lm.col_upper if col_upper is None else col_upper, float)
    model = pyo.ConcreteModel(name="coral_stage2")
    column: list = [None] * lm.num_cols
    for family in lm.var_families.values():
        labels = family.labels
        if labels == [()]:
            var = pyo.Var()
            setattr(model, family.name, var)
            items = [((), var)]
        else:
            var = pyo.Var(labels, dense=True)
            setattr(model, family.name, var)
            items = [(label, var[label]) for label in labels]
        for offset, (_, v) in enumerate(items):
            col = family.start + offset
            v.domain = pyo.Integers if lm.integer[col] else pyo.Reals
            v.setlb(_bound(lower[col]))
            v.setub(_bound(upper[col]))
            column[col] = v
    start, index, value = lm.csc()
    # row-wise view for building expressions
    rows_of = np.repeat(np.arange(lm.num_cols), np.diff(start))
    order = np.argsort(index, kind="stable")
    row_sorted = index[order]
    row_start = np.searchsorted(row_sorted, np.arange(lm.num_rows + 1))
    for family in lm.row_families.values():
        where = family.index()

        def rule(m, *label, _where=where):
            r = _where[() if label in ((), (None,)) else label]
            span = order[row_start[r]:row_start[r + 1]]
            expr = LinearExpression(constant=0, linear_coefs=list(value[span]),
                                    linear_vars=[column[c] for c in rows_of[span]])
            lo, hi = _bound(lm.row_lower[r]), _bound(lm.row_upper[r])
            if lo is None and hi is None:
                return pyo.Constraint.Skip
            return pyo.inequality(lo, expr, hi) if lo != hi else expr == lo
        labels = family.labels
        constraint = pyo.Constraint(rule=rule) if labels == [()] else pyo.Constraint(labels, rule=rule)
        setattr(model, family.name + "_c", constraint)
    nz = np.nonzero(cost)[0]
    model.objective = pyo.Objective(
        expr=LinearExpression(constant=0, linear_coefs=list(cost[nz]),
                              linear_vars=[column[c] for c in nz]),
        sense=pyo.minimize,
    )
    model._columns = column
    return model


def solve_pyomo(lm: LinearModel, time_limit: float, gap: float, cost: np.ndarray | None = None,
                col_lower: np.ndarray | None = None,
                col_upper: np.ndarray | None = None) -> SolveResult:
    """Build through Pyomo and solve with HiGHS (APPSI); the result in the matrix path's terms."""
    began = time.perf_counter()
    model = to_pyomo(lm, cost, col_lower, col_upper)
    solver = Highs()
    solver.config.time_limit = float(time_limit)
    solver.config.mip_gap = float(gap)
    solver.config.stream_solver = False
    solver.config.load_solution = False
    result = solver.solve(model)
    seconds = time.perf_counter() - began
    condition = result.termination_condition
    if condition == TerminationCondition.infeasible:
        return SolveResult("infeasible", None, float("inf"), float("inf"), float("inf"), seconds)
    if result.best_feasible_objective is None:
        return SolveResult("no_solution", None, float("inf"), result.best_objective_bound,
                           float("inf"), seconds)
    result.solution_loader.load_vars()
    x = np.array([v.value if v.value is not None else 0.0 for v in model._columns])
    objective = float(result.best_feasible_objective)
    bound = float(result.best_objective_bound)
    word = "optimal" if condition == TerminationCondition.optimal else "feasible"
    return SolveResult(word, x, objective, bound, _gap(objective, bound), seconds)
