"""Stage 2: integer replicas per (template, partition of each stage) at least cost.

:func:`allocate` prepares the data (:func:`coral_solver.allocate_data.prepare`), builds the
model once (:func:`coral_solver.allocate_model.build_model`) and solves it with HiGHS (or, for a
site's ``policy.solver: pyomo:<name>``, the same model through Pyomo with that solver: every
phase on the whole model, none of the shortcuts below); :mod:`coral_solver.allocate_plan`
turns the solution into the plan:

1. **Served fraction** first: maximise phi, the smallest fraction of any model's demand served
   (deciding "all demand can be met" this way avoids a slow proof of infeasibility).
2. If phi = 1, **demand met**: minimise cost per hour + K × cost of stages beyond those running
   (K = start-up time ÷ re-plan interval).
3. Otherwise **scarce**, lexicographically: keeping phi, maximise the priority-weighted served
   demand; keeping both, minimise cost.

When models do not compete for GPUs, solving each alone and fixing the union is exact and much
faster on a large library (:func:`_decomposed`): tried first there
(``PER_MODEL_SHORTCUTS_MIN_TEMPLATES``). If the time limit ends a phase without a plan, the
previous phase's plan is returned (gap unknown), or a greedy one when there is none at all.

Speed comes from the formulation, exactly: availability removes templates that cannot fit; each
MIP is solved over the columns whose LP reduced cost is small, and the answer is accepted only
when the LP bound proves no excluded column could improve it (any plan using an excluded
column j costs ≥ z_LP + d_j); otherwise the restriction widens and the MIP is solved again.
Each phase after the first starts from the previous phase's plan (a MIP start, feasible because
the previous optimum is now a constraint it meets); the restriction then keeps every column that
could beat that start, so it certifies in one solve.

Before all this, :func:`coral_solver.allocate_bound.certified_restriction` tries a small
restriction proven by per-model relaxations. When its plan is found but not proven, it is not
thrown away: each model's own optimum on the whole cluster (:func:`_alone`) is a tighter bound
that often proves it; otherwise the whole model's cost phase starts from it (the served-fraction
phase skipped, since that plan serves every demand), and it is the answer, with its proven gap,
if the time runs out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from coral_solver.allocate_bound import Restricted, certified_restriction, lift_point
from coral_solver.allocate_data import Prepared, prepare
from coral_solver.allocate_highs import HighsSolver, SolveResult
from coral_solver.allocate_model import LinearModel, Stage2Model, build_model
from coral_solver.allocate_plan import assemble_plan, decode
from coral_solver.queue import queue_unplaced
from coral_solver.types import Cluster, ModelSpec, Plan, PlanRow, Policy, Template

#: relative slack when a phase's optimum becomes the next phase's constraint: as loose as HiGHS's
#: own feasibility tolerances (1e-7 primal, 1e-6 MIP), since the served amounts behind the
#: weighted optimum are continuous; at 1e-9 a phase-2 optimum reported 1e-6 high shut out the
#: cheapest plan of phase 3 (seen: 269.26 instead of 266.7, both "gap 0")
PHASE_TOLERANCE = 1e-6

#: HiGHS options for Stage 2's MIPs. The root reduced-cost heuristic's sub-MIPs took most of the
#: time of the scarce phases, which start from the previous phase's plan anyway
HIGHS_OPTIONS = {"mip_heuristic_run_root_reduced_cost": False}
#: and for the scarce cost phase (the last on its instance), which starts from the served phase's
#: plan: RINS/RENS sub-MIPs there mostly re-find plans of that cost (extended scarce bench inputs:
#: median 2.4 -> 1.8-2.1 s, worst 7.2 -> 4.3-5.3 s); in the served phase they pay for themselves
COST_PHASE_OPTIONS = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False}

#: share of the time limit the certified small restriction (solver.allocate_bound) may take
#: before the whole model is solved instead
CERTIFIED_SHARE = 0.4

#: the two per-model shortcuts — the certified restriction and the decomposition — pay a few
#: small MIPs per model (its relaxations or its own plan, ~3-10 ms each in HiGHS), the whole
#: model a cost that grows with its template columns: they are tried only when a model has
#: this many templates on average. Measured on 2 cores: the paper-scale library (6 models,
#: ~720 templates each after availability) re-plans 5-7× faster with them; a site day's 50
#: models with ~13 each took 3.8 s with both, 1.3 s with the decomposition only and 0.3 s with
#: neither (bench/results/stage_scale.md, scale_day.md)
PER_MODEL_SHORTCUTS_MIN_TEMPLATES = 100

#: when the restriction's plan is not proven: solve on from it (a start, each model's own
#: optimum as a tighter bound) rather than the whole model from nothing; off only to measure
#: the difference (bench/stage_scale.py)
START_FROM_RESTRICTED = True

#: below this share of a model's template columns, excluding columns is not worth a MIP's risk
MIN_EXCLUDED_SHARE = 0.1


@dataclass
class _Outcome:
    result: SolveResult
    bound: float  # bound proven for the full model (restriction certified)
    columns: int  # template columns the MIP kept


class _Runner:
    """Solves one objective over the model: restricted by reduced costs, certified, widened."""

    def __init__(self, sm: Stage2Model, policy: Policy, backend: str, deadline: float) -> None:
        self.sm = sm
        self.policy = policy
        self.backend = backend
        self.deadline = deadline
        self.highs = HighsSolver(sm.lm, options=HIGHS_OPTIONS) if backend == "highs" else None
        self.pyomo = pyomo_name(backend)  # Pyomo's solver, None on HiGHS's matrix path
        self.col_lower = np.asarray(sm.lm.col_lower, float).copy()
        self.col_upper = np.asarray(sm.lm.col_upper, float).copy()
        self.row_bounds: dict[int, tuple[float, float]] = {}

    def left(self) -> float:
        return max(self.deadline - time.perf_counter(), 0.05)

    def set_col(self, col: int, lower: float, upper: float) -> None:
        self.col_lower[col], self.col_upper[col] = lower, upper
        if self.highs:
            self.highs.set_col_bounds([col], lower, upper)

    def set_row(self, row: int, lower: float, upper: float) -> None:
        self.row_bounds[row] = (lower, upper)
        self.sm.lm.row_lower[row], self.sm.lm.row_upper[row] = lower, upper
        if self.highs:
            self.highs.set_row_bounds(row, lower, upper)

    def minimise(self, cost: np.ndarray, start: np.ndarray | None = None) -> _Outcome:
        """min cost·x; ``start`` (a point feasible for this phase, e.g. the previous phase's
        optimum) is HiGHS's first incumbent, and its columns stay in the restriction."""
        gap = self.policy.mip_gap
        if self.pyomo is not None:
            from coral_solver.allocate_pyomo import solve_pyomo

            result = solve_pyomo(self.sm.lm, self.left(), gap, cost, self.col_lower, self.col_upper,
                                 solver=self.pyomo)
            return _Outcome(result, result.bound, len(self.sm.nu))
        highs = self.highs
        assert highs is not None  # every backend but pyomo is HiGHS, built in __init__
        highs.set_cost(cost)
        nu = self.sm.nu
        if not self.policy.prune or len(nu) == 0:
            result = highs.solve(self.left(), gap, start=start)
            return _Outcome(result, result.bound, len(nu))
        lp = highs.solve(self.left(), 0.0, relax=True)
        if lp.status == "infeasible":
            return _Outcome(lp, math.inf, 0)
        if lp.status != "optimal" or lp.reduced_costs is None:
            result = highs.solve(self.left(), gap, start=start)
            return _Outcome(result, result.bound, len(nu))
        assert lp.x is not None  # an optimal LP has its point
        reduced = lp.reduced_costs[nu]
        at_zero = lp.x[nu] <= 1e-9
        if start is not None:  # keeping more columns leaves the certificate below valid
            at_zero &= start[nu] <= 0.5
        sigma_cols = self.sm.sigma["sigma"]
        sigma_owner = np.array([j for j, _, _ in self.sm.sigma["keys"]], dtype=np.int64)
        scale = max(abs(lp.objective), 1e-6)
        delta = 0.08 * scale
        if start is not None:
            # keep every column that could beat the start: then the restricted optimum (no worse
            # than the start) certifies at once, instead of a second, wider MIP
            delta = max(delta, float(cost @ start) - lp.objective + 1e-9 * scale)
        upper = self.col_upper[nu].copy()
        try:
            while True:
                excluded = at_zero & (reduced > delta)
                if excluded.sum() < MIN_EXCLUDED_SHARE * (upper > 0).sum():
                    # a restriction this small barely shrinks the MIP but risks a second one
                    # when it fails to certify: solve the whole model once instead
                    excluded[:] = False
                highs.set_col_bounds(nu, 0.0, np.where(excluded, 0.0, upper))
                if len(sigma_cols):  # their stages go too: a smaller model for presolve
                    highs.set_col_bounds(sigma_cols, 0.0,
                                         np.where(excluded[sigma_owner], 0.0, math.inf))
                result = highs.solve(self.left(), gap, start=start)
                least = reduced[excluded].min() if excluded.any() else math.inf
                certified = lp.objective + least
                if result.status == "infeasible" and excluded.any():
                    delta = math.inf  # the restriction was too tight: use every column
                    continue
                if result.x is None:
                    return _Outcome(result, min(result.bound, certified), int((~excluded).sum()))
                if result.objective <= certified + 1e-9 * scale or not excluded.any():
                    return _Outcome(result, min(result.bound, certified), int((~excluded).sum()))
                if time.perf_counter() >= self.deadline:
                    return _Outcome(result, min(result.bound, certified), int((~excluded).sum()))
                # widen to every column that could still beat the incumbent; then it certifies
                delta = result.objective - lp.objective
                start = result.x  # feasible for the wider restriction too
        finally:
            highs.set_col_bounds(nu, 0.0, upper)
            if len(sigma_cols):
                highs.set_col_bounds(sigma_cols, 0.0, math.inf)


def allocate(
    models: list[ModelSpec],
    library: dict[str, list[Template]],
    cluster: Cluster,
    policy: Policy | None = None,
    backend: str = "highs",
    queue_library: dict[str, list[Template]] | None = None,
) -> Plan:
    """Stage 2: the least-cost plan meeting every demand, or the fairest when GPUs are scarce.

    ``backend`` is a site's ``policy.solver``: ``"highs"`` hands the matrix to HiGHS (with the
    exact column restriction when ``policy.prune``); ``"pyomo:<name>"`` builds the same model
    through Pyomo (full, slower) and solves it with Pyomo's solver ``<name>`` (``appsi_highs``,
    ``gurobi``, ``cplex``, ``scip`` …), or raises
    :class:`~coral_solver.allocate_pyomo.SolverUnavailable` naming it and how to install it.
    GPUs Slurm gives only after a wait (node groups with ``wait_s``) pay for the wait; a model
    left with no replica gets one queued where Slurm expects to start it first
    (:func:`coral_solver.queue.queue_unplaced`, ``Plan.queued``), from ``queue_library`` when given
    (a library not narrowed to what fits in the GPUs available now: a queued job waits for its
    nodes).
    """
    name = pyomo_name(backend)
    if name is not None:  # before any work: an unusable solver is the site's to fix
        from coral_solver.allocate_pyomo import pyomo_solver

        pyomo_solver(name)
    plan = _allocate(models, library, cluster, policy, backend)
    if plan.status in ("infeasible", "no_solution") and any(m.min_replicas for m in models) \
            and cluster.queue_options:
        # min_replicas that cannot all start now (a busy cluster, Slurm has said where jobs
        # would start): plan what can start, and queue the rest where Slurm starts them first,
        # instead of no plan at all
        relaxed = _most_min_replicas(models, library, cluster, policy, backend)
        if relaxed is not None:
            short = [m for m in models if relaxed.replicas(m.name) < m.min_replicas]
            plan = replace(relaxed, status="scarce", binding=relaxed.binding + tuple(
                f"model {m.name}: min_replicas {m.min_replicas} cannot all start now "
                f"({relaxed.replicas(m.name)} can); the rest are queued" for m in short))
    return queue_unplaced(plan, models, library if queue_library is None else queue_library,
                          cluster)


class SolverUnavailable(RuntimeError):
    """``policy.solver: pyomo:<name>`` names a solver Pyomo cannot use on this host (raised by
    :func:`allocate` before any work, the message naming it and how to install it)."""


def pyomo_name(backend: str) -> str | None:
    """The Pyomo solver of ``backend`` (``"pyomo:gurobi"`` → ``"gurobi"``); None for HiGHS's
    matrix path (``"highs"``). Any other form is a ValueError naming the valid ones."""
    if backend == "highs":
        return None
    kind, _, name = backend.partition(":")
    if kind != "pyomo" or not name:
        raise ValueError(f"solver {backend!r}: expected 'highs' or 'pyomo:<name>' (a Pyomo "
                         "SolverFactory name, e.g. pyomo:appsi_highs, pyomo:gurobi)")
    return name


def _most_min_replicas(models, library, cluster: Cluster, policy: Policy | None,
                       backend: str) -> Plan | None:
    """The plan with as many of each model's ``min_replicas`` as can start now: models in
    priority order, each raised as far as it stays feasible with those before it. None when
    even no minimum at all has a plan."""
    current = [replace(m, min_replicas=0) for m in models]
    best = _allocate(current, library, cluster, policy, backend)
    if best.status in ("infeasible", "no_solution"):
        return None
    for i in sorted(range(len(models)), key=lambda i: (-models[i].priority, models[i].name)):
        for k in range(models[i].min_replicas, 0, -1):
            if best.replicas(models[i].name) >= k:
                current[i] = replace(current[i], min_replicas=k)
                break
            trial = current[:i] + [replace(current[i], min_replicas=k)] + current[i + 1:]
            plan = _allocate(trial, library, cluster, policy, backend)
            if plan.status not in ("infeasible", "no_solution"):
                current, best = trial, plan
                break
    return best


def _allocate(
    models: list[ModelSpec],
    library: dict[str, list[Template]],
    cluster: Cluster,
    policy: Policy | None = None,
    backend: str = "highs",
) -> Plan:
    began = time.perf_counter()
    policy = policy if policy is not None else Policy()
    data = prepare(models, library, cluster, policy)
    shortcuts = len(data.templates) >= PER_MODEL_SHORTCUTS_MIN_TEMPLATES * len(data.models)
    restricted, alone = None, None
    if backend == "highs" and policy.prune and shortcuts:
        proven, restricted, alone = _shortcuts(models, library, cluster, policy, data, began)
        if proven is not None:
            return proven
    sm = build_model(data)
    runner = _Runner(sm, policy, backend, began + policy.time_limit_s)
    served = sm.demand["served"]
    phases: dict[str, float] = {}
    outcome = None
    if backend == "highs" and policy.prune and shortcuts and len(data.models) > 1:
        outcome = _decomposed(data, sm, runner, library, cluster, policy, alone)
    status = "optimal"
    if outcome is None and restricted is not None:
        outcome = _from_restricted(restricted, sm, runner)
    if outcome is None:
        # First the largest fraction of every demand that can be served together (phi): this
        # decides "demand met" without a slow proof that demand cannot be met.
        phi = sm.demand["phi"]
        runner.set_col(phi, 0.0, 1.0)
        objective = np.zeros(sm.lm.num_cols)
        objective[phi] = -1.0
        first = runner.minimise(objective)
        if first.result.x is None:
            return _fallback(models, library, cluster, policy, data, first.result.status, began)
        best_phi = float(first.result.x[phi])
        outcome = _meet_every_demand(runner, first, best_phi)
        if outcome is None:
            status = "scarce"
            phases["min_served_fraction"] = best_phi
            outcome = _serve_most(runner, data, first, best_phi, phases)
    result = outcome.result
    if result.x is None:
        return _empty(data, result.status, time.perf_counter() - began, outcome)
    gap = abs(result.objective - outcome.bound) / max(abs(result.objective), 1e-9)
    if status == "optimal" and (result.status != "optimal" or gap > policy.mip_gap + 1e-12):
        status = "feasible"
    rows = decode(sm, result.x)
    phases["objective"] = float(result.objective)
    phases["bound"] = float(outcome.bound)
    solved = dict(zip((m.name for m in data.models), result.x[served]))
    return assemble_plan(data, rows, status, gap, time.perf_counter() - began, phases, solved)


def _shortcuts(models: list[ModelSpec], library: dict[str, list[Template]], cluster: Cluster,
               policy: Policy, data: Prepared, began: float
               ) -> tuple[Plan | None, Restricted | None, _Alone | None]:
    """A plan proven optimal without the whole model, if one is: every demand met on a small
    restriction, proven by per-model relaxations or by each model's own optimum. Otherwise
    (None, the restriction to start from, the per-model optima) for the whole model."""
    restricted = certified_restriction(models, library, cluster, policy, data,
                                       began + CERTIFIED_SHARE * policy.time_limit_s)
    if restricted is not None and restricted.proven:
        return _certified_plan(restricted, policy, began), None, None
    if not START_FROM_RESTRICTED:
        restricted = None
    alone = None
    if restricted is not None and len(data.models) > 1:
        # the per-model relaxations were too weak to prove the restricted plan: each model's
        # own optimum on the whole cluster is a tighter bound, and often proves it without the
        # whole model (which the decomposition then does not solve again)
        alone = _alone(data, library, cluster, policy, began + policy.time_limit_s)
        if alone is not None:
            z = float(restricted.result.objective)
            bound = max(alone.bound, restricted.bound)
            if z - bound <= policy.mip_gap * max(abs(z), 1e-9):
                proven = replace(restricted, bound=min(bound, z), proven=True)
                return _certified_plan(proven, policy, began), None, None
            restricted = replace(restricted, bound=min(bound, z))
    return None, restricted, alone


def _meet_every_demand(runner: _Runner, first: _Outcome, best_phi: float) -> _Outcome | None:
    """The least cost with every demand served, when phase 1 found that possible; None when
    it is not (or the cost phase proved it infeasible after all)."""
    sm, policy = runner.sm, runner.policy
    if best_phi < 1.0 - policy.mip_gap - PHASE_TOLERANCE:
        return None
    runner.set_col(sm.demand["phi"], 1.0, 1.0)
    outcome = runner.minimise(sm.cost, start=first.result.x)
    if outcome.result.status == "infeasible":
        return None
    if outcome.result.x is None:  # out of time: the phase-1 plan serves every demand
        return (_Outcome(first.result, -math.inf, outcome.columns)
                if best_phi >= 1.0 - PHASE_TOLERANCE else None)
    return outcome


def _serve_most(runner: _Runner, data: Prepared, first: _Outcome, best_phi: float,
                phases: dict[str, float]) -> _Outcome:
    """GPUs are scarce: keep the best served fraction, then the most priority-weighted demand
    served, then the least cost (each phase's optimum a constraint of the next)."""
    sm = runner.sm
    served, weighted = sm.demand["served"], sm.demand["weighted"]
    runner.set_col(sm.demand["phi"], max(best_phi - PHASE_TOLERANCE, 0.0), 1.0)
    objective = np.zeros(sm.lm.num_cols)
    objective[served] = [-m.priority for m in data.models]
    second = runner.minimise(objective, start=first.result.x)
    best = second.result if second.result.x is not None else first.result
    assert best.x is not None  # the phase-1 point was checked by the caller
    best_weighted = float(np.dot([m.priority for m in data.models], best.x[served]))
    phases["weighted_served"] = best_weighted
    runner.set_row(weighted,
                   best_weighted - PHASE_TOLERANCE * max(1.0, abs(best_weighted)), math.inf)
    if runner.highs:
        runner.highs.set_options(COST_PHASE_OPTIONS)
    outcome = runner.minimise(sm.cost, start=best.x)
    if outcome.result.x is None:  # out of time: keep the best served plan found
        outcome = _Outcome(best, -math.inf, outcome.columns)
    return outcome


def _from_restricted(restricted: Restricted, sm: Stage2Model, runner: _Runner) -> _Outcome:
    """The cost phase of the whole model started from the restricted plan: that plan serves
    every demand, so the served-fraction phase is skipped; it is HiGHS's first incumbent (and
    the answer if the time runs out), and the bound proven on the restriction's way counts."""
    assert restricted.result.x is not None  # a restriction is returned only with its point
    start = lift_point(restricted.sm, restricted.result.x, sm)
    phi = sm.demand["phi"]
    start[phi] = 1.0
    runner.set_col(phi, 1.0, 1.0)
    outcome = runner.minimise(sm.cost, start=start)
    objective = float(sm.cost @ start)
    bound = max(outcome.bound, restricted.bound)
    scale = max(abs(objective), 1e-9)
    found = outcome.result
    if found.x is not None and found.objective <= objective + 1e-9 * scale:
        return _Outcome(found, bound, outcome.columns)
    if not feasible(sm.lm, start, runner.col_lower, runner.col_upper):
        return _Outcome(found, bound, outcome.columns)
    # out of time (or no better plan): the start is the answer, proven as far as the bound goes
    bound = min(bound, objective)
    proven = objective - bound <= runner.policy.mip_gap * scale + 1e-9
    kept = SolveResult("optimal" if proven else "feasible", start, objective, bound,
                       (objective - bound) / scale, found.seconds)
    return _Outcome(kept, bound, outcome.columns)


def feasible(lm: LinearModel, x: np.ndarray, col_lower: np.ndarray, col_upper: np.ndarray,
             tol: float = 1e-6) -> bool:
    """Whether ``x`` meets every row, the column bounds given and integrality (checked, not
    assumed, before a lifted start becomes the answer)."""
    integer = np.asarray(lm.integer, dtype=bool)
    if (x < col_lower - tol).any() or (x > col_upper + tol).any() \
            or (np.abs(x[integer] - np.rint(x[integer])) > tol).any():
        return False
    activity = np.zeros(lm.num_rows)
    np.add.at(activity, np.asarray(lm.rows, dtype=np.int64),
              np.asarray(lm.vals) * x[np.asarray(lm.cols, dtype=np.int64)])
    scale = tol * np.maximum(1.0, np.abs(activity))
    return bool((activity >= np.asarray(lm.row_lower) - scale).all()
                and (activity <= np.asarray(lm.row_upper) + scale).all())


def _certified_plan(certified: Restricted, policy: Policy, began: float) -> Plan:
    """The plan of :func:`coral_solver.allocate_bound.certified_restriction`, with the gap proven
    against the whole model."""
    sm, result = certified.sm, certified.result
    assert result.x is not None  # certified only with a point
    objective = float(result.objective)
    gap = max(objective - certified.bound, 0.0) / max(abs(objective), 1e-9)
    status = "optimal" if gap <= policy.mip_gap + 1e-12 else "feasible"
    phases = {"objective": objective, "bound": float(certified.bound),
              "restricted_templates": float(certified.columns)}
    solved = dict(zip((m.name for m in sm.data.models), result.x[sm.demand["served"]]))
    return assemble_plan(sm.data, decode(sm, result.x), status, gap, time.perf_counter() - began,
                 phases, solved)


def _fallback(models, library, cluster: Cluster, policy: Policy, data: Prepared, word: str,
              began: float) -> Plan:
    """No plan from the solver within the time limit: a greedy plan (Cauchy-style) so the
    daemon still has something safe to act on, flagged with an unknown gap."""
    if word == "infeasible":
        return _empty(data, word, time.perf_counter() - began, None)
    from coral_solver.baselines import cauchy  # here: baselines builds on this module

    # the greedy plan knows aggregated replicas only: a model planned disaggregated-only gets
    # none from it and shows as unserved
    aggregated = {m: [t for t in ts if t.role == "both"] for m, ts in library.items()}
    plan = cauchy(models, aggregated, replace(cluster, running=()), policy)
    met = all(plan.served[m.name] >= m.demand_rps * (1 - 1e-9) for m in models)
    return replace(plan, status="feasible" if met else "scarce", gap=math.inf,
                   solve_seconds=time.perf_counter() - began,
                   binding=plan.binding + ("time limit: greedy plan, optimality unknown",))


@dataclass
class _Alone:
    """Every model's plan solved alone on the whole cluster: Σ of their proven bounds is a lower
    bound on the whole model's cost phase (each alone is a relaxation of its share: the other
    models' use of GPUs, quotas and the site's caps dropped); ``rows`` their union."""

    bound: float
    rows: list[PlanRow]


def _alone(data: Prepared, library, cluster: Cluster, policy: Policy,
           deadline: float) -> _Alone | None:
    """:class:`_Alone`, or None when some model alone has no proven optimum serving its demand
    (it cannot meet it, or the time ran out)."""
    bound = 0.0
    rows: list[PlanRow] = []
    for model in data.models:
        left = max(deadline - time.perf_counter(), 0.05)
        sub_policy = replace(policy, time_limit_s=max(left / 2, 0.05))
        sub = _allocate([model], {model.name: library.get(model.name, [])}, cluster, sub_policy)
        if sub.status != "optimal":
            return None
        bound += sub.phases.get("bound", sub.phases.get("objective", 0.0))
        rows += sub.rows
    return _Alone(bound, rows)


def _decomposed(data: Prepared, sm: Stage2Model, runner: _Runner, library, cluster: Cluster,
                policy: Policy, alone: _Alone | None = None) -> _Outcome | None:
    """Exact shortcut when models do not compete for GPUs: solve each model alone
    (:func:`_alone`, or ``alone`` when already solved), so Σ of their bounds is a lower bound
    on the whole; then fix the union of their replica counts in the whole model. If that is
    feasible at (within the gap of) the bound, it is optimal for the whole. Otherwise None: the
    caller solves the whole model."""
    if alone is None:
        alone = _alone(data, library, cluster, policy, runner.deadline)
        if alone is None:
            return None
    index = {t.id: j for j, t in enumerate(data.templates)}
    counts = np.zeros(len(sm.nu))
    bound = alone.bound
    for row in alone.rows:
        j = index.get(row.template.id)
        if j is None:
            return None
        counts[j] += row.count
    highs = runner.highs
    assert highs is not None  # the caller decomposes on the HiGHS backend only
    upper = runner.col_upper[sm.nu].copy()
    highs.set_col_bounds(sm.nu, counts, counts)
    try:
        result = highs.solve(runner.left(), policy.mip_gap)
    finally:
        highs.set_col_bounds(sm.nu, 0.0, upper)
    if result.x is None:
        return None
    if result.objective - bound > policy.mip_gap * max(abs(result.objective), 1e-9) + 1e-9:
        return None
    return _Outcome(result, min(bound, result.objective), len(sm.nu))


def _empty(data: Prepared, word: str, seconds: float, outcome: _Outcome | None) -> Plan:
    status = "infeasible" if word == "infeasible" else "no_solution"
    plan = assemble_plan(data, [], status, math.inf, seconds, {})
    reasons = list(plan.binding)
    for model in data.models:
        if model.min_replicas:
            reasons.append(f"model {model.name}: min_replicas {model.min_replicas} cannot be "
                           "placed")
    return replace(plan, binding=tuple(reasons))
