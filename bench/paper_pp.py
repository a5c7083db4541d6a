"""Fit the pipeline accounting of solver/coral_solver/perf.py to the real engine (issue 13 item 5).

The question: under pipeline parallelism, does a prompt stall the whole ring of S micro-batches
(each stage then pays S x b / n_out prompts per step: ``coral_solver.perf.PROMPTS_STALL_RING =
True``, the model's assumption until measured), or does each stage pay only its own micro-batch's
b / n_out? Compared with predictions that keep to what the profile measured (at most 32
requests in flight, the host's own hand-off, counted as the model applies it). With every stage
bound to core 0 (vLLM's ``auto`` binding on this host, the profiles until 22:45 UTC 2026-12-01)
the data did not decide; with the stages unbound (the configs' engine environment since, as
examples/vllm-cpu.yaml) they fit the ring on both measures (bench/results/paper_pp.md, with
what on this 2-core host they leave unexplained). The planner and the sim engine's pipeline
keep the ring (``PROMPTS_STALL_RING = True``), whose comment cites that fit.

Measure first, on the real engine (vLLM's CPU build and the generated test models, in Slurm jobs,
under the shared lock), at a prompt-heavy and a decode-heavy mix, PP 1 and 2 on one partition and
PP 3 as a hetjob over two (no partition has three nodes; the 4-layer model splits 2,1,1 at PP 3
and the 5-layer one 3,2 at PP 2: uneven splits)::

    flock /tmp/coral-slurm.lock .venv/bin/coral-hpc profile \\
        bench/paper_pp_configs/prompt-heavy.yaml --partition v100 --pp 1 --pp 2
    flock /tmp/coral-slurm.lock .venv/bin/coral-hpc profile \\
        bench/paper_pp_configs/prompt-heavy.yaml --model tiny-llama --stages v100,v100,a100

(the same with decode-heavy.yaml); the profiles land in bench/results/paper_pp_profiles/ (the
configs' ``profiles_dir``, committed), and ``python bench/paper_pp.py`` reads them (each
deployment's ``measured_profiles_path``, examples/vllm-cpu.yaml's too; ``--profiles DIR`` to name
others) and, per model:

1. fits the per-step time of the whole model to the PP-1 ``step_latency`` points (exact
   non-negative least squares, the planner's ``coral_solver.perf_fit``): t = overhead + a x
   (decode seqs + prompt tokens) + k x (KV context + prompt tokens); a stage of l of L layers
   takes l/L of the a and k terms (the layer-proportional work) and its share of the overhead,
   as ``coral_solver.perf_model.step_time`` splits it;
2. for every measured throughput point (PP 1, 2, 3; its mix, TTFT and TPOT), predicts the
   requests/s of the layout with ``coral_solver.perf.throughput_from_coeffs`` under both accountings
   (slowest stage; KV capacity from the profile);
3. writes predicted vs measured, also as ratios to PP 1 of the same mix (errors of the step fit
   common to all layouts cancel there), and the median |log(predicted / measured)| of each
   accounting to bench/results/paper_pp.md and .json. The accounting that fits is what
   ``coral_solver.perf.PROMPTS_STALL_RING`` should say, citing this result.

Without measured profiles it says what is missing and exits 2, writing nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coral_hpc.profile.measure import CONCURRENCY_LEVELS
from coral_solver import catalog, perf
from coral_solver.perf_fit import nonnegative_least_squares
from coral_solver.perf_model import StageCoeffs

#: The most requests a measured throughput point ever had in flight: `coral-hpc profile`'s sweep
#: stops there, so a prediction for that point may not let the batch grow past it (uncapped, the
#: model amortised the host's 55-83 ms hand-off over batches the engine was never sent, and
#: predicted PP 2 keeping 0.80 of PP 1 at 32/64 where the engine kept 0.17).
MAX_CLIENTS = max(CONCURRENCY_LEVELS)

CONFIGS = ROOT / "bench/paper_pp_configs"


def profile_dirs() -> list[Path]:
    """Each config's measured-profile folder (its ``profiles_dir``). Not the example's
    (examples/vllm-cpu.profiles): since the vllm branch its engines run unbound
    (``VLLM_CPU_OMP_THREADS_BIND=nobind``, one OMP thread, as these configs' since 22:45 UTC
    2026-12-01), but its "tiny-llama" is another architecture (coral-tiny-llama-long) at other
    mixes: pooled, its ratios and hand-offs would mix two models (``--profiles`` adds a folder
    on purpose)."""
    from coral_hpc.config import load_deployment

    return [load_deployment(str(path)).measured_profiles_path
            for path in sorted(CONFIGS.glob("*.yaml"))]


#: Engine variables that decide where a CPU engine's threads run (vLLM's CPU build)
BINDING_VARS = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")


def bindings() -> list[str]:
    """Per config: its profile folder and the thread-binding variables its partitions give the
    engine (unset: vLLM's ``auto``, which on this host binds every engine process, so every
    pipeline stage, to core 0: its engine logs say ``local_rank=0, core ids=[0]``)."""
    from coral_hpc.config import load_deployment

    out = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        deployment = load_deployment(str(path))
        envs = {
            f"{part.name}: " + (", ".join(f"{k}={env[k]}" for k in BINDING_VARS if k in env)
                                or "unset (auto)")
            for part in deployment.cluster.partitions
            for env in [dict(part.environment.env) if part.environment else {}]
        }
        folder = deployment.measured_profiles_path
        where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        out.append(f"{path.relative_to(ROOT)} ({where}): " + "; ".join(sorted(envs)))
    return out


def load_profiles(folders: list[Path]) -> list[dict]:
    """Every measured profile document under ``folders`` (PP 1 and pipelines/), with its path."""
    out = []
    for folder in folders:
        for path in sorted(list(folder.glob("*.yaml")) + list(folder.glob("pipelines/*.yaml"))):
            doc = yaml.safe_load(path.read_text())
            # the repository's own profiles by a path that reads the same on every checkout
            doc["_path"] = str(path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(
                ROOT) else path)
            doc.setdefault("pp", 1)
            out.append(doc)
    return out


def fit_steps(points: list[dict]) -> tuple[float, float, float]:
    """(overhead s, s per token of decode + prompt, s per KV token read) of the whole model:
    the non-negative least-squares fit, the product's
    (:func:`coral_solver.perf_fit.nonnegative_least_squares`, as the planner fits a measured
    profile's steps)."""
    rows = [
        [1.0, p["decode_seqs"] + p["prefill_tokens"], p["context_tokens"] + p["prefill_tokens"]]
        for p in points
    ]
    over, per_token, per_kv = nonnegative_least_squares(rows, [p["seconds"] for p in points])
    return over, per_token, per_kv


def stage_coeffs(
    fit: tuple[float, float, float], layers: int, total: int, hidden: int
) -> StageCoeffs:
    """Step-time coefficients of a stage holding ``layers`` of ``total`` layers: the fitted
    per-token terms in proportion, additive (overlap 1), no roofline split left to make."""
    _, per_token, per_kv = fit
    share = layers / total
    return StageCoeffs(
        flops_per_token=per_token * share,
        lm_head_flops=0.0,
        attn_flops=0.0,
        flops=1.0,
        attn_flops_rate=1.0,
        dense_bytes=0.0,
        expert_bytes=0.0,
        expert_pick=0.0,
        weight_bw=1.0,
        kv_bytes_per_token=per_kv * share,
        kv_bw=1.0,
        overlap=1.0,
        floor_s=0.0,
        comm_alpha_s=0.0,
        comm_s_per_token=0.0,
        hidden_bytes=hidden * 2.0,
    )


def predict(doc: dict, fit: tuple[float, float, float], point: dict, ring: bool,
            tail: bool = False, handoff_s: float | None = None) -> float:
    """Requests/s the layout of ``doc`` sustains at ``point``'s mix and SLO (slowest stage), with
    at most :data:`MAX_CLIENTS` requests in flight, as the profile's sweep had;
    ``handoff_s``: each stage's hand-off (None: the calibration's GPU link)."""
    arch = catalog.model_arch(doc["arch"])
    split = (
        [int(x) for x in str(doc["layer_partition"]).split(",")] if doc["pp"] > 1 else [arch.layers]
    )
    cap = int(doc.get("kv_capacity_tokens") or 0)
    slo = perf.Slo(point["ttft_s"], point["tpot_s"])
    mix = perf.Mix(point["input_tokens"], point["output_tokens"])
    return min(
        perf.throughput_from_coeffs(
            stage_coeffs(fit, n, arch.layers, arch.hidden),
            cap,
            len(split),
            slo,
            mix,
            prompts_stall_ring=ring,
            overhead_s=fit[0],
            poisson_tail=tail,
            handoff_s=handoff_s,
            max_concurrent=MAX_CLIENTS,
        )
        for n in split
    )


def compare(profiles: list[dict]) -> list[dict]:
    """Predicted vs measured for every throughput point, per (model, GPU type) and layout; each
    (model, GPU type)'s step times fitted to its own PP-1 profile; each accounting twice, with
    the calibration's hand-off (GPU link) and with the one measured on this host (``host_``:
    the median of :func:`handoffs` of the same model and layout: PP 2 and 3 put two and three
    engine processes on the same 2 cores, so a stage boundary need not cost both the same)."""
    host: dict[tuple, list[float]] = {}
    for h in handoffs(profiles):
        host.setdefault(layout_key(h["model"], h["pp"], h["split"]), []).append(
            h["measured_ms"] / 1e3)
    rows = []
    for model, gpu in sorted({(d["model"], d["gpu"]) for d in profiles}):
        docs = [d for d in profiles if d["model"] == model and d["gpu"] == gpu]
        base = [d for d in docs if d["pp"] == 1 and d.get("step_latency")]
        if not base:
            continue
        fit = fit_steps([p for d in base for p in d["step_latency"]])
        for doc in sorted(docs, key=lambda d: d["pp"]):
            for point in doc.get("throughput", []):
                measured = float(point["requests_per_s"])
                ring, own = predict(doc, fit, point, True), predict(doc, fit, point, False)
                key = layout_key(model, doc["pp"], doc.get("layer_partition"))
                h = statistics.median(host[key]) if key in host else None
                if doc["pp"] == 1:  # no stage boundary, nothing handed off
                    host_ring, host_own = ring, own
                else:
                    host_ring = predict(doc, fit, point, True, handoff_s=h) if h else None
                    host_own = predict(doc, fit, point, False, handoff_s=h) if h else None
                rows.append(
                    {
                        "model": model,
                        "gpu": gpu,
                        "pp": doc["pp"],
                        "split": doc.get(
                            "layer_partition", str(catalog.model_arch(doc["arch"]).layers)
                        ),
                        "mix": [point["input_tokens"], point["output_tokens"]],
                        "slo": [point["ttft_s"], point["tpot_s"]],
                        "measured_rps": measured,
                        "ring_rps": round(ring, 4),
                        "own_rps": round(own, 4),
                        "host_ring_rps": None if host_ring is None else round(host_ring, 4),
                        "host_own_rps": None if host_own is None else round(host_own, 4),
                        "fit": [round(x, 9) for x in fit],
                        "profile": doc["_path"],
                    }
                )
    return rows


def layout_key(model: str, pp: int, split: str | None) -> tuple[str, int, str]:
    """(model, stages, layer split): which hand-off measurements price which layout."""
    return model, pp, str(split)


#: predictions: ring / own accounting, with the calibration's hand-off or the host's measured one
KEYS = ("ring", "own", "host_ring", "host_own")


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each PP > 1 row's measured and predicted requests/s relative to the PP-1 row of the same
    model, GPU type and mix: machine-wide errors of the step fit cancel in the ratio."""
    base = {(r["model"], r["gpu"], tuple(r["mix"])): r for r in rows if r["pp"] == 1}
    for r in rows:
        one = base.get((r["model"], r["gpu"], tuple(r["mix"])))
        if r["pp"] == 1 or not one:
            continue
        if one["measured_rps"] > 0:
            r["measured_vs_pp1"] = round(r["measured_rps"] / one["measured_rps"], 4)
        for key in KEYS:
            if one.get(f"{key}_rps") and r.get(f"{key}_rps") is not None:
                r[f"{key}_vs_pp1"] = round(r[f"{key}_rps"] / one[f"{key}_rps"], 4)
    return rows


def prompt_penalties(rows: list[dict]) -> list[dict]:
    """For each (model, GPU type, PP > 1) measured at two mixes: the PP ÷ PP-1 ratio at the more
    prompt-heavy mix divided by the one at the other, measured and under each accounting.

    Host-wide factors that scale both mixes' ratios alike (a slower host, other users' load)
    cancel here; a per-step cost does not: every node of the local cluster is the same 2-core
    machine, and each stage boundary adds tens of ms to every step there, which the
    decode-heavy mix pays ~10 times as often per request. So the measured penalty is compared
    with predictions that price that hand-off (the ``host_`` keys), not with the GPU link's. At
    the GPU link a ring stall makes the penalty well below 1 and own-micro-batch accounting
    about 1; with the host's hand-off both are above 1, the ring lower."""
    out = []
    keyed: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["pp"] > 1 and "measured_vs_pp1" in r:
            keyed.setdefault((r["model"], r["gpu"], r["pp"], r["split"]), []).append(r)
    for (model, gpu, pp, split), group in sorted(keyed.items()):
        group.sort(key=lambda r: r["mix"][0] / r["mix"][1], reverse=True)
        for heavy, light in zip(group, group[1:]):
            entry = {"model": model, "gpu": gpu, "pp": pp, "split": split,
                     "prompt_mix": heavy["mix"], "decode_mix": light["mix"],
                     "measured": round(heavy["measured_vs_pp1"] / light["measured_vs_pp1"], 4)}
            for key in KEYS:
                a, b = heavy.get(f"{key}_vs_pp1"), light.get(f"{key}_vs_pp1")
                entry[key] = round(a / b, 4) if a and b else None
            out.append(entry)
    return out


#: A decode "step" below this is no step: the engine streamed the request's tokens in one burst
#: (seen at PP 1: 9 µs per token), so the gap between chunks measures nothing.
MIN_STEP_S = 1e-3


def handoffs(profiles: list[dict]) -> list[dict]:
    """Per pipeline profile: the median over decode batch sizes of (its TPOT − the PP-1 TPOT of
    the same model, GPU type and batch) ÷ stages: what each stage's hand-off adds on this host
    (activations sent over loopback between processes sharing its cores), beside the
    calibration's inter-node hand-off. ÷ S, not ÷ (S − 1): the model adds one hand-off to every
    stage's step and a token takes S of those steps (``perf.throughput_from_coeffs``: each stage
    gets TPOT / S), so the prediction reproduces the TPOT the hand-off was taken from only so
    (÷ (S − 1), as until 20:57 UTC 2026-12-01, it charged 2x the measured rise at PP 2). One
    micro-batch: all b requests start at once."""
    cal = perf._calibration()
    out = []
    for doc in profiles:
        if doc["pp"] < 2:
            continue
        base = {}
        for d in profiles:
            if d["pp"] == 1 and (d["model"], d["gpu"]) == (doc["model"], doc["gpu"]):
                for p in d.get("step_latency", []):
                    if p["prefill_tokens"] == 0 and p["seconds"] >= MIN_STEP_S:
                        base.setdefault(p["decode_seqs"], []).append(p["seconds"])
        extra = [
            (p["seconds"] - statistics.median(base[p["decode_seqs"]])) / doc["pp"]
            for p in doc.get("step_latency", [])
            if p["prefill_tokens"] == 0 and p["decode_seqs"] in base and p["seconds"] >= MIN_STEP_S
        ]
        if extra:
            out.append({"model": doc["model"], "pp": doc["pp"],
                        "split": doc.get("layer_partition"), "points": len(extra),
                        "measured_ms": round(1e3 * statistics.median(extra), 2),
                        "calibration_alpha_ms": round(1e3 * cal.pp_alpha_s, 3),
                        "profile": doc["_path"]})
    return out


def _config_of(profile: str) -> str:
    """The config a profile was measured with: its folder under paper_pp_profiles/."""
    parts = Path(profile).parts
    return parts[parts.index("paper_pp_profiles") + 1] if "paper_pp_profiles" in parts else "?"


def unbound() -> bool:
    """True when every partition of every config runs its engine unbound
    (``VLLM_CPU_OMP_THREADS_BIND=nobind``), as examples/vllm-cpu.yaml does."""
    from coral_hpc.config import load_deployment

    return all(
        part.environment is not None
        and dict(part.environment.env).get("VLLM_CPU_OMP_THREADS_BIND") == "nobind"
        for path in sorted(CONFIGS.glob("*.yaml"))
        for part in load_deployment(str(path)).cluster.partitions
    )


def binding_paragraph() -> str:
    """Where the profiled engines' threads ran, from the configs' engine environment (the
    engine logs' own lines are recorded per run in :data:`RUNS`)."""
    if unbound():
        return (
            "Where the engines' threads ran: unbound, as in examples/vllm-cpu.yaml "
            "(`VLLM_CPU_OMP_THREADS_BIND=nobind`, `OMP_NUM_THREADS=1`): each stage's engine "
            "computes on one thread that the OS may put on either of the host's 2 cores, so "
            "PP 2's two stages can run side by side and PP 3's three share 2 cores. Every "
            "stage's engine log of the runs below says `VLLM_CPU_OMP_THREADS_BIND='nobind'`, "
            "`reserved_cpus=[]`. Until 22:45 UTC 2026-12-01 (commit df79e4b's profiles) the "
            "configs left vLLM's `auto` binding, which on this host bound every stage of a "
            "pipeline to core 0 (`local_rank=0, core ids=[0]`, `reserved_cpus=[1]`), so its "
            "stages took turns on one core; those figures (PP 2 ÷ PP 1 = 0.62 at 438/6, 0.17 "
            "at 32/64; PP 3 0.07 at 438/6) are in git history, not here."
        )
    return (
        "Where the engines' threads ran: each config's engine environment as this report was "
        "written (unset: vLLM's `auto`, which on this host binds every engine process, so every "
        "stage of a pipeline, to core 0, reserving core 1 — the engine logs of the PP-3 run say "
        "`local_rank=0, core ids=[0]`, `reserved_cpus=[1]` for each of its three stages). So the "
        "two configs' PP 1, 2 and 3 profiles ran every stage on the same single core: a "
        "pipeline's stages took turns on it rather than running side by side (on one core, "
        "every stage's prompt work is paid by all micro-batches whatever the scheduler does)."
    )


#: When, under what load and with which binding the committed profiles were measured: written
#: by hand from each `coral-hpc profile` run's console and engine logs (the logs are not kept)
RUNS = ROOT / "bench/results/paper_pp_profiles/runs.yaml"


def measurement_runs() -> list[str]:
    """The md lines that say how each profile was measured and what was seen beside the
    figures (:data:`RUNS`: ``runs``, each with its time, load, binding and optional ``cpu`` and
    ``result``; ``notes``)."""
    if not RUNS.is_file():
        return []
    record = yaml.safe_load(RUNS.read_text()) or {}
    lines = ["Measurement runs (both the Slurm and the bench lock held; the 1-min load average "
             "at start and end; the binding each stage's engine log reported; cpu: mean over the "
             "measurement window, % of one core):", ""]
    for run in record.get("runs", []):
        lines.append(
            f"- {run['config']} {run['layouts']}: {run['start_utc']}–{run['end_utc']} UTC, "
            f"load {run['load_start']}–{run['load_end']}; {run['binding']}"
            + (f"; cpu: {run['cpu']}" if run.get("cpu") else "")
            + (f"; measured {run['result']}" if run.get("result") else "")
            + ("" if run.get("committed", True) else " (not the committed profiles)"))
    notes = record.get("notes", [])
    if notes:
        lines += ["", "Seen beside the figures:", "", *[f"- {note}" for note in notes]]
    return [*lines, ""]


def penalty_direction(penalties: list[dict], prefix: str) -> list[str]:
    """A line on the sign of the prompt penalty, which the medians hide: above 1, a pipeline
    loses more at the decode-heavy mix; a ring stall predicts the prompt-heavy mix losing more
    (below 1, with the same hand-off)."""
    pairs = [(p["measured"], p.get(f"{prefix}ring"), p.get(f"{prefix}own")) for p in penalties]
    if not pairs:
        return []
    n = len(pairs)

    def above(i: int) -> int:
        return sum(1 for pair in pairs if pair[i] is not None and pair[i] > 1)

    return [
        f"Direction of the prompt penalty: above 1 (the pipeline loses more at the decode-heavy "
        f"mix) in {above(0)} of {n} layouts measured (" + ", ".join(
            f"{p[0]:.2f}" for p in pairs) + f"); the ring predicts above 1 in {above(1)} of {n}, "
        f"own micro-batch in {above(2)} of {n}.",
        "",
    ]


def _ring_state() -> str:
    """What bench/results/pp_ring.md says so far, for the sentence that points to it."""
    path = ROOT / "bench/results/pp_ring.md"
    if not path.is_file():
        return ": not yet run"
    return ": no verdict yet, see there" if "No verdict" in path.read_text() else ""


def _log_err(pred: float, meas: float) -> float:
    return abs(math.log(pred / meas)) if pred > 0 and meas > 0 else math.inf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profiles",
        action="append",
        type=Path,
        help="a measured-profile folder (repeatable; default: the configs')",
    )
    parser.add_argument("--out", default=str(ROOT / "bench/results/paper_pp"))
    args = parser.parse_args(argv)
    folders = args.profiles or profile_dirs()
    profiles = load_profiles([f for f in folders if f.is_dir()])
    rows = with_ratios(compare(profiles))
    if not any(r["pp"] > 1 for r in rows):
        print(
            "bench/paper_pp.py: no measured pipeline throughput points in "
            + ", ".join(map(str, folders))
            + "; run `coral-hpc profile` first (see the module "
            "doc)",
            file=sys.stderr,
        )
        return 2
    penalties = prompt_penalties(rows)
    hand = handoffs(profiles)
    verdict = {}
    #: the same over every PP > 1 row's ratio to PP 1 (layouts measured at one mix only, PP 3
    #: among them, count here; host-wide errors of the step fit cancel, the hand-off does not)
    ratio_verdict = {}
    basis = "penalty" if penalties else "ratio"
    host = any(p.get("host_own") for p in penalties)
    accountings = (("prompts stall the ring", "ring"), ("own micro-batch only", "own"))
    for name, key in accountings:
        key = f"host_{key}" if host else key
        ratio_errs = [
            _log_err(r[f"{key}_vs_pp1"], r["measured_vs_pp1"])
            for r in rows
            if "measured_vs_pp1" in r and f"{key}_vs_pp1" in r
        ]
        pen_errs = [_log_err(p[key] or 0.0, p["measured"]) for p in penalties]
        verdict[name] = statistics.median(pen_errs or ratio_errs or [math.inf])
        ratio_verdict[name] = statistics.median(ratio_errs or [math.inf])
    finite = {k: v for k, v in verdict.items() if math.isfinite(v)}
    if basis != "penalty":
        best = "not decided: no layout was measured at two mixes (see below)"
    elif finite:
        best = min(finite, key=finite.get)
        by_ratio = {k: v for k, v in ratio_verdict.items() if math.isfinite(v)}
        if by_ratio and min(by_ratio, key=by_ratio.get) != best:
            # the prompt penalty cancels host-wide factors, the ratios keep every layout: when
            # they disagree the data decide nothing
            best = (f"not decided: the prompt penalty favours {best}, the PP ÷ PP 1 ratios "
                    f"{min(by_ratio, key=by_ratio.get)}")
    else:
        best = "neither: the model predicts 0 req/s for every point with these step times"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"rows": rows, "prompt_penalties": penalties, "handoffs": hand, "basis": basis,
                    "median_log_error": verdict, "median_log_error_vs_pp1": ratio_verdict,
                    "fits_best": best}, indent=1) + "\n"
    )
    lines = [
        "# Pipeline accounting vs the real engine (bench/paper_pp.py)",
        "",
        (
            "Measured: `coral-hpc profile` on vLLM's CPU build (see the module doc). Predicted: "
            "`coral_solver.perf.throughput_from_coeffs` on step times fitted to each model's PP-1 "
            "steps."
        ),
        "",
        (
            "| model | GPU | PP | split | mix in/out | SLO s | measured req/s | ring | own | "
            "ring, host hand-off | own, host hand-off | measured ÷ PP 1 | ring ÷ PP 1 | "
            "own ÷ PP 1 | ring, host ÷ PP 1 | own, host ÷ PP 1 |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(value) -> str:
        return "—" if value is None else f"{value:.3f}"

    for r in rows:
        lines.append(
            f"| {r['model']} | {r['gpu']} | {r['pp']} | {r['split']} | "
            f"{r['mix'][0]}/{r['mix'][1]} | "
            f"{r['slo'][0]:g}/{r['slo'][1]:g} | {r['measured_rps']:.3f} | "
            + " | ".join(num(r.get(f"{k}_rps")) for k in KEYS) + " | "
            + " | ".join(num(r.get(f"{k}_vs_pp1")) for k in ("measured", *KEYS))
            + " |"
        )
    unserved = [d for d in profiles if not d.get("throughput")]
    if unserved:
        lines += ["", "Measured with no load level within the SLO (`coral-hpc profile` writes no "
                  "throughput point; its log has the levels): " + "; ".join(
                      f"{d['model']} PP {d['pp']} ({d.get('layer_partition', '—')}) in "
                      f"{Path(d['_path']).parents[0 if d['pp'] == 1 else 1].name}"
                      for d in unserved) + "."]
    lines += ["", "Prompt penalty of PP (PP ÷ PP 1 at the prompt-heavy mix, divided by the same "
              "at the decode-heavy mix; see `prompt_penalties`):", ""]
    if penalties:
        lines += ["| model | PP | split | mixes | measured | ring | own | ring, host hand-off | "
                  "own, host hand-off |", "|---|---|---|---|---|---|---|---|---|"]
        for p in penalties:
            lines.append(
                f"| {p['model']} | {p['pp']} | {p['split']} | "
                f"{p['prompt_mix'][0]}/{p['prompt_mix'][1]} vs "
                f"{p['decode_mix'][0]}/{p['decode_mix'][1]} | "
                f"{p['measured']:.3f} | "
                + " | ".join(f"{p[k]:.3f}" if p.get(k) else "—" for k in KEYS) + " |")
    else:
        lines.append("none: no layout was measured at two mixes with PP-1 points of both.")
    what = {"penalty": "of the prompt penalty above", "ratio": "of the ratios to PP 1"}[basis]
    what += ", with the host's measured hand-off" if host else ", with the calibration's hand-off"
    lines += [
        "",
        f"Median |log(predicted / measured)| over PP > 1 ({what}): "
        + "; ".join(f"{k}: {v:.3f}" for k, v in verdict.items())
        + f". Fits best: **{best}**.",
        "",
        *penalty_direction(penalties, "host_" if host else ""),
        "Median |log(predicted / measured)| of PP ÷ PP 1 over every PP > 1 row (each at its "
        "own mix" + (", with the host's measured hand-off" if host else "") + "): "
        + "; ".join(f"{k}: {v:.3f}" for k, v in ratio_verdict.items()) + ".",
        "",
        "Hand-off per stage step (median over decode batches of (pipeline TPOT − PP-1 TPOT) "
        "÷ S, as the model adds one to each of a token's S stage steps; decode steps under 1 ms, "
        "tokens streamed in one burst, are left out):",
        "",
        *([f"- {h['model']} PP {h['pp']} ({h['split']}), {_config_of(h['profile'])}: "
           f"{h['measured_ms']:.2f} ms "
           f"({h['points']} batch sizes); the calibration's inter-node alpha: "
           f"{h['calibration_alpha_ms']:.3f} ms (GPU nodes, another link)" for h in hand]
          or ["- none measured (no PP-1 decode step above 1 ms to compare with)"]),
        "",
        "How to read it. Predictions are for a closed loop (`poisson_tail=False`: no Poisson "
        "surge, no KV-slot queue), as `coral-hpc profile` loads the engine (a fixed number of "
        f"clients per level, the best level whose requests all met the SLO), with at most "
        f"{MAX_CLIENTS} requests in flight: the sweep stops there. The model prices stages as "
        "parallel hardware; here all stages share one 2-core host (every node of the local "
        "cluster is that host, no cgroups), and each stage boundary costs a step "
        + (f"{min(h['measured_ms'] for h in hand):.1f}–{max(h['measured_ms'] for h in hand):.1f} ms"
           if hand else "an unmeasured time")
        + " there (above), not the GPU link's 0.03 ms: so only the host hand-off columns are "
        "comparable with the engine. The prompt penalty does not cancel that hand-off (it is "
        "paid per step, and the decode-heavy mix makes 64 steps per request where the "
        "prompt-heavy one makes 6), which is why it is compared with the host hand-off "
        "predictions, not with 1. The hand-off is measured on decode steps, not on the "
        "throughput points compared here. Where stages share cores a stall and CPU contention "
        "are entangled; bench/pp_ring.py measures the stall alone, with each stage on a core "
        "of its own (bench/results/pp_ring.md"
        + _ring_state()
        + ").",
        "",
        binding_paragraph(),
        "",
        *[f"- {line}" for line in bindings()],
        "",
        *measurement_runs(),
    ]
    names = {"prompts stall the ring": "ring", "own micro-batch only": "own"}
    shown = [best] if best in names else list(names)  # undecided: measured vs both
    for name in shown:
        key = f"host_{names[name]}" if host else names[name]
        fitted = [r for r in rows if r["pp"] > 1 and r.get(f"{key}_vs_pp1") is not None
                  and "measured_vs_pp1" in r]
        lines += [
            f"PP ÷ PP 1 per mix, measured vs **{name}**"
            + (" with the host's hand-off" if host else "") + ": "
            + "; ".join(f"{r['model']} PP {r['pp']} ({r['split']}) at "
                        f"{r['mix'][0]}/{r['mix'][1]}: {r['measured_vs_pp1']:.2f} vs "
                        f"{r[f'{key}_vs_pp1']:.2f}" for r in fitted) + ".",
            "",
        ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {out.with_suffix('.md')}: fits best: {best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
