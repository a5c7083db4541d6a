"""A site day with scale to zero (issue 30 item 5): 20 models with sparse, skewed popularity on
the recorded dev cluster (doubled: 48 GPUs), replayed by ``coral-hpc simulate``'s Python entry
with ``idle_after`` and again always-on; GPU-hours, billing and the wake waits.

The construction (every choice printed with the results):

* **Cluster**: ``tests/data/plan/devcluster-snapshot.json`` — the local Slurm cluster as
  ``coral-hpc cluster --json`` recorded it: 8 v100 (16 GB), 8 a100 (40 GB), 8 a100-80g, every GPU
  free — with every node twice (:func:`doubled`, 48 GPUs), since always-on (one replica of 1-2
  GPUs per model) does not fit 24; replica jobs of 2 CPUs and 8 GB per GPU (its emulated nodes
  are small). Cost in its Slurm billing units (the partitions' ``TRESBillingWeights``).
* **Models**: ``--models`` (20) tenants' fine-tunes ``qwen3-8b-tNN`` of the catalogue's
  qwen3-8b, each declaring its Zipf share as its demand (``requests_per_s``) and its trace's
  mean prompt / output tokens as its mix; SLO 2 s TTFT / 80 ms TPOT (the example's qwen3-8b).
* **Popularity**: Zipf over the models' ranks, exponent ``--zipf`` (1.5): model r (1-based)
  gets the share r^-s / Σ_k k^-s of ``--total-rps`` (0.1 req/s). With the defaults the busiest
  model gets ~2.7 requests a minute, the third ~32 an hour (it stays warm), the tenth ~5 an hour
  (now and then idle 20 minutes) and the quietest ~1.8 an hour.
* **Streams**: model r replays the Azure LLM 2023 conversation trace (odd r) or code trace (even
  r) from its own offset (r × 997 s into the hour-long trace, wrapping), its rate curve (10-s
  bins) scaled to its share and drawn as a Poisson process, lengths drawn from the window's rows
  (:func:`coral_hpc.simulate.traces.scaled_workload`, seed ``--seed`` + r), clipped to the
  architecture's context as ``coral-hpc simulate`` does.
* **Scale to zero**: the two busiest models ``idle_after: never`` (a site's main chat and code
  models stay up); every other model ``idle_after: 20m``, ``wake: hold`` (``wake_timeout`` 5 min),
  except every fifth rank which has ``wake: reject`` (its clients retry after the 503).
  ``policy.startup_time_s`` 180 s (the config default: the start-up a woken replica takes before
  it is READY), re-plan interval 5 min.
* **Always-on**: the same run with every model ``idle_after: never`` and ``min_replicas: 1``
  (:func:`coral_hpc.simulate.compare.always_on`).

Usage (bench/scale_day.py is the 1,000-node site without scale to zero):
``python bench/zero_day.py [--hours 24] [--models 20] [--zipf 1.5] [--total-rps 0.1]`` — a day,
both runs, takes a few minutes on a 2-core host.
Writes bench/results/NAME.json and NAME.md (``--name``, default zero_day; the sparser day:
``--total-rps 0.02 --name zero_day_sparse``). The trace files are read where
they lie (../shared/data/traces) and never copied; only derived figures are written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself must not be on the path: bench/queue.py would shadow the standard library's queue
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "solver"))

import numpy as np  # noqa: E402

from bench.scale_eval import site as S  # noqa: E402
from coral_hpc.config import parse_deployment  # noqa: E402
from coral_hpc.plan.planner import Planner  # noqa: E402
from coral_hpc.simulate.compare import against_always_on, simulate_both  # noqa: E402
from coral_hpc.simulate.traces import ModelWorkload, load_rows, scaled_workload  # noqa: E402
from coral_hpc.slurm.snapshot import ClusterSnapshot  # noqa: E402
from coral_solver import catalog  # noqa: E402

SNAPSHOT = ROOT / "tests" / "data" / "plan" / "devcluster-snapshot.json"
TRACE_FILES = {"conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
               "code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv"}
ARCHS = ("qwen3-8b",)  #: one GPU-or-two model; other sizes would only change the scale
#: offset of model r's window into its trace: r × this, wrapping (a prime: windows differ)
OFFSET_STEP_S = 997.0
STARTUP_S = 180.0
REPLAN_S = 300.0
IDLE_AFTER = "20m"
ALWAYS_UP = 2        #: the busiest ranks kept up (idle_after: never)
REJECT_EVERY = 5     #: every fifth rank answers 503 + Retry-After while it wakes


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=24.0, help="virtual hours replayed")
    p.add_argument("--models", type=int, default=20)
    p.add_argument("--zipf", type=float, default=1.5, help="Zipf exponent of the popularity")
    p.add_argument("--total-rps", type=float, default=0.1,
                   help="the models' mean request rates summed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--traces", default=None, help="the traces folder (../shared/data/traces)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--name", default="zero_day", help="results file name (NAME.json, NAME.md)")
    args = p.parse_args(argv)
    if not (1 <= args.models <= 24) or args.hours <= 0 or args.total_rps <= 0 or args.zipf < 0:
        p.error("--models 1..24 (always-on, one replica of 1-2 GPUs each, must fit the 48 "
                "GPUs), --hours > 0, --total-rps > 0, --zipf >= 0")
    return args


def shares(n: int, exponent: float) -> np.ndarray:
    """Zipf shares of ranks 1..n: r^-s / Σ k^-s."""
    weights = np.arange(1, n + 1, dtype=float) ** -exponent
    return weights / weights.sum()


def doubled(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The recorded dev cluster with every node twice (``<name>-b``, same partitions): 48 GPUs,
    32 of them A100s (the V100s lack bf16: no 8B bf16 model runs there), so that always-on —
    one replica per model — fits at all."""
    data = json.loads(snapshot.to_json())
    twins = {n["name"]: n["name"] + "-b" for n in data["nodes"]}
    data["nodes"] += [{**n, "name": twins[n["name"]]} for n in data["nodes"]]
    for group in data["partitions"] + data["node_groups"]:
        group["nodes"] = group["nodes"] + [twins[n] for n in group["nodes"]]
    return ClusterSnapshot.from_json(json.dumps(data))


def kind_of(rank: int) -> str:
    """The trace model ``rank`` replays: conversation (odd ranks) or code (even)."""
    return "conv" if rank % 2 else "code"


def models_yaml(args: argparse.Namespace, mixes: dict[str, tuple[int, int]]) -> str:
    """The site's models.yaml: the dev cluster's partitions, the policy, the models (each with
    its trace's mean prompt / output tokens as its mix)."""
    share = shares(args.models, args.zipf)
    lines = [
        "deployment: zero-day",
        "state_dir: /tmp/zero-day/state",
        "db_path: /tmp/zero-day/daemon.db",
        "cluster:",
        "  slurm: {backend: auto}",
        '  time_limit: "12:00:00"',
        # the dev cluster's emulated nodes have 16 CPUs and 64 GB for 4-8 GPUs: a replica job
        # of the default shape (4 CPUs, 32 GB per GPU) would leave most of their GPUs unusable
        "  cpus_per_gpu: 2",
        "  mem_per_gpu_gb: 8",
        "  partitions:",
        "    - {name: v100, gpu_types: [v100]}",
        "    - {name: a100, gpu_types: [a100]}",
        "    - {name: a100-80g, gpu_types: [a100-80g]}",
        "engine: {kind: sim}",
        "policy:",
        f"  replan_interval_s: {REPLAN_S:g}",
        f"  startup_time_s: {STARTUP_S:g}",
        f"  idle_after: {IDLE_AFTER}",
        "  wake_timeout: 5m",
        "models:",
    ]
    for rank in range(1, args.models + 1):
        arch = ARCHS[rank % len(ARCHS)]
        lines += [f"  - name: {arch}-t{rank:02d}",
                  f"    source: tenant/{arch}-t{rank:02d}",
                  f"    architecture: {arch}",
                  "    mix: {input_tokens: %d, output_tokens: %d}" % mixes[kind_of(rank)],
                  f"    demand: {{requests_per_s: {args.total_rps * share[rank - 1]:.6g}}}",
                  "    slo: {ttft_s: 2.0, tpot_s: 0.08}"]
        if rank <= ALWAYS_UP:
            lines.append("    idle_after: never")
        elif rank % REJECT_EVERY == 0:
            lines.append("    wake: reject")
    return "\n".join(lines) + "\n"


def streams(deployment, args: argparse.Namespace, rows: dict) -> tuple[dict, dict]:
    """Each model's requests (see the module doc) and what they were drawn from."""
    span_s = args.hours * 3600.0
    loads, drawn = {}, {}
    for rank, model in enumerate(deployment.models, start=1):
        kind = kind_of(rank)
        trace = rows[kind]
        offset = (rank * OFFSET_STEP_S) % trace.span_s
        rate = model.demand_rps  # its Zipf share, declared
        load = scaled_workload(model.name, trace, offset, rate, args.seed + rank, span_s)
        max_context = catalog.model_arch(model.arch_key).max_context
        prompt = np.minimum(load.prompt, max_context - 1)
        output = np.minimum(load.output, max_context - prompt)
        loads[model.name] = ModelWorkload(model.name, load.at, prompt, output, load.source,
                                          load.mix)
        drawn[model.name] = {"rank": rank, "trace": TRACE_FILES[kind],
                             "offset_s": round(offset), "rate_rps": round(rate, 6),
                             "requests": len(load.at)}
    return loads, drawn


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = S.traces_folder(args.traces, "bench/zero_day.py")
    began = time.perf_counter()
    rows = {kind: load_rows(folder / path) for kind, path in TRACE_FILES.items()}
    text = models_yaml(args, {kind: r.mean_mix() for kind, r in rows.items()})
    deployment = parse_deployment(text, "zero-day models.yaml")
    snapshot = doubled(ClusterSnapshot.from_json(SNAPSHOT.read_text()))
    loads, drawn = streams(deployment, args, rows)
    span_s = args.hours * 3600.0
    print(f"zero_day: {args.hours:g} h, {len(loads)} models, "
          f"{sum(len(w.at) for w in loads.values()):,} requests", file=sys.stderr)
    with tempfile.TemporaryDirectory() as cache:
        planner = Planner(cache_dir=Path(cache), probe=False)
        zero, always = simulate_both(deployment, snapshot, loads, span_s, planner,
                                     log=lambda line: None)
    assert always is not None
    report = against_always_on(zero, always)
    wall = time.perf_counter() - began
    doc = {
        "command": "python bench/zero_day.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in
            (("hours", f"{args.hours:g}"), ("models", args.models), ("zipf", f"{args.zipf:g}"),
             ("total_rps", f"{args.total_rps:g}"), ("seed", args.seed), ("name", args.name))),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "wall_s": round(wall, 1),
        "snapshot": str(SNAPSHOT.relative_to(ROOT)),
        "sources": {"traces": "Azure LLM inference trace 2023 (CC-BY-4.0, Patel et al., ISCA "
                              "2024): " + ", ".join(TRACE_FILES.values())},
        "config": {"hours": args.hours, "models": args.models, "zipf": args.zipf,
                   "total_rps": args.total_rps, "seed": args.seed, "startup_time_s": STARTUP_S,
                   "replan_interval_s": REPLAN_S, "idle_after": IDLE_AFTER,
                   "always_up_ranks": ALWAYS_UP, "reject_every": REJECT_EVERY},
        "unit": zero.unit,
        "streams": drawn,
        "scale_to_zero": report,
        "replans": {"scale_to_zero": len(zero.timeline), "always_on": len(always.timeline)},
        "seconds": {"scale_to_zero": zero.seconds, "always_on": always.seconds},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


def _wait(w: dict) -> str:
    return "-" if w["p50"] is None else f"{w['p50']:.0f} / {w['p95']:.0f} / {w['max']:.0f}"


def markdown(doc: dict) -> str:
    """The results page."""
    report, cfg = doc["scale_to_zero"], doc["config"]
    total = report["total"]
    unit = "billing units" if doc["unit"] == "billing" else "cost units"
    saved_gpu = 1 - total["gpu_hours"] / total["always_on_gpu_hours"]
    saved_cost = 1 - total["cost"] / total["always_on_cost"]
    lines = [
        "# A site day with scale to zero (issue 30 item 5)",
        "",
        f"Generated by `{doc['command']}` in {doc['wall_s']:.0f} s wall time on "
        f"{doc['machine']} (both runs).",
        "",
        f"- **Cluster**: `{doc['snapshot']}` (the local Slurm cluster recorded: 8 v100, 8 a100, "
        "8 a100-80g, all free) with every node twice (48 GPUs: always-on does not fit 24); "
        f"replica jobs of 2 CPUs and 8 GB per GPU; cost in {unit} (its partitions' billing "
        "weights).",
        f"- **Models**: {cfg['models']} fine-tunes of qwen3-8b, each declaring its share of a "
        f"Zipf popularity (exponent {cfg['zipf']:g}) over their ranks — mean rates summing to "
        f"{cfg['total_rps']:g} req/s — and its trace's mean lengths as its mix; SLO 2 s TTFT / "
        "80 ms TPOT.",
        f"- **Streams**: {doc['sources']['traces']}; rank r replays the conversation (odd r) or "
        "code (even r) trace from r × 997 s in, its 10-s rate curve scaled to its share, Poisson "
        "arrivals, lengths drawn from the window's rows. Only derived figures are kept here.",
        f"- **Scale to zero**: ranks 1–{cfg['always_up_ranks']} `idle_after: never`; the rest "
        f"`idle_after: {cfg['idle_after']}`, `wake: hold` (`wake_timeout` 5 min), every "
        f"{cfg['reject_every']}th rank `wake: reject`. A woken replica is READY "
        f"{cfg['startup_time_s']:g} s (policy.startup_time_s) after the request; re-plan "
        f"interval {cfg['replan_interval_s']:g} s.",
        "- **Always-on**: the same run (same requests, snapshot, planner) with every model "
        "`idle_after: never` and `min_replicas: 1`.",
        "",
        "## Totals",
        "",
        "| | scale to zero | always-on | saved |",
        "|---|---:|---:|---:|",
        f"| GPU-hours | {total['gpu_hours']:.2f} | {total['always_on_gpu_hours']:.2f} | "
        f"{100 * saved_gpu:.0f} % |",
        f"| cost ({unit}) | {total['cost']:.2f} | {total['always_on_cost']:.2f} | "
        f"{100 * saved_cost:.0f} % |",
        f"| within SLO | {100 * (total['slo_attainment'] or 0):.1f} % | "
        f"{100 * (total['always_on_slo_attainment'] or 0):.1f} % | |",
        f"| re-plans | {doc['replans']['scale_to_zero']} | {doc['replans']['always_on']} | |",
        "",
        f"Wakes: {total['wakes']}; requests held {total['held']}, refused "
        f"{total['refused_reject']} (wake: reject) + {total['refused_timeout']} (past "
        f"wake_timeout). Wake wait of held requests p50 / p95 / max: "
        f"{_wait(total['wake_wait_s'])} s.",
        "",
        "## Per model",
        "",
        "| model | req/s | requests | wakes | wake wait s p50/p95/max | held | refused | "
        "h without replica | GPU-h | always-on GPU-h | cost | always-on cost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in report["models"].items():
        lines.append(
            f"| {name} | {doc['streams'][name]['rate_rps']:.4f} | {m['requests']} | "
            f"{m['wakes']} | {_wait(m['wake_wait_s'])} | {m['held']} | "
            f"{m['refused_reject'] + m['refused_timeout']} | {m['hours_without_replica']:.2f} | "
            f"{m['gpu_hours']:.2f} | {m['always_on_gpu_hours']:.2f} | {m['cost']:.2f} | "
            f"{m['always_on_cost']:.2f} |")
    up = [n for n in doc["streams"] if n not in report["models"]]
    lines += ["", "A model's own cost can pass its always-on cost: each wake pays a start-up, and "
              "its replica goes where the wake's re-plan finds room (at times a pricier "
              "partition than always-on's). Hours without replica count from going cold; "
              "hysteresis keeps a model woken soon after going cold warm up to 4 × idle_after.",
              "", f"Never scaled to zero (idle_after: never; planned for their declared "
                  f"demand in both runs): {', '.join(up)}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
