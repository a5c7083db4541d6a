"""Stage 2's fast exact path when demand can be met: a small restriction, certified by
per-model relaxations.

Why: on the paper's extended library (thousands of templates, prefill/decode roles, two regions)
the LP relaxation of Stage 2 is weak — integer replicas of large templates leave a 15-30 % gap —
so the LP reduced-cost restriction of :mod:`coral_solver.allocate` rarely certifies and falls
back to MIPs over every column (seconds each). Models are coupled only through GPUs (packing,
quotas) and the site's job and KV-fabric caps; without those, Stage 2 splits into one small
problem per model, and that relaxation is tight in practice (the GPUs a cheap plan needs are
rarely what binds its cost).

The method, for the cost phase (phi = 1: every demand served):

1. **Relaxation R_m per model** (:func:`relaxed_bound`): model m's replicas with no GPU, quota,
   job or fabric limit, each replica priced at its cheapest allowed partitions, the start-up
   penalty K charged on stages beyond those running of the same template (convex, so a lower
   bound on the full model's churn cost). Its optimum LB_m is found exactly on a handful of
   columns: a template j that runs nowhere is dropped from R_m when another template i of the
   same model and role serves at least as much (min(T_i, D_m) ≥ min(T_j, D_m)) at no higher
   cheapest cost — swapping each replica of j for one of i keeps every row of R_m satisfied
   (coverage ≥, replica count equal) and costs no more, since a new replica of i costs at most
   (1+K)·c_i ≤ (1+K)·c_j. LB = Σ_m LB_m ≤ the full optimum (the full model only adds rows and
   non-negative wait costs).
2. **Restriction**: the full Stage-2 model (the same
   :func:`coral_solver.allocate_model.build_model`) over the templates on those fronts *with
   ties kept* (another region's identical copy is what lets the plan fit) and every running
   template; solved by HiGHS → plan z with its own proven bound b_K (valid for every plan using
   only those templates).
3. **Certificate**: a plan using an excluded template of model m costs at least
   B_m = Σ_{m'≠m} LB_{m'} + LB_m^E, where LB_m^E is R_m's optimum with "some excluded template
   of m is used" added (front pruning then applies within the excluded and within the kept
   templates separately, which the same swap argument allows). So the full optimum is
   ≥ max(LB, min(b_K, min_m B_m)), and z is accepted when within ``policy.mip_gap`` of it; the
   gap reported is that one. B_m is computed only when LB alone does not certify.
4. Otherwise the excluded templates that R_m^E used join the restriction and steps 2-3 repeat
   (a few rounds); still uncertified, the caller solves the whole model, starting from the best
   restricted plan (a plan of the whole model too, lifted by :func:`lift_point`) with the best
   bound proven on the way (:attr:`Restricted.bound`).

Every step is exact: the answer is the full model's optimum within the MIP gap, proven by the
bound above (tests compare it against the full model on random instances).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from coral_solver.allocate_data import Prepared, prepare
from coral_solver.allocate_highs import HighsSolver, SolveResult
from coral_solver.allocate_model import LinearModel, Stage2Model, build_model
from coral_solver.types import Cluster, ModelSpec, Policy, Template

#: rounds of "widen the restriction by what the forced relaxations used" before giving up
MAX_ROUNDS = 4
#: a relaxation optimum is solved to this relative gap; its dual bound is what is used
RELAXATION_GAP = 1e-7


@dataclass
class Restricted:
    """The restricted model, its best solution and the bound proven for the whole model;
    ``proven``: that plan is within the MIP gap of the bound (else only a start for the whole
    model)."""

    sm: Stage2Model
    result: SolveResult
    bound: float
    columns: int  # templates in the final restriction
    rounds: int
    proven: bool = True


@dataclass
class _Columns:
    """Per template of the prepared data: what the relaxation needs."""

    model_of: np.ndarray
    role: np.ndarray  # 0 both, 1 prefill, 2 decode
    cover: np.ndarray  # min(T_j, D_m)
    cheapest: np.ndarray  # Σ stages of the cheapest allowed partition's stage cost
    #: per template: [(stages of GPU type g per replica, cheapest stage cost of g, running
    #: stages of g)] for templates with running stages; empty otherwise
    running: list[list[tuple[int, float, int]]]


_ROLE = {"both": 0, "prefill": 1, "decode": 2}


def _columns(data: Prepared) -> _Columns:
    demand = np.array([m.demand_rps for m in data.models])
    n = len(data.templates)
    cover = np.array([min(t.throughput, demand[data.model_of[j]])
                      for j, t in enumerate(data.templates)]) if n else np.zeros(0)
    cheapest = np.zeros(n)
    running: list[list[tuple[int, float, int]]] = [[] for _ in range(n)]
    run_by_type: dict[tuple[int, str], int] = {}
    for (j, g, _p), count in data.running.items():
        run_by_type[(j, g)] = run_by_type.get((j, g), 0) + count
    for j, template in enumerate(data.templates):
        counts = template.stage_counts()
        total = 0.0
        terms = []
        for gpu, stages in counts.items():
            unit = min(data.stage_cost[(p, gpu, template.tp)] for p in data.stage_parts[j][gpu])
            total += stages * unit
            terms.append((stages, unit, run_by_type.get((j, gpu), 0)))
        cheapest[j] = total
        if any(r > 0 for _, _, r in terms):
            running[j] = terms
    role = np.array([_ROLE[t.role] for t in data.templates], dtype=np.int64)
    return _Columns(np.asarray(data.model_of), role, cover, cheapest, running)


def _front(cols: _Columns, members: np.ndarray, keep_ties: bool) -> np.ndarray:
    """Of ``members`` (one model), those no other member of the same role dominates in
    (cheapest cost ↓, cover ↑); running templates always stay. ``keep_ties``: identical
    (cost, cover) points all stay, else the first only."""
    out = []
    for role in (0, 1, 2):
        group = members[cols.role[members] == role]
        if not len(group):
            continue
        c = cols.cheapest[group]
        a = cols.cover[group]
        tol_c = 1e-12 * max(1.0, float(np.abs(c).max()))
        tol_a = 1e-12 * max(1.0, float(np.abs(a).max()))
        no_worse = (c[None, :] <= c[:, None] + tol_c) & (a[None, :] >= a[:, None] - tol_a)
        better = (c[None, :] < c[:, None] - tol_c) | (a[None, :] > a[:, None] + tol_a)
        if keep_ties:
            beaten = (no_worse & better).any(axis=1)
        else:
            earlier = np.arange(len(group))[None, :] < np.arange(len(group))[:, None]
            beaten = (no_worse & (better | earlier)).any(axis=1)
        running = np.array([bool(cols.running[j]) for j in group], dtype=bool)
        out.append(group[~beaten | running])
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def relaxed_bound(model: ModelSpec, cols: _Columns, kept: np.ndarray,
                  forced: np.ndarray | None, K: float, deadline: float
                  ) -> tuple[float, np.ndarray] | None:
    """R_m's optimum as a proven lower bound, over templates ``kept`` (plus ``forced``, of
    which at least one replica must be used); returns (bound, replicas per template of
    ``kept`` then ``forced``), or None when R_m has no solution (or the time ran out)."""
    forced = np.zeros(0, dtype=np.int64) if forced is None else forced
    members = np.concatenate([kept, forced]).astype(np.int64)
    if not len(members):
        return None
    lm = LinearModel()
    upper = math.inf if model.max_replicas is None else float(model.max_replicas)
    base = np.array([cols.cheapest[j] * (1.0 if cols.running[j] else 1.0 + K) for j in members])
    nu = lm.add_vars("nu", [(int(j),) for j in members], 0.0, upper, integer=True, cost=base)
    roles = cols.role[members]
    demand = float(model.demand_rps)
    phased = bool((roles > 0).any())
    cover = lm.add_rows("cover", [()], demand, math.inf)
    both = np.nonzero(roles == 0)[0]
    lm.add_terms(np.full(len(both), cover[0]), nu[both], cols.cover[members[both]])
    if phased:
        split = lm.add_vars("split", [()], 0.0, demand, integer=False)
        lm.add_terms(cover, split, 1.0)
        for role in (1, 2):
            row = lm.add_rows(f"cover{role}", [()], 0.0, math.inf)
            sel = np.nonzero(roles == role)[0]
            lm.add_terms(np.full(len(sel), row[0]), nu[sel], cols.cover[members[sel]])
            lm.add_terms(row, split, -1.0)
    count = lm.add_rows("replicas", [()], float(model.min_replicas), upper)
    lm.add_terms(np.full(len(nu), count[0]), nu, 1.0)
    if len(forced):
        row = lm.add_rows("forced", [()], 1.0, math.inf)
        lm.add_terms(np.full(len(forced), row[0]), nu[len(kept):], 1.0)
    # churn: stages of g beyond those running pay K × the cheapest stage cost of g
    for i, j in enumerate(members):
        for g, (stages, unit, running) in enumerate(cols.running[j]):
            churn = lm.add_vars("churn", [(int(j), g)], 0.0, math.inf, integer=False,
                                cost=K * unit)
            row = lm.add_rows("startup", [(int(j), g)], -float(running), math.inf)
            lm.add_terms(row, churn, 1.0)
            lm.add_terms(row, nu[i], -float(stages))
    solver = HighsSolver(lm)
    result = solver.solve(max(deadline - time.perf_counter(), 0.01), RELAXATION_GAP)
    if result.x is None or result.status not in ("optimal",):
        return None
    return float(result.bound), np.rint(result.x[nu]).astype(np.int64)


def certified_restriction(models: list[ModelSpec], library: dict[str, list[Template]],
                          cluster: Cluster, policy: Policy, data: Prepared,
                          deadline: float) -> Restricted | None:
    """The cost phase's plan (every demand met) found on a small restriction and proven optimal
    for the whole model (module docstring). When it cannot be proven in a few rounds, or time
    runs out after a restricted plan was found: that plan with ``proven`` False and the best
    bound proven for the whole model, for the caller's solve of the whole model to start from.
    None when some demand cannot be met on the restriction or no plan was found in time."""
    if not data.templates or any(m.demand_rps < 0 for m in data.models):
        return None
    cols = _columns(data)
    K = policy.startup_penalty
    by_model = [np.nonzero(cols.model_of == mi)[0] for mi in range(len(data.models))]
    lower = []
    for mi, model in enumerate(data.models):
        found = relaxed_bound(model, cols, _front(cols, by_model[mi], keep_ties=False), None,
                              K, deadline)
        if found is None:
            return None
        lower.append(found[0])
    total_lower = float(sum(lower))
    kept = [set(_front(cols, members, keep_ties=True).tolist()) for members in by_model]
    best: Restricted | None = None  # the cheapest restricted plan so far, not yet proven
    best_bound = total_lower  # a lower bound on the whole model's optimum

    def unproven() -> Restricted | None:
        if best is None:
            return None
        return replace(best, bound=min(best_bound, float(best.result.objective)), proven=False)

    for rounds in range(1, MAX_ROUNDS + 1):
        if time.perf_counter() >= deadline:
            return unproven()
        chosen = sorted(set().union(*kept))
        sm, result = _solve_restricted(models, data, chosen, cluster, policy, deadline)
        if result.x is None:
            return unproven()
        z = float(result.objective)
        scale = max(abs(z), 1e-9)
        if best is None or z < float(best.result.objective):
            best = Restricted(sm, result, total_lower, len(chosen), rounds, proven=False)
        # the restricted model's own bound covers only plans inside the restriction: before
        # the excluded templates are bounded, only the relaxation's LB holds for the whole
        if z - total_lower <= policy.mip_gap * scale:
            return Restricted(sm, result, min(total_lower, z), len(chosen), rounds)
        excluded_bound, widened, complete = _bound_excluded(
            data, cols, by_model, kept, lower, z, policy, deadline)
        if not complete:
            return unproven()
        bound = min(max(total_lower, min(float(result.bound), excluded_bound)), z)
        best_bound = max(best_bound, bound)
        if z - bound <= policy.mip_gap * scale:
            return Restricted(sm, result, bound, len(chosen), rounds)
        if not widened:
            return unproven()
    return unproven()


def _solve_restricted(models: list[ModelSpec], data: Prepared, chosen: list[int],
                      cluster: Cluster, policy: Policy, deadline: float
                      ) -> tuple[Stage2Model, SolveResult]:
    """The cost phase (every demand met) of the whole model over the ``chosen`` templates."""
    subset: dict[str, list[Template]] = {m.name: [] for m in models}
    for j in chosen:
        template = data.templates[j]
        subset[template.model].append(template)
    restricted = prepare(models, subset, cluster, policy)
    restricted = replace(restricted, dropped=data.dropped, limit_drops=data.limit_drops)
    sm = build_model(restricted)
    highs = HighsSolver(sm.lm, options={"mip_heuristic_run_root_reduced_cost": False})
    highs.set_col_bounds([sm.demand["phi"]], 1.0, 1.0)
    highs.set_cost(sm.cost)
    return sm, highs.solve(max(deadline - time.perf_counter(), 0.01), policy.mip_gap)


def _bound_excluded(data: Prepared, cols: _Columns, by_model: list[np.ndarray],
                    kept: list[set[int]], lower: list[float], z: float, policy: Policy,
                    deadline: float) -> tuple[float, bool, bool]:
    """B_m for every model with excluded templates, widening ``kept`` (in place) where it does
    not certify ``z``: (the least B_m, whether anything was widened, whether every B_m was
    computed — only then does the round's bound hold for the whole model)."""
    total_lower = float(sum(lower))
    scale = max(abs(z), 1e-9)
    K = policy.startup_penalty
    widened = False
    excluded_bound = math.inf
    for mi, model in enumerate(data.models):
        rest = np.array(sorted(set(by_model[mi].tolist()) - kept[mi]), dtype=np.int64)
        if not len(rest):
            continue
        inner = np.array(sorted(kept[mi]), dtype=np.int64)
        found = relaxed_bound(model, cols, _front(cols, inner, keep_ties=False),
                              _front(cols, rest, keep_ties=False), K, deadline)
        if found is None:
            if time.perf_counter() >= deadline:
                return excluded_bound, widened, False
            continue  # no plan of R_m uses an excluded template: nothing to fear from them
        b_m = total_lower - lower[mi] + found[0]
        excluded_bound = min(excluded_bound, b_m)
        if z - b_m > policy.mip_gap * scale:
            members = np.concatenate([_front(cols, inner, keep_ties=False),
                                      _front(cols, rest, keep_ties=False)])
            used = members[found[1] > 0]
            new = [int(j) for j in used if int(j) not in kept[mi]]
            kept[mi].update(new)
            widened = widened or bool(new)
    return excluded_bound, widened, True


def lift_point(small: Stage2Model, x: np.ndarray, full: Stage2Model) -> np.ndarray:
    """A point of ``small`` (the whole model over fewer templates, same cluster) as a point of
    ``full`` with the same cost: columns matched by family and label, excluded templates at 0.
    Packing patterns are maximal over the template sizes present, so a node packed with a
    pattern of ``small`` is packed with a pattern of ``full`` containing it."""
    out = np.zeros(full.lm.num_cols)
    for name, family in full.lm.var_families.items():
        source = small.lm.var_families.get(name)
        if source is None or name == "y":
            continue
        index = source.index()
        for offset, label in enumerate(family.labels):
            col = index.get(label)
            if col is not None:
                out[family.start + offset] = x[col]
    small_y = small.packing["y"]
    if len(small_y):
        full_index = full.lm.var_families["y"].index()
        data_s, data_f = small.data, full.data
        for col, (k, pi) in zip(small_y, small.packing["y_labels"]):
            count = round(float(x[col]))
            if count <= 0:
                continue
            cls = data_s.classes[k]
            pattern = data_s.patterns[(cls.gpu_type, cls.free)][pi]
            options = data_f.patterns.get((cls.gpu_type, cls.free), [])
            target = next((i for i, p in enumerate(options)
                           if all(p.get(t, 0) >= n for t, n in pattern.items())), None)
            if target is None:  # cannot happen for the same cluster; the start is then
                continue        # incomplete and HiGHS repairs or ignores it
            out[full_index[(k, target)]] += count
    return out
