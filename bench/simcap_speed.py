"""Simulated capacity's speed before and after a change (issue 24 item 1): Stage 1 under
``capacity: simulated`` run by two checkouts in turn, in fresh processes (cold memo, no disk
cache), and every figure compared.

Parts (both small enough that the two sides fit in about 20 minutes on the shared 2-core host):

- ``aggregated``: bench/capacity.py's quick setup (../shared/PAPER.md §5.1-5.2 core: Phi-4,
  GPT-OSS 20B, Qwen3 32B with their SLOs and the trace windows' mean lengths; L40S, L4, A10G on
  8-GPU nodes; max_tp 2, n_max 3);
- ``roles``: examples/models.yaml's three models with ``disaggregation: on`` (prefill-only and
  decode-only templates, each simulated by :mod:`coral_solver.simcap_roles`) on its V100, A100
  and A100-80G partitions, taken as 8-GPU nodes, max_tp 2, n_max 3.

Each part runs before, then after, then the next part (so load drift hits both sides alike);
the ratio is before / after seconds. Figures must match: the report lists any that differ.

Usage: python bench/simcap_speed.py --before /work/main [--before-python PY] [--parts ...]
Writes bench/results/simcap_speed.json and bench/results/simcap_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: bench/capacity.py's models (name, arch, mean in, mean out, TTFT s, TPOT s)
AGGREGATED = (("phi-4", "phi-4", 1243, 217, 1.2, 0.06),
              ("gpt-oss-20b", "gpt-oss-20b", 2027, 27, 0.9, 0.03),
              ("qwen3-32b", "qwen3-32b", 1144, 186, 1.6, 0.10))
AGGREGATED_GPUS = ("l40s", "l4", "a10g")
#: examples/models.yaml's models (its mixes and SLOs)
ROLES = (("qwen3-8b", "qwen3-8b", 512, 128, 2.0, 0.08),
         ("phi-4", "phi-4", 1024, 256, 3.0, 0.1),
         ("llama-70b", "llama-3.1-70b", 1024, 256, 5.0, 0.15))
ROLES_GPUS = ("v100", "a100", "a100-80g")
GPUS_PER_NODE = 8
PARTS = ("aggregated", "roles")


def side(part: str) -> dict:
    """Run one part's Stage 1 in this process (whichever checkout's coral_solver it imports)."""
    from coral_solver import simcap, simcap_roles
    from coral_solver.catalog import gpu_memory_gb
    from coral_solver.templates import PerfThroughput, build_library
    from coral_solver.types import ModelSpec, Policy

    rows, gpus = (AGGREGATED, AGGREGATED_GPUS) if part == "aggregated" else (ROLES, ROLES_GPUS)
    disagg = "off" if part == "aggregated" else "on"
    models = [ModelSpec(n, a, i, o, ttft, tpot, disaggregation=disagg)
              for n, a, i, o, ttft, tpot in rows]
    policy = Policy(max_tp=2, n_max=3, capacity="simulated")
    began = time.perf_counter()
    library = build_library(models, {g: (GPUS_PER_NODE, gpu_memory_gb(g) or 0.0) for g in gpus},
                            policy, PerfThroughput(), use_cache=False)
    seconds = time.perf_counter() - began
    figures = sorted(
        (name, t.role, t.tp,
         " + ".join(f"{s.gpu_type}:{s.layers}" for s in t.stages), t.throughput)
        for name, templates in library.items() for t in templates)
    return {"seconds": round(seconds, 2),
            "simulated": simcap.template_capacity.cache_info().misses
            + simcap_roles.role_template_capacity.cache_info().misses,
            "templates": len(figures), "figures": figures,
            "module": simcap.__file__}


def _run(python: str, root: Path, part: str) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'solver'}")
    out = subprocess.run(["nice", "-n", "19", python, str(Path(__file__).resolve()),
                          "--side", part], cwd=root, env=env, check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _git(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, help="the checkout to compare with (e.g. main)")
    parser.add_argument("--before-python", default=None,
                        help="its Python (default: <before>/.venv/bin/python)")
    parser.add_argument("--before-label", default=None,
                        help="what the before checkout is (default: its git commit)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args.side)))
        return 0
    if args.before is None:
        parser.error("--before is required")
    sides = {"before": (args.before_python or str(args.before / ".venv/bin/python"),
                        args.before.resolve()),
             "after": (sys.executable, ROOT)}
    load_start = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, dict] = {}
    for part in args.parts:
        results[part] = {label: _run(py, root, part) for label, (py, root) in sides.items()}
        r = results[part]
        print(part, {k: (v["seconds"], v["simulated"]) for k, v in r.items()}, flush=True)
    meta = {"host": platform.node(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "load_avg_start": load_start,
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nice": 19,
            "commits": {"before": args.before_label or _git(args.before),
                        "after": _git(ROOT)}}
    out = ROOT / "bench" / "results"
    (out / "simcap_speed.json").write_text(json.dumps({"meta": meta, "parts": results},
                                                      indent=1))
    (out / "simcap_speed.md").write_text(_markdown(meta, results))
    print(f"wrote {out / 'simcap_speed'}.json and .md")
    return 0


def _markdown(meta: dict, results: dict) -> str:
    lines = ["# Simulated capacity: Stage 1 before and after", "",
             f"Written by `bench/simcap_speed.py` on {meta['when']} ({meta['cpus']} CPUs, shared; "
             f"load average {', '.join(str(x) for x in meta['load_avg_start'])} at the start, "
             f"{', '.join(str(x) for x in meta['load_avg_end'])} at the end), "
             f"every side under nice 19 in a fresh process, no disk cache. Before: "
             f"{meta['commits']['before']}; after: {meta['commits']['after']} (or its "
             "descendant that committed this file).", "",
             "| part | before s | after s | before / after | templates simulated (before, "
             "after) | library templates | figures that differ |", "|---|---|---|---|---|---|---|"]
    for part, r in results.items():
        b, a = r["before"], r["after"]
        differ = len(set(map(tuple, b["figures"])) ^ set(map(tuple, a["figures"])))
        lines.append(f"| {part} | {b['seconds']} | {a['seconds']} | "
                     f"{b['seconds'] / a['seconds']:.2f} | {b['simulated']}, {a['simulated']} | "
                     f"{a['templates']} | {differ} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
