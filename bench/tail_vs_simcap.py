"""The analytic capacity against the replica simulator's on a fixed sample of catalogue stages.

Issue 24 item 3: the analytic figure (:func:`coral_solver.perf.stage_throughput`, the bottleneck
stage, TTFT and TPOT split evenly) must not promise more than the project's replica simulator
(:func:`coral_solver.simcap.template_capacity`: the same steps, every stage and hand-off, Poisson
arrivals, lengths geometric with the declared means, 95 % within TTFT and TPOT end to end).

Sample (fixed, no randomness): models MODELS x GPUs GPUS x TP 1, 2 x PP 1, 2 (even layer split,
same GPU type) at the mixes MIXES and the SLO of each mix (SLOS). A stage that cannot hold the
model is skipped; a case both rate 0 is reported and left out of the ratios.

Usage: python bench/tail_vs_simcap.py [--out NAME] [--reuse]
(writes bench/results/NAME.json and .md).
With ``--catalogue``: only the analytic figures over a larger grid (CATALOGUE_*), written as
JSON to stdout, to compare two versions of the code (run each with its solver on PYTHONPATH);
``--versus NEW.json OLD.json`` summarises how they moved.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coral_solver import catalog, perf, simcap  # noqa: E402

MODELS = ("llama-3.1-8b", "phi-4", "qwen3-8b")
GPUS = ("a100", "l40s", "a10g")
MIXES = ((512, 128), (1024, 256), (128, 512), (2048, 28))
#: TTFT, TPOT per mix: the paper's interactive SLOs (../shared/PAPER.md §5.1: 0.9-1.6 s, 30-100 ms)
SLOS = {(512, 128): perf.Slo(1.0, 0.05), (1024, 256): perf.Slo(1.5, 0.06),
        (128, 512): perf.Slo(1.0, 0.05), (2048, 28): perf.Slo(0.9, 0.03)}
CATALOGUE_MODELS = ("llama-3.1-8b", "phi-4", "qwen3-8b", "qwen3-32b", "gpt-oss-20b",
                    "llama-3.1-70b")
CATALOGUE_GPUS = ("a100", "a100-80g", "h100", "l40s", "a10g", "v100")
CATALOGUE_SLOS = (perf.Slo(1.0, 0.05), perf.Slo(2.0, 0.1), perf.Slo(0.9, 0.03))


def analytic(arch: catalog.ModelArch, gpu: str, tp: int, pp: int, slo: perf.Slo,
             mix: perf.Mix) -> float:
    """The planner's figure of the template: its bottleneck stage (even layer split)."""
    spec = catalog.gpu_spec(gpu)
    layers = [arch.layers // pp + (1 if i < arch.layers % pp else 0) for i in range(pp)]
    return min(perf.stage_throughput(arch, spec, tp, n, pp, slo, mix) for n in layers)


def compare(reuse: dict[tuple, float]) -> list[dict]:
    rows = []
    for name in MODELS:
        arch = catalog.model_arch(name)
        for gpu in GPUS:
            for tp in (1, 2):
                for pp in (1, 2):
                    for n_in, n_out in MIXES:
                        rows.append(_case(arch, gpu, tp, pp, n_in, n_out, reuse))
    return [r for r in rows if r is not None]


def _case(arch: catalog.ModelArch, gpu: str, tp: int, pp: int, n_in: int, n_out: int,
          reuse: dict[tuple, float]) -> dict | None:
    slo, mix = SLOS[(n_in, n_out)], perf.Mix(n_in, n_out)
    if perf.kv_capacity_tokens(arch, catalog.gpu_spec(gpu), tp, arch.layers // pp,
                               perf._calibration().gpu_memory_utilization) <= n_in + n_out:
        return None
    a = analytic(arch, gpu, tp, pp, slo, mix)
    layers = tuple(arch.layers // pp + (1 if i < arch.layers % pp else 0) for i in range(pp))
    start = time.process_time()
    key = (arch.name, gpu, tp, pp, n_in, n_out)
    s = reuse[key] if key in reuse else simcap.template_capacity(
        arch.name, tp, (gpu,) * pp, layers, slo, simcap.Lengths.exponential(n_in, n_out), 0.95)
    return {"model": arch.name, "gpu": gpu, "tp": tp, "pp": pp, "mix": [n_in, n_out],
            "slo": [slo.ttft_s, slo.tpot_s], "analytic_rps": round(a, 4),
            "simcap_rps": round(s, 4), "ratio": round(a / s, 3) if s > 0 else None,
            "sim_cpu_s": round(time.process_time() - start, 2)}


def catalogue() -> dict[str, float]:
    out = {}
    for name in CATALOGUE_MODELS:
        arch = catalog.model_arch(name)
        for gpu in CATALOGUE_GPUS:
            for tp in (1, 2, 4, 8):
                for pp in (1, 2):
                    for n_in, n_out in MIXES:
                        for slo in CATALOGUE_SLOS:
                            key = f"{name}|{gpu}|{tp}|{pp}|{n_in}/{n_out}|{slo.ttft_s}/{slo.tpot_s}"
                            out[key] = analytic(arch, gpu, tp, pp, slo, perf.Mix(n_in, n_out))
    return out


def versus(new: dict[str, float], old: dict[str, float]) -> str:
    """How the figures moved, new / old, over the cases both rate above 0 (and how many moved
    to or from 0), in all and per mix."""
    lines = []
    for mix in ["all"] + [f"{i}/{o}" for i, o in MIXES]:
        keys = [k for k in new if k in old and (mix == "all" or f"|{mix}|" in k)]
        rs = [new[k] / old[k] for k in keys if new[k] > 0 and old[k] > 0]
        if not rs:
            continue
        lines.append(f"- {mix}: {len(keys)} cases, {len(rs)} rated by both: new/old min "
                     f"{min(rs):.2f}, p10 {_quantile(rs, 0.1):.2f}, median "
                     f"{_quantile(rs, 0.5):.2f}, p90 {_quantile(rs, 0.9):.2f}, max {max(rs):.2f};"
                     f" 0 -> >0: {sum(new[k] > 0 and old[k] == 0 for k in keys)}, >0 -> 0: "
                     f"{sum(new[k] == 0 and old[k] > 0 for k in keys)}")
    return "\n".join(lines) + "\n"


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def markdown(rows: list[dict]) -> str:
    lines = ["# Analytic capacity vs the replica simulator (coral_solver.simcap)", "",
             f"Written by bench/tail_vs_simcap.py on {platform.node()} (no engine, no GPU): "
             f"models {', '.join(MODELS)}; GPUs {', '.join(GPUS)}; TP 1, 2; PP 1, 2 (even "
             f"split); simcap {simcap.COUNTED} counted after {simcap.WARMUP} warm-up, seed "
             f"{simcap.SEED}, lengths geometric with the mix's means, goal 95 %.", ""]
    for n_in, n_out in MIXES:
        rs = [r["ratio"] for r in rows if r["mix"] == [n_in, n_out] and r["ratio"] is not None]
        zero = [r for r in rows if r["mix"] == [n_in, n_out] and r["simcap_rps"] == 0]
        above = sum(x > 1.0 for x in rs)
        if rs:
            lines.append(f"- {n_in}/{n_out} (SLO {SLOS[(n_in, n_out)].ttft_s} s / "
                         f"{SLOS[(n_in, n_out)].tpot_s * 1e3:g} ms): {len(rs)} cases, analytic/"
                         f"simcap min {min(rs):.2f}, median {_quantile(rs, 0.5):.2f}, p90 "
                         f"{_quantile(rs, 0.9):.2f}, max {max(rs):.2f}; above 1: {above}; "
                         f"simcap 0: {len(zero)} (analytic > 0 there: "
                         f"{sum(r['analytic_rps'] > 0 for r in zero)})")
    lines += ["", "| model | GPU | TP | PP | mix | analytic req/s | simcap req/s | ratio |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['gpu']} | {r['tp']} | {r['pp']} | "
                     f"{r['mix'][0]}/{r['mix'][1]} | {r['analytic_rps']} | {r['simcap_rps']} | "
                     f"{r['ratio']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tail_vs_simcap")
    ap.add_argument("--catalogue", action="store_true")
    ap.add_argument("--versus", nargs=2, metavar=("NEW.json", "OLD.json"),
                    help="compare two --catalogue outputs")
    ap.add_argument("--reuse", action="store_true",
                    help="take the simulator's figures from the last results (same sample)")
    args = ap.parse_args()
    if args.catalogue:
        json.dump(catalogue(), sys.stdout)
        return 0
    if args.versus:
        new, old = (json.loads(Path(f).read_text()) for f in args.versus)
        print(versus(new, old), end="")
        return 0
    results = ROOT / "bench" / "results"
    reuse = {}
    if args.reuse and (results / f"{args.out}.json").exists():
        # the simulator's figures do not depend on the analytic model: rerun only the latter
        reuse = {(r["model"], r["gpu"], r["tp"], r["pp"], *r["mix"]): r["simcap_rps"]
                 for r in json.loads((results / f"{args.out}.json").read_text())}
    rows = compare(reuse)
    (results / f"{args.out}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (results / f"{args.out}.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
