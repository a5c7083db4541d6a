"""Analytic Stage 1's speed before and after a change (issue 24 item 1: "report Stage 1's time
before and after"), two checkouts in turn, each in a fresh process (cold memo, no disk cache).

Parts:

- ``example``: examples/models.yaml's three models (their mixes and SLOs, aggregated) on the
  local cluster's GPU types as its nodes have them (V100 and A100 nodes of 4 GPUs, A100-80G of
  8), the default policy (N_max 6, TP up to 8, heterogeneous): what ``coral-hpc plan
  examples/models.yaml`` builds on a fresh cache;
- ``example-roles``: the same with ``disaggregation: auto`` (aggregated, prefill-only and
  decode-only templates);
- ``paper``: bench/stage_scale.py's instance, the paper's extended setup (PAPER.md §5: 6 models,
  20 configurations in three regions, disaggregation auto), built serially.

Sides: ``before`` (another checkout, e.g. main), ``after`` (this one) and, where this checkout's
throughput model is ``monotone_in_layers``, ``after, whole table``: the same code asking every
stage figure, whose library must equal ``after``'s (coral_solver.lazy_layouts). Each part runs
its sides in turn before the next part, so load drift hits them alike. Libraries of ``before``
and ``after`` differ where the capacity model changed; bench/tail_vs_simcap.py compares figures.

Usage: python bench/stage1_speed.py --before /path/to/main [--before-python PY] [--parts ...]
Writes bench/results/stage1_speed.json and bench/results/stage1_speed.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: examples/models.yaml's models (name, arch, mean in, mean out, TTFT s, TPOT s)
EXAMPLE = (("qwen3-8b", "qwen3-8b", 512, 128, 2.0, 0.08),
           ("phi-4", "phi-4", 1024, 256, 3.0, 0.1),
           ("llama-70b", "llama-3.1-70b", 1024, 256, 5.0, 0.15))
#: the local cluster's GPU types and GPUs per node (scripts/dev-cluster)
EXAMPLE_GPUS = (("v100", 4), ("a100", 4), ("a100-80g", 8))
PARTS = ("example", "example-roles", "paper")


def side(part: str, whole_table: bool) -> dict:
    """Build one part's library in this process (whichever checkout's coral_solver it
    imports), counting the stage figures asked."""
    from coral_solver import templates as T
    from coral_solver.types import ModelSpec, Policy

    if whole_table:
        T.PerfThroughput.monotone_in_layers = False  # type: ignore[attr-defined]
    asked = [0]

    def counting(figure):  # type: ignore[no-untyped-def]
        def counted(self, *args):  # type: ignore[no-untyped-def]
            asked[0] += 1
            return figure(self, *args)
        return counted

    # aggregated figures and, with disaggregation, the prefill-only and decode-only ones
    for method in ("throughput", "phase_throughput"):
        setattr(T.PerfThroughput, method, counting(getattr(T.PerfThroughput, method)))
    if part == "paper":
        from bench.paper_eval import evaluate as E
        from bench.stage_scale import paper_spec

        spec = paper_spec(0)
        tm = E.RegionalThroughput()
        began = time.perf_counter()
        library = {region: T.build_library(spec.models, gpus, spec.policy, tm, use_cache=False)
                   for region, gpus in spec.domains.items()}
    else:
        from coral_solver.catalog import gpu_memory_gb

        disagg = "auto" if part == "example-roles" else "off"
        models = [ModelSpec(n, a, i, o, ttft, tpot, disaggregation=disagg)
                  for n, a, i, o, ttft, tpot in EXAMPLE]
        gpus = {g: (n, gpu_memory_gb(g) or 0.0) for g, n in EXAMPLE_GPUS}
        began = time.perf_counter()
        library = {"": T.build_library(models, gpus, Policy(), T.PerfThroughput(),
                                       use_cache=False)}
    seconds = time.perf_counter() - began
    figures = sorted(
        (region, name, t.role, t.tp, " + ".join(f"{s.gpu_type}:{s.layers}" for s in t.stages),
         t.throughput)
        for region, lib in library.items() for name, templates in lib.items() for t in templates)
    return {"seconds": round(seconds, 2), "asked": asked[0], "templates": len(figures),
            "figures": figures}


def _run(python: str, root: Path, part: str, whole_table: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'solver'}")
    # -P: bench/ itself is not put on sys.path (its queue.py would hide the standard library's)
    command = ["nice", "-n", "19", python, "-P", str(Path(__file__).resolve()), "--side", part]
    out = subprocess.run(command + (["--whole-table"] if whole_table else []), cwd=root,
                         env=env, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _git(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--whole-table", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, help="the checkout to compare with (e.g. main)")
    parser.add_argument("--before-python", default=None,
                        help="its Python (default: <before>/.venv/bin/python)")
    parser.add_argument("--before-label", default=None,
                        help="what the before checkout is (default: its git commit)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args.side, args.whole_table)))
        return 0
    if args.before is None:
        parser.error("--before is required")
    before_python = args.before_python or str(args.before / ".venv/bin/python")
    sides = {"before": (before_python, args.before.resolve(), False),
             "after": (sys.executable, ROOT, False),
             "after, whole table": (sys.executable, ROOT, True)}
    load_start = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, dict] = {}
    for part in args.parts:
        results[part] = _summarised({label: _run(py, root, part, whole)
                                     for label, (py, root, whole) in sides.items()})
        print(part, {k: (v["seconds"], v["asked"]) for k, v in results[part].items()
                     if isinstance(v, dict)}, flush=True)
    meta = {"host": platform.node(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "load_avg_start": load_start,
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nice": 19,
            "commits": {"before": args.before_label or _git(args.before),
                        "after": _git(ROOT)}}
    out = ROOT / "bench" / "results"
    (out / "stage1_speed.json").write_text(json.dumps({"meta": meta, "parts": results},
                                                      indent=1))
    (out / "stage1_speed.md").write_text(_markdown(meta, results))
    print(f"wrote {out / 'stage1_speed'}.json and .md")
    return 0


def _summarised(sides: dict) -> dict:
    """One part's sides without their libraries' figures (thousands each, needed only to
    compare them): whether the lazy and whole-table libraries are identical, and each
    library's digest, so another run can be compared with this one."""
    lazy, whole = sides["after"]["figures"], sides["after, whole table"]["figures"]
    identical = sorted(map(tuple, lazy)) == sorted(map(tuple, whole))
    for side in sides.values():
        figures = json.dumps(sorted(map(tuple, side.pop("figures"))))
        side["library_sha256"] = hashlib.sha256(figures.encode()).hexdigest()
    return {**sides, "lazy_equals_whole_table": identical}


def _markdown(meta: dict, results: dict) -> str:
    lines = ["# Analytic Stage 1: time before and after", "",
             f"Written by `bench/stage1_speed.py` on {meta['when']} ({meta['cpus']} CPUs, shared; "
             f"load average {', '.join(str(x) for x in meta['load_avg_start'])} at the start, "
             f"{', '.join(str(x) for x in meta['load_avg_end'])} at the end), every side under "
             f"nice 19 in a fresh process, no disk cache. Before: {meta['commits']['before']}; "
             f"after: {meta['commits']['after']} (or its descendant that committed this file).",
             "",
             "| part | before s | after s | after ÷ before | stage figures asked (before, "
             "after, whole table) | templates (before, after) | after's whole table s | "
             "whole table ÷ after | lazy and whole-table libraries identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for part, r in results.items():
        b, a, w = r["before"], r["after"], r["after, whole table"]
        same = r["lazy_equals_whole_table"]
        lines.append(f"| {part} | {b['seconds']} | {a['seconds']} | "
                     f"{a['seconds'] / b['seconds']:.2f} | {b['asked']}, {a['asked']}, "
                     f"{w['asked']} | {b['templates']}, {a['templates']} | {w['seconds']} | "
                     f"{w['seconds'] / a['seconds']:.2f} | {same} |")
    lines += ["", "Stage figures asked counts aggregated, prefill-only and decode-only figures. A "
              "library is cached per model (its architecture, SLO and mix, the GPU types, the "
              "policy and the throughput model's fingerprint: coral_solver.templates."
              "build_library), so a fresh cache pays this once per model, not once per plan.",
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
