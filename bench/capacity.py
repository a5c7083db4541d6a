"""Stage 1 with analytic and with simulated capacity on the paper's core setup: time, templates,
and each template's figure both ways.

Setup (../shared/PAPER.md §5.1-5.2): Phi-4 (TTFT 1.2 s, TPOT 60 ms, Azure conversation),
GPT-OSS 20B (0.9 s, 30 ms, Azure code), Qwen3 32B (1.6 s, 100 ms, BurstGPT, replayed from the
Azure conversation trace at another offset as bench/paper_eval does); GPU types L40S, L4, A10G
on 8-GPU nodes (TP 1, 2, 4, 8: the 12 configurations); the default policy (n_max 6, rho 12,
heterogeneous). Mean lengths are the trace windows' means bench/paper.py measured
(bench/results/paper.json, ``mix``); simulated capacity draws lengths exponential with those
means (the stated distribution; the traces are not on this host).

For every template either way it reports: the analytic figure (bottleneck stage of
:func:`coral_solver.perf.stage_throughput`, TTFT and TPOT split evenly over the stages), the
mean-only figure the simulated search ranks candidates by, and the simulated capacity (the
highest Poisson rate at which 95 % of requests meet TTFT and TPOT end to end). Stage 1 runs in
one process, no disk cache; "warm" repeats the simulated run with the in-process memo.

Usage: python bench/capacity.py [--quick]   (--quick: max_tp 2, n_max 3)
Writes bench/results/capacity.json and bench/results/capacity.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "solver"))

from coral_solver import simcap  # noqa: E402
from coral_solver.catalog import gpu_memory_gb  # noqa: E402
from coral_solver.templates import PerfThroughput, build_library  # noqa: E402
from coral_solver.types import ModelSpec, Policy, Template  # noqa: E402

#: (name, arch, mean in, mean out, TTFT s, TPOT s, trace): PAPER.md §5.1 SLOs and traces;
#: means from bench/results/paper.json (the trace windows bench/paper.py replays)
MODELS = (
    ("phi-4", "phi-4", 1243, 217, 1.2, 0.06, "Azure conversation"),
    ("gpt-oss-20b", "gpt-oss-20b", 2027, 27, 0.9, 0.03, "Azure code"),
    ("qwen3-32b", "qwen3-32b", 1144, 186, 1.6, 0.10, "BurstGPT -> Azure conversation"),
)
GPUS = ("l40s", "l4", "a10g")
GPUS_PER_NODE = 8


def _layout(t: Template) -> str:
    return f"TP{t.tp} " + " + ".join(f"{s.gpu_type}:{s.layers}" for s in t.stages)


def _analytic(tm: PerfThroughput, model: ModelSpec, t: Template) -> float:
    return min(tm.throughput(model, s.gpu_type, t.tp, s.layers, t.pp) for s in t.stages)


def _mean_only(tm: PerfThroughput, model: ModelSpec, t: Template) -> float:
    return min(tm.mean_throughput(model, s.gpu_type, t.tp, s.layers, t.pp) for s in t.stages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="max_tp 2, n_max 3")
    args = parser.parse_args()
    base = Policy(max_tp=2, n_max=3) if args.quick else Policy()
    models = [ModelSpec(n, a, i, o, ttft, tpot) for n, a, i, o, ttft, tpot, _ in MODELS]
    gpus = {g: (GPUS_PER_NODE, gpu_memory_gb(g) or 0.0) for g in GPUS}
    tm = PerfThroughput()
    runs = {}
    libraries = {}
    for label, policy in (("analytic", base),
                          ("simulated", replace(base, capacity="simulated")),
                          ("simulated, warm", replace(base, capacity="simulated"))):
        per_model = {}
        began = time.perf_counter()
        for model in models:
            t0 = time.perf_counter()
            misses = simcap.template_capacity.cache_info().misses
            library = build_library([model], gpus, policy, tm, use_cache=False)[model.name]
            per_model[model.name] = {
                "seconds": round(time.perf_counter() - t0, 2),
                "templates": len(library),
                "pipelines": sum(1 for t in library if t.pp > 1),
                "heterogeneous": sum(1 for t in library if t.heterogeneous),
                "simulated_templates": simcap.template_capacity.cache_info().misses - misses,
            }
            libraries.setdefault(label, {})[model.name] = library
        runs[label] = {"seconds": round(time.perf_counter() - began, 2), "models": per_model}
        print(label, runs[label], flush=True)
    templates = []
    for model in models:
        rows = {}
        for label in ("analytic", "simulated"):
            for t in libraries[label][model.name]:
                rows.setdefault((t.tp, t.stages), {})[label] = t
        for (tp, stages), by in sorted(rows.items(), key=lambda kv: (kv[0][0], len(kv[0][1]))):
            t = by.get("simulated") or by["analytic"]
            sim = by["simulated"].throughput if "simulated" in by else simcap.template_capacity(
                model.arch, tp, tuple(s.gpu_type for s in stages),
                tuple(s.layers for s in stages),
                tm._perf.Slo(model.ttft_s, model.tpot_s),
                simcap.Lengths.exponential(model.input_tokens, model.output_tokens), 0.95)
            templates.append({
                "model": model.name, "layout": _layout(t), "pp": t.pp,
                "in_library": [k for k in ("analytic", "simulated") if k in by],
                "analytic": round(_analytic(tm, model, t), 3),
                "mean_only": round(_mean_only(tm, model, t), 3),
                "simulated": round(sim, 3),
            })
    meta = {
        "host": platform.node(), "python": platform.python_version(),
        "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "policy": {"n_max": base.n_max, "max_tp": base.max_tp, "rho": base.rho,
                   "heterogeneous": base.heterogeneous, "slo_attainment": 0.95},
        "simcap": {"counted": simcap.COUNTED, "warmup": simcap.WARMUP, "seed": simcap.SEED,
                   "rel_tol": simcap.REL_TOL},
        "models": [dict(zip(("name", "arch", "input", "output", "ttft_s", "tpot_s", "trace"), m))
                   for m in MODELS],
        "gpus": {g: list(v) for g, v in gpus.items()},
    }
    out = ROOT / "bench" / "results"
    name = "capacity_quick" if args.quick else "capacity"
    (out / f"{name}.json").write_text(json.dumps(
        {"meta": meta, "runs": runs, "templates": templates}, indent=1))
    (out / f"{name}.md").write_text(_markdown(meta, runs, templates))
    print(f"wrote {out / name}.json and .md")
    return 0


def _markdown(meta: dict, runs: dict, templates: list[dict]) -> str:
    lines = [
        "# Stage 1: analytic vs simulated capacity (paper core setup)",
        "",
        f"Written by `bench/capacity.py` on {meta['when']} ({meta['cpus']} CPUs, shared; "
        f"load average {', '.join(f'{x:.1f}' for x in meta['load_avg'])}), one process, no "
        "disk cache.",
        "",
        "Setup: ../shared/PAPER.md §5.1-5.2 core (models, SLOs, traces below; L40S, L4, A10G on "
        f"8-GPU nodes), policy n_max {meta['policy']['n_max']}, max_tp "
        f"{meta['policy']['max_tp']}, rho {meta['policy']['rho']}, heterogeneous. Simulated "
        f"capacity: {meta['simcap']['counted']} counted requests after "
        f"{meta['simcap']['warmup']} warm-up, seed {meta['simcap']['seed']}, rate resolution "
        f"{meta['simcap']['rel_tol']:.0%}, goal 95 % within TTFT and TPOT; lengths exponential "
        "with the trace windows' means (bench/results/paper.json).",
        "",
        "| model | mean in / out | TTFT / TPOT | trace |",
        "|---|---|---|---|",
    ]
    for m in meta["models"]:
        lines.append(f"| {m['name']} | {m['input']} / {m['output']} | {m['ttft_s']} s / "
                     f"{m['tpot_s'] * 1000:.0f} ms | {m['trace']} |")
    lines += ["", "## Stage 1 time and library", "",
              "| run | model | seconds | templates | pipelines | heterogeneous | "
              "templates simulated |", "|---|---|---|---|---|---|---|"]
    for label, run in runs.items():
        for model, r in run["models"].items():
            lines.append(f"| {label} | {model} | {r['seconds']} | {r['templates']} | "
                         f"{r['pipelines']} | {r['heterogeneous']} | "
                         f"{r['simulated_templates']} |")
        lines.append(f"| {label} | **all** | **{run['seconds']}** | | | | |")
    lines += ["", "## Each template both ways (requests/s)", "",
              "analytic: bottleneck stage, TTFT and TPOT split evenly over stages, Poisson "
              "tails; mean-only: what the simulated search ranks candidates by; simulated: the "
              "whole replica. *in library*: which Stage 1 kept it.", "",
              "| model | layout | analytic | mean-only | simulated | in library |",
              "|---|---|---|---|---|---|"]
    for t in templates:
        lines.append(f"| {t['model']} | {t['layout']} | {t['analytic']} | {t['mean_only']} | "
                     f"{t['simulated']} | {', '.join(t['in_library'])} |")
    above = [t for t in templates if t["simulated"] > t["mean_only"]]
    lines += ["", f"Simulated above the mean-only figure (the candidate pruning takes the "
              f"mean-only figure as optimistic): {len(above)} of {len(templates)} templates.",
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
