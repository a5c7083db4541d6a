"""The reference path: the same :class:`~coral_solver.allocate_model.LinearModel` as a Pyomo model.

Variables and constraints keep the definition's family names and labels
(``nu[template]``, ``sigma[template, gpu, partition]``, ``cover[model]`` …) so a reader can print
or inspect the model. Solved by any solver Pyomo's ``SolverFactory`` drives (``appsi_highs``,
``highs``; ``gurobi``, ``cplex``, ``scip`` where a site has them): ``policy.solver:
pyomo:<name>``. Building through Pyomo is slower than the matrix hand-off, which is why
:mod:`coral_solver.allocate` uses that by default; the tests check both reach the same optimum.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pyomo.environ as pyo
from pyomo.core.expr.numeric_expr import LinearExpression
from pyomo.opt import TerminationCondition
from pyomo.opt.base.solvers import UnknownSolver
from pyomo.solvers.plugins.solvers.persistent_solver import PersistentSolver

from coral_solver.allocate import SolverUnavailable
from coral_solver.allocate_highs import SolveResult, _gap
from coral_solver.allocate_model import LinearModel

#: the option names for Stage 2's time limit and relative MIP gap, per solver family (the
#: SolverFactory name without ``appsi_`` and before any ``_direct``/``_persistent``). A solver
#: not listed here runs with its own defaults: no time limit, its own gap
LIMIT_OPTIONS: dict[str, tuple[str, str]] = {
    "highs": ("time_limit", "mip_rel_gap"),
    "gurobi": ("TimeLimit", "MIPGap"),
    "cplex": ("timelimit", "mip_tolerances_mipgap"),
    "scip": ("limits/time", "limits/gap"),
    "cbc": ("sec", "ratio"),
    "glpk": ("tmlim", "mipgap"),
}

#: how a site gets each family onto the daemon's host (INSTALL.md, "Licensed solvers")
INSTALL_HINTS: dict[str, str] = {
    "highs": "pip install highspy in the daemon's venv",
    "gurobi": "pip install gurobipy in the daemon's venv (pyomo:gurobi_direct, "
              "pyomo:gurobi_persistent) or put Gurobi's gurobi.sh on PATH (pyomo:gurobi), and "
              "set its licence (GRB_LICENSE_FILE)",
    "cplex": "pip install cplex in the daemon's venv (pyomo:cplex_direct) or put the cplex "
             "executable of CPLEX Studio on PATH (pyomo:cplex), licensed",
    "scip": "put a scip executable built with its AMPL interface on PATH (conda-forge's scip "
            "package has one)",
    "cbc": "put the cbc executable on PATH (coinor-cbc)",
    "glpk": "put glpsol on PATH (glpk-utils)",
}


def family(name: str) -> str:
    """The solver family of a SolverFactory name: ``appsi_highs`` and ``highs`` → ``highs``,
    ``gurobi_direct`` → ``gurobi``."""
    return name.removeprefix("appsi_").split("_")[0]


def pyomo_solver(name: str):
    """Pyomo's solver ``name``, ready to solve, or :class:`SolverUnavailable` naming it and
    how to install it."""
    quiet = logging.getLogger("pyomo")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # an unknown name: Pyomo logs a warning with a traceback
    try:
        solver = pyo.SolverFactory(name)
        unknown = isinstance(solver, UnknownSolver)
        available = not unknown and bool(solver.available(exception_flag=False))
    except Exception as exc:  # a plugin that cannot even be created (a broken install)
        unknown, available, why = False, False, f"{type(exc).__name__}: {exc}"
    else:
        why = ("Pyomo knows no solver by that name (pyomo help --solvers lists them)" if unknown
               else "Pyomo knows it, but it is not installed or not licensed on this host")
    finally:
        quiet.setLevel(level)
    if not available:
        hint = INSTALL_HINTS.get(family(name), "install the solver and its Python interface "
                                 "in the daemon's venv")
        raise SolverUnavailable(
            f"policy.solver pyomo:{name}: {why}; to use it: {hint} (INSTALL.md, \"Licensed "
            f"solvers\"); or set policy.solver: highs")
    return solver


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
                col_lower: np.ndarray | None = None, col_upper: np.ndarray | None = None,
                solver: str = "appsi_highs") -> SolveResult:
    """Build through Pyomo and solve with Pyomo's ``solver``; the result in the matrix path's
    terms. The time limit and gap reach the solvers of :data:`LIMIT_OPTIONS`."""
    began = time.perf_counter()
    model = to_pyomo(lm, cost, col_lower, col_upper)
    cost = np.asarray(lm.cost if cost is None else cost, float)
    opt = pyomo_solver(solver)
    names = LIMIT_OPTIONS.get(family(solver))
    if names is not None:
        limit = max(float(time_limit), 0.05)
        opt.options[names[0]] = math.ceil(limit) if family(solver) == "glpk" else limit
        opt.options[names[1]] = float(gap)
    if isinstance(opt, PersistentSolver):  # gurobi_persistent, …: given the model first
        opt.set_instance(model)
    result = opt.solve(model, load_solutions=False, tee=False)
    seconds = time.perf_counter() - began
    condition = result.solver.termination_condition
    if condition in (TerminationCondition.infeasible, TerminationCondition.infeasibleOrUnbounded):
        return SolveResult("infeasible", None, math.inf, math.inf, math.inf, seconds)
    bound = _finite(result.problem.lower_bound)
    if len(result.solution) == 0:
        return SolveResult("no_solution", None, math.inf,
                           -math.inf if bound is None else bound, math.inf, seconds)
    model.solutions.load_from(result)
    x = np.array([v.value if v.value is not None else 0.0 for v in model._columns])
    objective = float(cost @ x)
    optimal = condition == TerminationCondition.optimal
    if bound is None:  # not every interface reports one: optimal means proven within its gap
        bound = objective if optimal else -math.inf
    word = "optimal" if optimal else "feasible"
    return SolveResult(word, x, objective, bound, _gap(objective, bound), seconds)


def _finite(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
