"""Stage 1 and Stage 2 at the paper's scale (issue 15 items 2 and 3), side by side in one run.

Instance: the paper's extended setup, bench/paper_eval/setups.py (PAPER.md §5: Table 3's 6 models
with their trace mixes and SLOs, 5 GPU types × node shapes {1, 2, 4, 8} = 20 configurations in
three regions, the GCP one without L40S and A10G; no template spans two regions), every model
``disaggregation: auto`` (aggregated, prefill-only and decode-only templates), N_max 6, ρ 12.

Stage 1 (``coral_solver.stage1``, each run a fresh process so no memo table is shared):
serial (1 worker), parallel (``--workers``), and a parallel run SIGKILLed part-way and resumed;
the three libraries and the serial ``build_library`` must be identical. The space is counted
as the paper counts it (node multisets over the 20 configurations, ≤ N_max nodes) and as vLLM
can run it (one TP degree per template, every node of shape ≥ TP).

Stage 2 (``coral_solver.allocate``) on that library: ``--epochs`` re-plans per availability
(default and scarce, the paper's margins above the run's peak demand), demand per model drawn
around its mean rate, the previous plan's replicas running (start-up penalty K = 3), the first
re-plan from nothing. Each re-plan is solved three times on the same inputs — with the certified
small restriction (``coral_solver.allocate_bound``, the default); the same, but dropping a
restricted plan the relaxation cannot prove and solving the whole model from nothing (the last
stop's default, ``START_FROM_RESTRICTED = False``); and without the restriction (the whole model
with the LP reduced-cost restriction) — and every plan re-verified by the checker. Wall and CPU
seconds are both recorded: the machine is shared.

Usage: python bench/stage_scale.py [--epochs 20] [--workers 2] [--stage1-from JSON]
Writes bench/results/stage_scale.json and bench/results/stage_scale.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself off the path: bench/queue.py would shadow the standard library's queue, which
# multiprocessing imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.paper import trace_folder  # noqa: E402
from bench.paper_eval import evaluate as E  # noqa: E402
from bench.paper_eval import setups as S  # noqa: E402
from coral_solver import allocate as allocate_module  # noqa: E402
from coral_solver import stage1  # noqa: E402
from coral_solver import templates as T  # noqa: E402
from coral_solver.check import check_plan  # noqa: E402
from coral_solver.roles import _PhaseView, roles_for  # noqa: E402
from coral_solver.types import Policy, RunningReplica  # noqa: E402

#: the paper's figures for the same steps, as quoted in issue 15 (the paper itself: only the
#: abstract was readable here)
PAPER = {
    "stage1": "“a few hours” on 384 cores",
    "stage2": "9.68 s and 41 s average per re-plan (Gurobi, 32 cores)",
}
GOALS = {"stage1_s": 600.0, "stage2_median_s": 1.0, "stage2_worst_s": 5.0}


def paper_spec(seed: int) -> stage1.Spec:
    """The extended setup's models (trace mixes, SLOs, disaggregation auto) and regions."""
    setup = _setup()
    loads = E.workloads(setup, seed, trace_folder())
    models = E.model_specs(setup, loads, {m: 1.0 for m in loads}, "auto")
    return stage1.Spec(tuple(models),
                       {region: E.regional_gpu_types(setup, region)
                        for region in setup.setting.regions},
                       Policy(), "bench.paper_eval.evaluate:RegionalThroughput")


def _setup(availability: str = "default") -> S.Setup:
    return next(s for s in S.SETUPS if s.setting.name == "extended" and s.demand == "default"
                and s.availability == availability)


# --------------------------------------------------------------------------- Stage 1


def _stage1_process(spec_file: Path, work: Path, workers: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "coral_solver.stage1", "run", "--spec",
                             str(spec_file), "--work", str(work), "--workers", str(workers)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _timed_run(spec_file: Path, work: Path, workers: int) -> dict:
    began = time.perf_counter()
    proc = _stage1_process(spec_file, work, workers)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"stage1 run failed: {err[-2000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    report["wall_s"] = round(time.perf_counter() - began, 2)
    return report


def _killed_and_resumed(spec_file: Path, work: Path, workers: int, total: int,
                        fraction: float) -> dict:
    began = time.perf_counter()
    proc = _stage1_process(spec_file, work, workers)
    while proc.poll() is None and len(list(work.glob("shards/*.json"))) < fraction * total:
        time.sleep(0.05)
    killed_at = time.perf_counter() - began
    # the whole process group, pool workers included: as Slurm kills a job's processes
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    finished = len(list(work.glob("shards/*.json")))
    resumed = _timed_run(spec_file, work, workers)
    return {"killed_after_s": round(killed_at, 2), "shards_finished_at_kill": finished,
            "resumed": resumed}


def count_space(spec: stage1.Spec) -> dict:
    """The space per (model, role), summed over the regions: node multisets as the paper
    counts them, as vLLM can run them (one TP per template), those with a layout that meets
    the SLO, the (TP, GPU-type count) classes Stage 1 evaluates, and the templates kept."""
    tm = E.RegionalThroughput()
    policy = spec.policy
    shapes = S.NODE_SHAPES
    # ≤ N_max nodes, ≥ 1, over each region's own configurations (GCP has no L40S or A10G)
    paper_sets = sum(math.comb(len(gpus) * len(shapes) + policy.n_max, policy.n_max) - 1
                     for gpus in spec.domains.values())
    out = {}
    for model in spec.models:
        for role in roles_for(model):
            view = tm if role == "both" else _PhaseView(tm, role)
            row = {"paper_node_sets": paper_sets, "one_tp_node_sets": 0,
                   "within_rho": 0, "feasible_node_sets": 0, "classes_evaluated": 0}
            for gpus in spec.domains.values():
                layers = view.layers(model)
                budget = policy.rho * view.weight_gb(model)
                usable = sorted(g for g in gpus if view.runs_on(model, g))
                for tp in view.tp_degrees(model, policy.max_tp):
                    per_type = sum(1 for s in shapes if s >= tp)  # node shapes a TP-tp stage fits
                    types = [g for g in usable if gpus[g][0] >= tp]
                    if not types:
                        continue
                    memory = np.array([tp * gpus[g][1] for g in types])
                    for stages in range(1, min(policy.n_max, layers) + 1):
                        counts = T._multisets(len(types), stages, policy.heterogeneous)
                        weight = np.array([math.prod(math.comb(int(n) + per_type - 1,
                                                               per_type - 1) for n in r)
                                           for r in counts])
                        row["one_tp_node_sets"] += int(weight.sum())
                        fits = counts @ memory <= budget + 1e-9
                        row["within_rho"] += int(weight[fits].sum())
                        row["classes_evaluated"] += int(fits.sum())
                        if not fits.any():
                            continue
                        table = T._stage_tables(view, model, types, tp, stages, layers)
                        speed, _ = T.best_layouts(table, counts[fits], layers)
                        row["feasible_node_sets"] += int(weight[fits][speed > 0].sum())
            out[f"{model.name}/{role}"] = row
    return out


def run_stage1(spec: stage1.Spec, workers: int, folder: Path) -> tuple[dict, dict]:
    spec_file = folder / "spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    total = len(stage1.shard_plan(spec, E.RegionalThroughput()))
    print(f"Stage 1: {total} shards; serial …", flush=True)
    serial = _timed_run(spec_file, folder / "serial", 1)
    print(f"  serial {serial['wall_s']} s; {workers} workers …", flush=True)
    parallel = _timed_run(spec_file, folder / "parallel", workers)
    print(f"  parallel {parallel['wall_s']} s; killed and resumed …", flush=True)
    resume = _killed_and_resumed(spec_file, folder / "resume", workers, total, 0.4)
    tm = E.RegionalThroughput()
    libraries = {name: stage1.merge(spec, folder / name, tm)
                 for name in ("serial", "parallel", "resume")}
    reference = {d: T.build_library(spec.models, gpus, spec.policy, tm, use_cache=False)
                 for d, gpus in spec.domains.items()}
    same = all(lib == reference for lib in libraries.values())
    library = libraries["parallel"]
    templates = Counter()
    for domain in library.values():
        for name, items in domain.items():
            for t in items:
                templates[f"{name}/{t.role}"] += 1
    print("  counting the space …", flush=True)
    space = count_space(spec)
    for key, n in templates.items():
        space[key]["templates_kept"] = n
    result = {
        "shards": total, "serial": serial, "parallel": parallel, "killed_and_resumed": resume,
        "speedup_parallel_over_serial": round(serial["wall_s"] / parallel["wall_s"], 2),
        "identical_serial_parallel_resumed_build_library": same,
        "templates": sum(templates.values()), "space": space,
    }
    merged = {m.name: [t for d in library.values() for t in d[m.name]] for m in spec.models}
    return result, merged


# --------------------------------------------------------------------------- Stage 2


@contextlib.contextmanager
def _cold_after_unproven_restriction():
    """The last stop's default: a restricted plan the relaxation cannot prove is dropped and the
    whole model solved from nothing."""
    saved = allocate_module.START_FROM_RESTRICTED
    allocate_module.START_FROM_RESTRICTED = False
    try:
        yield
    finally:
        allocate_module.START_FROM_RESTRICTED = saved


def _timed(models, library, cluster, policy):
    """(plan, CPU seconds of this process): the wall time is ``plan.solve_seconds``; on a
    shared machine the CPU time says how much of it was the solver's own work."""
    cpu = time.process_time()
    plan = allocate_module.allocate(models, library, cluster, policy)
    return plan, time.process_time() - cpu


@contextlib.contextmanager
def _without_certified_path():
    saved = allocate_module.CERTIFIED_SHARE
    allocate_module.CERTIFIED_SHARE = 0.0
    try:
        yield
    finally:
        allocate_module.CERTIFIED_SHARE = saved


def run_stage2(spec: stage1.Spec, library: dict, availability: str, epochs: int,
               seed: int) -> dict:
    setup = _setup(availability)
    policy = Policy(startup_penalty=3.0)
    loads = E.workloads(setup, seed, trace_folder())
    reference = E.reference_plan(setup, loads, library, policy)
    gpus = E.availability(setup, reference)
    rng = random.Random(f"{seed}-{availability}")
    running: tuple = ()
    rows = []
    for epoch in range(epochs):
        demand = {n: setup.rate_of(n) * rng.uniform(0.6, 1.4) for n in loads}
        models = E.model_specs(setup, loads, demand, "auto")
        cluster = E.cluster_for(setup, gpus, running)
        plan, cpu = _timed(models, library, cluster, policy)
        with _cold_after_unproven_restriction():
            previous, previous_cpu = _timed(models, library, cluster, policy)
        with _without_certified_path():
            before = allocate_module.allocate(models, library, cluster, policy)
        problems = check_plan(plan, models, cluster, library, E.RegionalThroughput())
        rows.append({
            "epoch": epoch, "status": plan.status, "seconds": round(plan.solve_seconds, 4),
            "cpu_s": round(cpu, 4),
            "gap": plan.gap, "cost_per_hour": round(plan.cost_per_hour, 4),
            "previous_seconds": round(previous.solve_seconds, 4),
            "previous_cpu_s": round(previous_cpu, 4), "previous_status": previous.status,
            "previous_gap": previous.gap,
            "previous_objective": previous.phases.get("objective"),
            "previous_certified": "restricted_templates" in previous.phases,
            "certified": "restricted_templates" in plan.phases,
            "restricted_templates": int(plan.phases.get("restricted_templates", 0)),
            "before_seconds": round(before.solve_seconds, 4), "before_status": before.status,
            "before_gap": before.gap, "before_cost_per_hour": round(before.cost_per_hour, 4),
            # cost per hour + start-up penalty: what both minimise (equal-objective plans may
            # differ in cost per hour)
            "objective": plan.phases.get("objective"),
            "before_objective": before.phases.get("objective"),
            "checker_problems": len(problems), "replicas": plan.replicas(),
        })
        print(f"  {availability} epoch {epoch}: {plan.status} {plan.solve_seconds:.3f}s "
              f"(cpu {cpu:.3f}) gap {plan.gap:.1e} ${plan.cost_per_hour:.2f}/h | previous "
              f"{previous.status} {previous.solve_seconds:.3f}s | before "
              f"{before.solve_seconds:.3f}s ${before.cost_per_hour:.2f}/h", flush=True)
        running = tuple(RunningReplica(r.template.id, r.partitions, r.count) for r in plan.rows)
    times = [r["seconds"] for r in rows]
    before = [r["before_seconds"] for r in rows]
    previous = [r["previous_seconds"] for r in rows]
    cpu = [r["cpu_s"] for r in rows]
    # the re-plans where the restriction's plan was not proven by the relaxation: where this
    # change acts (elsewhere both paths run the same code)
    unproven = [r for r in rows if not r["previous_certified"]]
    return {
        "availability": availability, "gpus": gpus, "epochs": len(rows),
        "templates": sum(len(v) for v in library.values()),
        "median_s": round(statistics.median(times), 4), "worst_s": round(max(times), 4),
        "median_cpu_s": round(statistics.median(cpu), 4), "worst_cpu_s": round(max(cpu), 4),
        "previous_median_s": round(statistics.median(previous), 4),
        "previous_worst_s": round(max(previous), 4),
        "previous_worst_cpu_s": round(max(r["previous_cpu_s"] for r in rows), 4),
        "worst_ratio_previous_over_now": round(max(previous) / max(times), 2),
        "unproven_by_relaxation": len(unproven),
        "unproven_seconds_now": [r["seconds"] for r in unproven],
        "unproven_seconds_previous": [r["previous_seconds"] for r in unproven],
        "unproven_status_now": [r["status"] for r in unproven],
        "unproven_status_previous": [r["previous_status"] for r in unproven],
        "same_objective_as_previous_where_previous_optimal": sum(
            r["previous_status"] == "optimal" and r["objective"] is not None
            and abs(r["objective"] - r["previous_objective"])
            <= 1e-4 * max(1.0, abs(r["previous_objective"])) for r in rows),
        "previous_optimal": sum(r["previous_status"] == "optimal" for r in rows),
        "before_median_s": round(statistics.median(before), 4),
        "before_worst_s": round(max(before), 4),
        "median_speedup": round(statistics.median(before) / statistics.median(times), 2),
        "max_gap": max(r["gap"] for r in rows),
        "certified_epochs": sum(r["certified"] for r in rows),
        # where the whole-model path proved its optimum within the time limit: the same
        # objective value; where it ran out of time: no worse
        "before_optimal": sum(r["before_status"] == "optimal" for r in rows),
        "same_objective_where_before_optimal": sum(
            r["before_status"] == "optimal" and r["objective"] is not None
            and abs(r["objective"] - r["before_objective"])
            <= 1e-4 * max(1.0, abs(r["before_objective"])) for r in rows),
        "no_worse_where_before_timed_out": sum(
            r["before_status"] != "optimal" and r["objective"] is not None
            and (r["before_objective"] is None
                 or r["objective"] <= r["before_objective"] * (1 + 1e-6)) for r in rows),
        "statuses": dict(Counter(r["status"] for r in rows)),
        "checker_problems": sum(r["checker_problems"] for r in rows),
        "detail": rows,
    }


# --------------------------------------------------------------------------- report


def markdown(results: dict) -> str:
    s1 = results["stage1"]
    lines = [
        "# Stage 1 and Stage 2 at the paper's scale", "",
        f"Machine: {results['machine']}; load average {results['load_before']} before, "
        f"{results['load_after']} after (other engineers' jobs share these 2 cores). "
        "Instance: the paper's extended setup, `bench/paper_eval/setups.py` (PAPER.md §5) — 6 "
        "models, 5 GPU types × node shapes {1, 2, 4, 8} = 20 configurations, three regions, "
        "every model `disaggregation: auto`, N_max 6, ρ 12.", "",
        "## Stage 1", "",
        *(["Stage 1 was not rerun here (`--stage1-from`): its figures are the earlier run's; "
           "the library Stage 2 used was built in this run and has the same template count.",
           ""] if s1.get("from_earlier_run") else []),
        "| run | wall s | shards computed | found finished |",
        "|---|---|---|---|",
        f"| serial (1 process) | {s1['serial']['wall_s']} | {s1['serial']['computed']} | "
        f"{s1['serial']['done_before']} |",
        f"| parallel ({s1['parallel']['workers']} processes) | {s1['parallel']['wall_s']} | "
        f"{s1['parallel']['computed']} | {s1['parallel']['done_before']} |",
        f"| killed (SIGKILL at {s1['killed_and_resumed']['killed_after_s']} s), then resumed "
        f"| {s1['killed_and_resumed']['resumed']['wall_s']} (resumed part) | "
        f"{s1['killed_and_resumed']['resumed']['computed']} | "
        f"{s1['killed_and_resumed']['resumed']['done_before']} |",
        "",
        f"Parallel ÷ serial: {s1['speedup_parallel_over_serial']}× faster. Serial, parallel and "
        f"resumed libraries identical to the serial `build_library`: "
        f"{s1['identical_serial_parallel_resumed_build_library']}. Templates kept (all "
        f"regions, all roles): {s1['templates']}. Paper: {PAPER['stage1']}. Goal ≤ 10 min on "
        f"2 cores: {'met' if s1['parallel']['wall_s'] <= GOALS['stage1_s'] else 'MISSED'}.", "",
        "The space, per model and role over the regions. *Paper's node sets*: multisets of ≤ 6 "
        "nodes over a region's configurations (C(26, 6) − 1 = 230,229 in a region with all 20, "
        "C(18, 6) − 1 = 18,563 in GCP's 12), TP free per "
        "node. *One-TP node sets*: (node set, TP degree t) pairs vLLM can run — one TP "
        "degree t for every stage "
        "(vLLM requires it), each node of a shape ≥ t. *Within ρ*: GPU memory ≤ 12 × weights. "
        "*Feasible*: the best layout meets the SLO. *Classes evaluated*: Stage 1 evaluates "
        "each (t, GPU-type counts) once, exactly — a TP-t stage uses t GPUs of one node of any "
        "shape ≥ t, so node shapes change only placement, which Stage 2 decides per node; "
        "node sets differing only in shapes are the same template. *Kept*: after dominance "
        "(another template of the same role uses no more stages of every configuration and "
        "serves at least as much).", "",
        "| model / role | paper's node sets | one-TP node sets | within ρ | feasible | "
        "classes evaluated | kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in s1["space"].items():
        lines.append(f"| {key} | {row['paper_node_sets']:,} | {row['one_tp_node_sets']:,} | "
                     f"{row['within_rho']:,} | {row['feasible_node_sets']:,} | "
                     f"{row['classes_evaluated']:,} | {row.get('templates_kept', 0):,} |")
    lines += [
        "", "## Stage 2 on that library", "",
        "Each re-plan solved on the same inputs with the certified small restriction "
        "(`coral_solver.allocate_bound`, the default) and without it (\"before\": the whole "
        "model with the LP reduced-cost restriction); a third solve, the last stop's default, "
        f"is compared in the next table. Paper: {PAPER['stage2']}. Goals: median "
        "≤ 1 s, worst ≤ 5 s (wall time).", "",
        "| availability | templates | re-plans | median s | worst s | max gap | certified | "
        "same objective (before optimal) | no worse (before out of time) | before: median s | "
        "before: worst s | median speed-up | checker | goals |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in results["stage2"]:
        met = s["median_s"] <= GOALS["stage2_median_s"] and s["worst_s"] <= GOALS["stage2_worst_s"]
        lines.append(
            f"| {s['availability']} | {s['templates']} | {s['epochs']} | {s['median_s']} | "
            f"{s['worst_s']} | {s['max_gap']:.1e} | {s['certified_epochs']}/{s['epochs']} | "
            f"{s['same_objective_where_before_optimal']}/{s['before_optimal']} | "
            f"{s['no_worse_where_before_timed_out']}/{s['epochs'] - s['before_optimal']} | "
            f"{s['before_median_s']} | "
            f"{s['before_worst_s']} | {s['median_speedup']}× | {s['checker_problems']} | "
            f"{'met' if met else 'MISSED'} |")
    lines += [
        "", "### The restricted plan the relaxation cannot prove: kept, or dropped (side by side)",
        "",
        "The same re-plans, solved a third time as the last stop's default did: when the "
        "certified restriction's plan is not proven by the per-model relaxations, it is dropped "
        "and the whole model solved from nothing (`START_FROM_RESTRICTED = False`). Now it is "
        "kept: each model's own optimum on the whole cluster may prove it, else the whole "
        "model's cost phase starts from it. Elsewhere both run the same code, so only the "
        "*unproven* re-plans can differ. CPU s = this process's CPU time (the wall time "
        "also holds the other engineers' work on the 2 cores).", "",
        "| availability | median s | worst s | median CPU s | worst CPU s | previous: median s | "
        "previous: worst s | previous: worst CPU s | worst previous ÷ now | unproven re-plans | "
        "unproven: s now / previous | unproven: status now / previous | same objective "
        "(previous optimal) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in results["stage2"]:
        pairs = ", ".join(f"{a} / {b}" for a, b in zip(s["unproven_seconds_now"],
                                                       s["unproven_seconds_previous"]))
        words = ", ".join(f"{a} / {b}" for a, b in zip(s["unproven_status_now"],
                                                       s["unproven_status_previous"]))
        lines.append(
            f"| {s['availability']} | {s['median_s']} | {s['worst_s']} | {s['median_cpu_s']} | "
            f"{s['worst_cpu_s']} | {s['previous_median_s']} | {s['previous_worst_s']} | "
            f"{s['previous_worst_cpu_s']} | {s['worst_ratio_previous_over_now']}× | "
            f"{s['unproven_by_relaxation']} | {pairs or '—'} | {words or '—'} | "
            f"{s['same_objective_as_previous_where_previous_optimal']}/{s['previous_optimal']} |")
    lines += ["", "Re-plan 0 starts from nothing (every replica new, start-up penalty on all); "
              "later ones keep the previous plan's replicas running. Gap = relative gap proven "
              "against the whole model. Both paths minimise cost per hour + the start-up "
              "penalty; \"before\" has the same 10 s time limit, so where it ran out of time its "
              "plan is only feasible. The certified path's share of the time limit is 40 %; "
              "*certified* counts the plans proven on the restriction (by the relaxations or by "
              "each model's own optimum); the others were solved on the whole model, started "
              "from the restriction's plan where there was one.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "stage_scale"))
    parser.add_argument("--stage1-from", default=None, metavar="JSON",
                        help="keep the Stage-1 figures of an earlier results file (not rerun); "
                             "the library is built in-process (build_library, identical)")
    args = parser.parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    spec = paper_spec(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="stage-scale-"))
    try:
        if args.stage1_from:
            s1 = json.loads(Path(args.stage1_from).read_text())["stage1"]
            s1["from_earlier_run"] = True
            tm = E.RegionalThroughput()
            built = {d: T.build_library(spec.models, gpus, spec.policy, tm, use_cache=False)
                     for d, gpus in spec.domains.items()}
            library = {m.name: [t for d in built.values() for t in d[m.name]]
                       for m in spec.models}
            if sum(len(v) for v in library.values()) != s1["templates"]:
                raise SystemExit(f"{args.stage1_from}: {s1['templates']} templates there, "
                                 f"{sum(len(v) for v in library.values())} built now")
        else:
            s1, library = run_stage1(spec, args.workers, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    s2 = [run_stage2(spec, library, availability, args.epochs, args.seed)
          for availability in ("default", "scarce")]
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"Python {platform.python_version()}",
        "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
        "paper": PAPER, "goals": GOALS, "stage1": s1, "stage2": s2,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float))
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
