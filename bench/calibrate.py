#!/usr/bin/env python3
"""Refit the performance model's efficiency factors on public measured data; report held-out error.

Reads ../shared/data (Helix per-layer vLLM timings, Vidur operator and collective profiles; see
their READMEs and GPU-AND-MODEL-FACTS.md), fits per GPU type the factors of
:mod:`coral_solver.perf_model` (prefill MFU, decode MBU, compute/memory overlap, per-layer floor),
per interconnect the all-reduce latency and bus bandwidth, the pipeline hand-off, the per-step
engine overhead and the memory reserve, then evaluates leave-one-GPU-type-out error: each GPU's
points predicted from the factors of the *other* GPUs of its class (what an uncalibrated GPU
gets). Writes bench/results/calibrate.json and .md and rewrites profiles/calibration.yaml.

Usage: .venv/bin/python bench/calibrate.py [--data DIR] [--profiles DIR] [--results DIR] [--no-write]
Without the data directory it says so and exits 0, changing nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from coral_solver.catalog import GpuSpec, ModelArch, load_gpus
from coral_solver.perf_model import build_coeffs, compute_time
from coral_solver.perf_profiles import Factors

HELIX_COMMIT = "148b733080c0c5d3ddca0fe3c985b2e52a7f7b35"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
VIDUR_CPU_COMMIT = "6d98aa8"
VIDUR_ATTN_COMMIT = "e2d00e9"
GOAL = 0.15

# Helix machine -> (our GPU type, GPUs per VM). Google Cloud VMs: A100 is the 40 GB part.
HELIX_MACHINES = {"a100": ("a100", 1), "v100": ("v100", 1), "l4": ("l4", 1), "t4": ("t4", 1),
                  "l4x2": ("l4", 2), "t4x2": ("t4", 2), "t4x4": ("t4", 4)}
# Vidur device -> our GPU type (its "a100" is the 80 GB part: MBU is quoted vs 2039 GB/s).
VIDUR_DEVICES = {"a100": "a100-80g", "h100": "h100", "a40": "a40"}
# Helix simulator constants (AVG_INPUT_LEN=750, AVG_OUTPUT_LEN=240): decode points are taken to
# hold input + output/2 tokens of context per sequence; prompt batches are made of 750-token
# prompts. The profile CSVs do not state either, so these are assumptions of the fit.
HELIX_DECODE_CTX = 750 + 240 / 2
HELIX_PROMPT_LEN = 750


def _arch(name: str, layers: int, hidden: int, q: int, kv: int, ffn: int, gated: bool = True,
          head_dim: int | None = None) -> ModelArch:
    """A per-layer architecture for calibration: vocab 0 (the measurements exclude lm_head)."""
    head_dim = head_dim or hidden // q
    per_layer = hidden * head_dim * (2 * q + 2 * kv) + (3 if gated else 2) * hidden * ffn
    return ModelArch(
        name=name, layers=layers, hidden=hidden, q_heads=q, kv_heads=kv, head_dim=head_dim,
        ffn=ffn, experts=0, active_experts=0, params_b=per_layer * layers / 1e9,
        active_params_b=per_layer * layers / 1e9, vocab=0, max_context=4096,
        weight_bytes=2.0 * per_layer * layers, kv_bytes_per_token=2 * layers * kv * head_dim * 2,
        quantization="bf16")


HELIX_ARCHS = {
    "llama2_70b": _arch("llama-2-70b", 80, 8192, 64, 8, 28672),
    "llama1_30b": _arch("llama-1-30b", 60, 6656, 52, 52, 17920),
}


@dataclass(frozen=True)
class Point:
    """One measured time and the step that produced it."""

    gpu: str
    source: str  # helix-prefill | helix-decode | vidur-gemm
    arch: ModelArch
    tp: int
    decode: float
    prefill: float
    context: float
    prefill_ctx: float
    seconds: float
    gemm_only: bool = False

    @property
    def series(self) -> tuple:
        return (self.gpu, self.source, self.arch.name, self.tp)


# --- loading --------------------------------------------------------------------------------

def _rows(path: Path) -> list[list[str]]:
    with path.open() as fh:
        return [row for row in csv.reader(fh) if row]


def load_helix(data: Path) -> list[Point]:
    """Helix per-layer CSVs. Values recorded in whole ms are kept only from 5 ms up (rounding
    error <= 10 %: that is measurement resolution, not model error)."""
    points = []
    for model, arch in HELIX_ARCHS.items():
        for machine, (gpu, n) in HELIX_MACHINES.items():
            folder = data / "profiles-helix" / model / machine
            for kind in ("prompt", "decode"):
                for tokens_s, ms_s in _rows(folder / f"{kind}_bs2time.csv"):
                    tokens, ms = int(float(tokens_s)), float(ms_s)
                    if tokens <= 0 or ms <= 0 or (ms == round(ms) and ms < 5):
                        continue
                    if kind == "prompt":
                        points.append(Point(gpu, "helix-prefill", arch, n, 0, tokens, 0,
                                            min(tokens, HELIX_PROMPT_LEN) / 2, ms / 1e3))
                    else:
                        points.append(Point(gpu, "helix-decode", arch, n, tokens, 0,
                                            tokens * HELIX_DECODE_CTX, 0, ms / 1e3))
    return points


def load_vidur_gemm(data: Path) -> list[Point]:
    """Vidur per-layer non-attention ops (QKV/O/gate-up/down GEMMs, norms, rope, activation, add)
    per TP worker; no collective inside. Compared with the model's linear-layer time."""
    points = []
    root = data / "profiles-vidur" / "compact" / "compute"
    for device, gpu in VIDUR_DEVICES.items():
        for path in sorted((root / device).glob("*/*/mlp.csv")):
            with path.open() as fh:
                for row in csv.DictReader(fh):
                    ms = sum(float(v) for k, v in row.items()
                             if k.startswith("time_stats.") and not k.startswith("time_stats.emb")
                             and v not in ("", None))
                    hidden, q, kv = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
                    arch = _arch(path.parent.name, 1, hidden, q, kv, int(row["n_expanded_embd"]),
                                 gated=row["use_gated_mlp"] == "True")
                    tokens = int(row["num_tokens"])
                    points.append(Point(gpu, "vidur-gemm", arch,
                                        int(row["num_tensor_parallel_workers"]), 0, tokens, 0, 0,
                                        ms / 1e3, gemm_only=True))
    return points


# --- the model on a point -------------------------------------------------------------------

def predict(p: Point, gpu: GpuSpec, f: Factors, alpha_s: float, bus_bw: float) -> float:
    """Model time of point ``p`` (seconds) with factors ``f`` — perf_model's own arithmetic."""
    c = build_coeffs(p.arch, gpu, p.tp, 1, f, alpha_s, bus_bw)
    if p.gemm_only:
        c = replace(c, kv_bytes_per_token=0.0, attn_flops=0.0, comm_alpha_s=0.0,
                    comm_s_per_token=0.0)
    return compute_time(c, p.decode, p.prefill, p.context, p.prefill_ctx)


def series_loss(points: list[Point], gpus: dict[str, GpuSpec], factors: dict[str, Factors],
                alpha_s: float, bus_bw: float) -> float:
    """Mean over series of the mean |log(predicted / measured)|: each curve counts once."""
    by_series: dict[tuple, list[float]] = {}
    for p in points:
        pred = predict(p, gpus[p.gpu], factors[p.gpu], alpha_s, bus_bw)
        by_series.setdefault(p.series, []).append(abs(math.log(pred / p.seconds)))
    return statistics.fmean(statistics.fmean(v) for v in by_series.values())


def nelder_mead(fun, x0: np.ndarray, step: float = 0.5, iters: int = 400, tol: float = 1e-7
                ) -> np.ndarray:
    """Minimise ``fun`` from ``x0`` (a small standard Nelder-Mead; the losses are not smooth)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [fun(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = fun(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = fun(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = fun(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [fun(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _subsample(points: list[Point]) -> list[Point]:
    """Fit on log-spaced token counts per series (evaluation uses every point)."""
    keep = {1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192}
    return [p for p in points if not p.gemm_only or int(p.prefill) in keep]


def fit_gpu(points: list[Point], gpu: GpuSpec, base: Factors) -> Factors:
    """Fit prefill_mfu, decode_mbu, overlap, layer_floor_us of one GPU on its single-GPU points."""
    pts = _subsample([p for p in points if p.tp == 1] or points)
    gpus = {gpu.name: gpu}

    def make(x: np.ndarray) -> Factors:
        return replace(base, prefill_mfu=_sig(x[0]), decode_mbu=_sig(x[1]), overlap=_sig(x[2]),
                       layer_floor_us=math.exp(x[3]))

    def loss(x: np.ndarray) -> float:
        return series_loss(pts, gpus, {gpu.name: make(x)}, 0.0, 1.0)

    x0 = np.array([_logit(0.7), _logit(0.8), _logit(0.3), math.log(5.0)])
    return make(nelder_mead(loss, x0))


def fit_comm(points: list[Point], gpus: dict[str, GpuSpec], factors: dict[str, Factors],
             alpha0_us: float, bw0_gbs: float) -> tuple[float, float]:
    """Fit (alpha_us, bus_bw_gbs) of the TP all-reduce on multi-GPU step points."""
    if not points:
        return alpha0_us, bw0_gbs

    def loss(x: np.ndarray) -> float:
        return series_loss(points, gpus, factors, math.exp(x[0]) * 1e-6, math.exp(x[1]) * 1e9)

    x = nelder_mead(loss, np.array([math.log(alpha0_us), math.log(bw0_gbs)]))
    return float(math.exp(x[0])), float(math.exp(x[1]))


def fit_allreduce(data: Path, setups: tuple[str, ...], workers: tuple[int, ...] = (2, 4, 8)) -> dict:
    """alpha + 2 (n-1)/n * size / bus_bw on Vidur's intra-node NCCL all-reduce medians."""
    samples = []
    for setup in setups:
        with (data / "profiles-vidur/raw/network" / setup / "all_reduce.csv").open() as fh:
            for row in csv.DictReader(fh):
                n = int(row["num_workers"])
                if int(row["devices_per_node"]) != n or int(row["rank"]) != 0 or n not in workers:
                    continue
                samples.append((n, float(row["size"]), float(row["time_stats.all_reduce.median"]) / 1e3))
    return _fit_alpha_bw(samples, f"Vidur raw/network/{{{','.join(setups)}}}/all_reduce.csv "
                                  f"(TP {','.join(map(str, workers))}) @ {VIDUR_COMMIT[:7]}")


def fit_allreduce_legacy(data: Path, device: str) -> dict:
    """The same fit on Vidur's legacy per-device all-reduce table (payload tokens x hidden x 2 B)."""
    samples = []
    path = next((data / "profiles-vidur/compact/network_legacy").glob(f"{device}_all_reduce*.csv"))
    with path.open() as fh:
        for row in csv.DictReader(fh):
            size = int(row["num_tokens"]) * int(row["n_embd"]) * 2
            if int(row["rank"]) != 0 or size <= 0:
                continue
            samples.append((int(row["num_workers"]), float(size),
                            float(row["time_stats.all_reduce.median"]) / 1e3))
    return _fit_alpha_bw(samples, f"Vidur compact/network_legacy/{path.name}")


def _fit_alpha_bw(samples: list[tuple[int, float, float]], source: str) -> dict:

    def loss(x: np.ndarray) -> float:
        a, bw = math.exp(x[0]) * 1e-6, math.exp(x[1]) * 1e9
        return statistics.fmean(abs(math.log((a + 2 * (n - 1) / n * s / bw) / t)) for n, s, t in samples)

    x = nelder_mead(loss, np.array([math.log(30.0), math.log(150.0)]))
    errs = [abs((math.exp(x[0]) * 1e-6 + 2 * (n - 1) / n * s / (math.exp(x[1]) * 1e9)) / t - 1)
            for n, s, t in samples]
    return {"alpha_us": float(math.exp(x[0])), "bus_bw_gbs": float(math.exp(x[1])),
            "points": len(samples), "median_abs_err": statistics.median(errs), "source": source}


def fit_pipeline(data: Path) -> dict:
    """Hand-off between nodes: alpha + size / bw on Vidur's cross-node send_recv (A100 DGX, IB)."""
    samples = []
    with (data / "profiles-vidur/raw/network/a100_dgx/send_recv.csv").open() as fh:
        for row in csv.DictReader(fh):
            if int(row["devices_per_node"]) == 1 and int(row["rank"]) == 0:
                samples.append((float(row["size"]), float(row["time_stats.send_recv.median"]) / 1e3))
    if not samples:
        return {"alpha_ms": 0.25, "bw_gbs": 10.0, "points": 0, "source": "default"}

    def loss(x: np.ndarray) -> float:
        return statistics.fmean(abs(math.log((math.exp(x[0]) * 1e-3 + s / (math.exp(x[1]) * 1e9)) / t))
                                for s, t in samples)

    x = nelder_mead(loss, np.array([math.log(0.1), math.log(10.0)]))
    return {"alpha_ms": float(math.exp(x[0])), "bw_gbs": float(math.exp(x[1])),
            "points": len(samples),
            "source": f"Vidur raw/network/a100_dgx/send_recv.csv (devices_per_node=1) @ {VIDUR_COMMIT[:7]}"}


def fit_attention(data: Path, gpu: GpuSpec) -> dict:
    """KV-read efficiency (decode) and attention FLOPS efficiency (prefill) on Vidur's A100 TP2
    FlashAttention profile (64 q / 8 kv heads, head 128: 32 q / 4 kv heads per GPU)."""
    path = next((data / "profiles-vidur/compact/attention").glob("*.csv"))
    kv_eff, attn_eff = [], []
    with path.open() as fh:
        for row in csv.DictReader(fh):
            tp = int(row["num_tensor_parallel_workers"])
            q = int(row["n_q_head"]) // tp
            kv = max(int(row["n_kv_head"]) // tp, 1)
            head = int(row["n_embd"]) // int(row["n_q_head"])
            ctx = int(row["kv_cache_size"])
            if row["is_prefill"] == "True":
                chunk = int(row["prefill_chunk_size"])
                ms = float(row["time_stats.attn_prefill.median"] or 0)
                if chunk >= 1024 and ms > 0:
                    flops = 4.0 * chunk * (ctx + chunk / 2) * q * head
                    attn_eff.append(flops / (ms / 1e3) / (gpu.fp16_tflops * 1e12))
            else:
                batch = int(row["batch_size"])
                ms = float(row["time_stats.attn_decode.median"] or 0)
                if batch * ctx >= 32768 and ms > 0:
                    kv_bytes = batch * ctx * 2 * kv * head * 2
                    kv_eff.append(kv_bytes / (ms / 1e3) / (gpu.mem_bw_gbs * 1e9))
    return {"kv_mbu": statistics.median(kv_eff), "attn_mfu": statistics.median(attn_eff),
            "kv_points": len(kv_eff), "attn_points": len(attn_eff),
            "source": f"Vidur compact/attention/{path.name} (upstream commit {VIDUR_ATTN_COMMIT})"}


def fit_overhead(data: Path) -> dict:
    """Per-step CPU work of the engine: schedule + sampler + prepare_inputs + output processing
    (Vidur's medians of the old Ray-based vLLM: an upper bound for vLLM >= 0.6)."""
    totals = []
    for name in ("a100", "a40"):
        path = data / "profiles-vidur/raw/cpu_overheads" / f"{name}_cpu_overheads.csv"
        with path.open() as fh:
            for row in csv.DictReader(fh):
                totals.append(sum(float(row[k]) for k in (
                    "schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
                    "process_model_outputs_median")))
    return {"vidur_old_vllm_cpu_ms": statistics.median(totals), "points": len(totals),
            "vidur_source": f"Vidur raw/cpu_overheads/{{a100,a40}}_cpu_overheads.csv @ {VIDUR_CPU_COMMIT}"}


def fit_reserve(data: Path, gpus: dict[str, GpuSpec]) -> dict:
    """Per-GPU memory outside weights and KV pool, from Helix's vLLM block counts (util 0.9)."""
    reserves = []
    with (data / "profiles-helix/derived/helix_machine_meta.csv").open() as fh:
        for row in csv.DictReader(fh):
            gpu, n = HELIX_MACHINES[row["machine"]]
            arch = HELIX_ARCHS[row["model"]]
            layers = int(row["max_num_layers"])
            weights = arch.weight_bytes / arch.layers * layers
            kv = int(row["vllm_num_blocks_at_max_layers"]) * 16 * arch.kv_bytes_per_token / arch.layers * layers
            reserves.append((0.9 * gpus[gpu].memory_gb * 1e9 * n - weights - kv) / n / 1e9)
    return {"reserve_gb": statistics.median(reserves), "points": len(reserves),
            "per_machine_gb": [round(r, 2) for r in reserves],
            "source": f"Helix derived/helix_machine_meta.csv (from the per-machine files @ {HELIX_COMMIT[:7]})"}


# --- end-to-end checks (published vLLM figures quoted in GPU-AND-MODEL-FACTS.md §5) ------------

@dataclass(frozen=True)
class E2ECheck:
    """A published inter-token latency of a whole model: one engine step, overhead included."""

    label: str
    gpu: str
    arch: str
    decode: int
    prefill: float  # prompt tokens interleaved per step (decode x input / output under load)
    context: float
    seconds: float
    source: str
    fit_overhead: bool  # single-stream points pin the per-step overhead


E2E_CHECKS = (
    E2ECheck("Llama-3-8B A10G conc 1 (550 in / 150 out): ITL 30.7 ms", "a10g", "llama-3.1-8b",
             1, 0, 550 + 75, 0.0307, "llmperf write-up 'Benchmark: Llama 3 8b Instruct on NVIDIA A10G', vLLM 0.4.3", True),
    # Under load not every client sequence decodes at once (KV limit, queueing): the decoding
    # batch is taken from Little's law, output tok/s x ITL (290 x 42.7 ms; 301 x 61.7 ms).
    E2ECheck("Llama-3-8B A10G conc 16: ITL 42.7 ms at 290 tok/s (batch ~12)", "a10g",
             "llama-3.1-8b", 12, 12 * 550 / 150, 12 * 625, 0.0427, "same write-up", False),
    E2ECheck("Llama-3-8B A10G conc 64: ITL 61.7 ms at 301 tok/s (batch ~19)", "a10g",
             "llama-3.1-8b", 19, 19 * 550 / 150, 19 * 625, 0.0617, "same write-up", False),
    E2ECheck("Llama-3.1-8B A100-40GB conc 1 (1024 in / 128 out): 75 tok/s", "a100", "llama-3.1-8b",
             1, 0, 1024 + 64, 1 / 75, "johnmusgrave.com vLLM throughput-latency sweep, vLLM 0.23", True),
    E2ECheck("Llama-3-8B A100-80GB-SXM 10 ShareGPT prompts: median TPOT 12.0 ms", "a100-80g",
             "llama-3.1-8b", 10, 0, 10 * 1000, 0.0120,
             "LambdaLabsML/vllm-benchmark results/prompt_10/1xA100-80GB-SXM, vLLM ~0.6", True),
)


def e2e(gpus, per_gpu, classes, comm, overhead_s: float | None) -> tuple[float, list[dict]]:
    """Fit the per-step overhead on single-stream checks (median of measured - modelled busy
    time, at least 0) unless given; return it and every check's prediction."""
    from coral_solver.catalog import load_models
    from coral_solver.perf_model import step_time
    models = load_models()
    rows = []
    for chk in E2E_CHECKS:
        gpu, arch = gpus[chk.gpu], models[chk.arch]
        f = per_gpu.get(chk.gpu) or classes[gpu.gpu_class]
        alpha_us, bw_gbs = comm_for(comm, gpu)
        c = build_coeffs(arch, gpu, 1, arch.layers, f, alpha_us * 1e-6, bw_gbs * 1e9)
        rows.append((chk, c, compute_time(c, chk.decode, chk.prefill, chk.context, 550 / 2)))
    if overhead_s is None:
        gaps = [chk.seconds - busy for chk, _c, busy in rows if chk.fit_overhead]
        overhead_s = max(0.0, statistics.median(gaps))
    out = []
    for chk, c, _busy in rows:
        pred = step_time(c, chk.decode, chk.prefill, chk.context, 550 / 2, overhead_s, 1, 0.0, 1.0)
        out.append({"check": chk.label, "gpu": chk.gpu, "calibrated_gpu": chk.gpu in per_gpu,
                    "measured_ms": round(chk.seconds * 1e3, 2), "predicted_ms": round(pred * 1e3, 2),
                    "error": round(pred / chk.seconds - 1, 4), "used_to_fit_overhead": chk.fit_overhead,
                    "source": chk.source})
    return overhead_s, out


# --- evaluation -----------------------------------------------------------------------------

def comm_for(comm: dict[str, tuple[float, float]], gpu: GpuSpec) -> tuple[float, float]:
    """(alpha_us, bus_bw_gbs) for ``gpu``: its own fit, else its interconnect's (as perf does)."""
    return comm.get(gpu.name) or comm[gpu.interconnect]


def _errors(points, gpus, factors, comm) -> list[float]:
    out = []
    for p in points:
        alpha, bw = comm_for(comm, gpus[p.gpu])
        out.append(predict(p, gpus[p.gpu], factors[p.gpu], alpha * 1e-6, bw * 1e9) / p.seconds - 1)
    return out


def _summary(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    return {"n": len(a), "median_abs_err": round(statistics.median(a), 4),
            "p90_abs_err": round(float(np.percentile(a, 90)), 4),
            "median_signed_err": round(statistics.median(errs), 4)}


def _median_factors(members: list[Factors]) -> Factors:
    fields = Factors.__dataclass_fields__
    return Factors(**{k: float(statistics.median(getattr(m, k) for m in members)) for k in fields})


def class_of(gpu: GpuSpec) -> str:
    return gpu.gpu_class


def run(data: Path, profiles: Path, results: Path, write: bool) -> dict:
    t0 = time.perf_counter()
    gpus = load_gpus(profiles)
    attention = fit_attention(data, gpus["a100-80g"])
    overhead = fit_overhead(data)
    reserve = fit_reserve(data, gpus)
    comm_fits = {
        "nvlink": fit_allreduce(data, ("a100_dgx",)),  # A100 NVSwitch: A100-40/80 and default
        "h100": fit_allreduce(data, ("h100_dgx",)),
        "h200": None,  # same NVLink4/NVSwitch as H100: filled below
        "v100": fit_allreduce_legacy(data, "v100"),
        "v100-32g": None,
        # PCIe4 host: 4-GPU all-reduce in a box whose GPUs are only NVLink-bridged in pairs
        "pcie": fit_allreduce(data, ("a100_pairwise_nvlink",), workers=(4,)),
    }
    comm_fits["h200"] = {**comm_fits["h100"], "source": "as h100 (same NVLink4 / NVSwitch)"}
    comm_fits["v100-32g"] = {**comm_fits["v100"], "source": "as v100 (same NVLink2)"}
    pipeline = fit_pipeline(data)

    helix, vidur = load_helix(data), load_vidur_gemm(data)
    points = helix + vidur
    single = [p for p in points if p.tp == 1 or p.gemm_only]
    multi_pcie = [p for p in helix if p.tp > 1]
    data_gpus = sorted({p.gpu for p in points})

    hbm_base = Factors(prefill_mfu=0.7, decode_mbu=0.8, kv_mbu=attention["kv_mbu"],
                       attn_mfu=attention["attn_mfu"], layer_floor_us=5.0)

    def base_for(gpu: GpuSpec) -> Factors:
        return hbm_base

    per_gpu = {g: fit_gpu([p for p in single if p.gpu == g], gpus[g], base_for(gpus[g]))
               for g in data_gpus}
    # power-capped parts run attention at the same fraction of their lower compute ceiling
    for g, f in per_gpu.items():
        if class_of(gpus[g]) == "power_capped":
            scale = f.prefill_mfu / statistics.median(
                x.prefill_mfu for n, x in per_gpu.items() if class_of(gpus[n]) != "power_capped")
            per_gpu[g] = replace(f, attn_mfu=min(1.0, attention["attn_mfu"] * scale))
    comm = {k: (v["alpha_us"], v["bus_bw_gbs"]) for k, v in comm_fits.items()}
    for g in sorted({p.gpu for p in multi_pcie}):  # T4 / L4 boxes measured by Helix: own fit
        alpha_us, bw_gbs = fit_comm([p for p in multi_pcie if p.gpu == g], gpus, per_gpu,
                                    *comm["pcie"])
        comm[g] = (alpha_us, bw_gbs)
        comm_fits[g] = {"alpha_us": alpha_us, "bus_bw_gbs": bw_gbs,
                        "points": sum(p.gpu == g for p in multi_pcie),
                        "source": f"Helix multi-GPU {g} VMs (TP 2/4) per-layer CSVs, given the single-GPU fit"}

    def class_factors(members: dict[str, Factors], cls: str) -> Factors:
        same = [f for g, f in members.items() if class_of(gpus[g]) == cls]
        if not same:  # e.g. gddr without its own member: use the non-power-capped GPUs
            same = [f for g, f in members.items() if class_of(gpus[g]) != "power_capped"]
        return _median_factors(same)

    classes = {cls: class_factors(per_gpu, cls) for cls in ("hbm", "gddr", "power_capped")}

    in_sample = {g: _summary(_errors([p for p in points if p.gpu == g], gpus, per_gpu, comm))
                 for g in data_gpus}
    held_out: dict[str, dict] = {}
    all_held = []
    for g in data_gpus:
        others = {n: f for n, f in per_gpu.items() if n != g}
        predicted = dict(per_gpu)
        predicted[g] = class_factors(others, class_of(gpus[g]))
        comm_g = {k: v for k, v in comm.items() if k != g}  # its interconnect's default
        pts = [p for p in points if p.gpu == g]
        errs = _errors(pts, gpus, predicted, comm_g)
        all_held += errs
        by_source = {}
        for src in sorted({p.source for p in pts}):
            idx = [i for i, p in enumerate(pts) if p.source == src]
            by_source[src] = _summary([errs[i] for i in idx])
        held_out[g] = {**_summary(errs), "by_source": by_source,
                       "predicted_from": sorted(n for n in others if class_of(gpus[n]) == class_of(gpus[g]))
                       or sorted(n for n in others if class_of(gpus[n]) != "power_capped")}
    gpu_medians = [v["median_abs_err"] for v in held_out.values()]
    overhead_s, checks = e2e(gpus, per_gpu, classes, comm, None)
    overhead["step_overhead_ms"] = overhead_s * 1e3
    overhead["source"] = ("GPU-AND-MODEL-FACTS.md §5 single-stream ITLs (median of measured - "
                          "modelled busy time)")
    report = {
        "data": str(data),
        "sources": {
            "helix": f"profiles-helix (Thesys-lab/Helix-ASPLOS25 @ {HELIX_COMMIT})",
            "vidur": f"profiles-vidur (microsoft/vidur @ {VIDUR_COMMIT}; cpu overheads @ "
                     f"{VIDUR_CPU_COMMIT}; attention @ {VIDUR_ATTN_COMMIT})",
        },
        "assumptions": {
            "helix_decode_context_per_seq": HELIX_DECODE_CTX,
            "helix_prompt_len": HELIX_PROMPT_LEN,
            "helix_integer_ms_points_below_5ms": "dropped (rounding)",
            "vidur_a100_is": "a100-80g",
        },
        "points": {"helix": len(helix), "vidur_gemm": len(vidur)},
        "fitted": {
            "gpus": {g: {k: round(v, 4) for k, v in f.__dict__.items()} for g, f in per_gpu.items()},
            "classes": {c: {k: round(v, 4) for k, v in f.__dict__.items()} for c, f in classes.items()},
            "tp_comm": comm_fits,
            "pipeline": pipeline, "attention": attention, "overhead": overhead, "reserve": reserve,
        },
        "in_sample": in_sample,
        "e2e_checks": checks,
        "held_out": {
            "method": "leave one GPU type out: its points predicted with the median factors of "
                      "the other GPUs of its class (non-power-capped GPUs when it has none) and "
                      "its interconnect's default all-reduce (not its own fit)",
            "per_gpu": held_out,
            "median_abs_err_all_points": round(statistics.median(abs(e) for e in all_held), 4),
            "median_of_gpu_medians": round(statistics.median(gpu_medians), 4),
            "worst_gpu_median": round(max(gpu_medians), 4),
            "goal": GOAL,
            "goal_met": statistics.median(abs(e) for e in all_held) <= GOAL,
        },
        "seconds": round(time.perf_counter() - t0, 2),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "calibrate.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (results / "calibrate.md").write_text(render_md(report))
    if write:
        (profiles / "calibration.yaml").write_text(render_yaml(report))
    return report


def render_md(r: dict) -> str:
    h = r["held_out"]
    lines = [
        "# Performance-model calibration (bench/calibrate.py)", "",
        f"Data: {r['sources']['helix']}; {r['sources']['vidur']}.",
        (f"Points: {r['points']['helix']} Helix per-layer step times, {r['points']['vidur_gemm']} "
        "Vidur per-layer non-attention times."), "",
        (f"**Held-out error** ({h['method']}): median |error| over all points "
        f"**{h['median_abs_err_all_points']:.1%}**, median of per-GPU medians "
        f"{h['median_of_gpu_medians']:.1%}, worst GPU {h['worst_gpu_median']:.1%} "
        f"(goal <= {h['goal']:.0%}: {'met' if h['goal_met'] else 'NOT met'})."), "",
        "| GPU held out | predicted from | points | median abs err | p90 | median signed | in-sample median |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, v in h["per_gpu"].items():
        lines.append(f"| {g} | {', '.join(v['predicted_from'])} | {v['n']} | {v['median_abs_err']:.1%} "
                     f"| {v['p90_abs_err']:.1%} | {v['median_signed_err']:+.1%} "
                     f"| {r['in_sample'][g]['median_abs_err']:.1%} |")
    lines += ["", "Per source (held out):", ""]
    for g, v in h["per_gpu"].items():
        parts = [f"{s}: {x['median_abs_err']:.1%} (n={x['n']})" for s, x in v["by_source"].items()]
        lines.append(f"- {g}: " + "; ".join(parts))
    lines += ["", "Fitted factors per GPU:", "", "| GPU | prefill MFU | decode MBU | overlap | layer floor us |",
              "|---|---|---|---|---|"]
    for g, f in r["fitted"]["gpus"].items():
        lines.append(f"| {g} | {f['prefill_mfu']:.3f} | {f['decode_mbu']:.3f} | {f['overlap']:.3f} "
                     f"| {f['layer_floor_us']:.1f} |")
    lines += ["", "TP all-reduce fits (alpha + 2 (n-1)/n x bytes / bus BW):", "",
              "| key | alpha us | bus BW GB/s | points | fit median abs err | source |", "|---|---|---|---|---|---|"]
    for k, v in r["fitted"]["tp_comm"].items():
        err = v.get("median_abs_err")
        lines.append(f"| {k} | {v['alpha_us']:.1f} | {v['bus_bw_gbs']:.1f} | {v.get('points', '')} "
                     f"| {'' if err is None else f'{err:.1%}'} | {v['source']} |")
    lines += ["",
              (f"Pipeline hand-off: {r['fitted']['pipeline']['alpha_ms']:.3f} ms + bytes / "
              f"{r['fitted']['pipeline']['bw_gbs']:.1f} GB/s. Step overhead "
              f"{r['fitted']['overhead']['step_overhead_ms']:.2f} ms (fitted on the single-stream end-to-end "
              f"checks below; Vidur's old Ray-based vLLM spent "
              f"{r['fitted']['overhead']['vidur_old_vllm_cpu_ms']:.1f} ms of CPU per step). Memory reserve "
              f"{r['fitted']['reserve']['reserve_gb']:.2f} GB/GPU."),
              (f"Attention (A100): KV-read efficiency {r['fitted']['attention']['kv_mbu']:.3f}, prefill "
              f"attention MFU {r['fitted']['attention']['attn_mfu']:.3f}."), "",
              "Assumptions: " + json.dumps(r["assumptions"]), "",
              ("End-to-end checks (whole model, one engine step incl. overhead; published figures "
              "quoted in GPU-AND-MODEL-FACTS.md §5):"), "",
              "| check | GPU calibrated | measured ms | predicted ms | error | fits overhead |",
              "|---|---|---|---|---|---|"]
    for c in r["e2e_checks"]:
        lines.append(f"| {c['check']} | {c['calibrated_gpu']} | {c['measured_ms']} | {c['predicted_ms']} "
                     f"| {c['error']:+.1%} | {c['used_to_fit_overhead']} |")
    lines.append("")
    return "\n".join(lines)


def _fmt(f: dict) -> str:
    return ", ".join(f"{k}: {round(v, 4)}" for k, v in f.items())


def render_yaml(r: dict) -> str:
    fit = r["fitted"]
    h = r["held_out"]
    gpus = "\n".join(f"  {g + ':':10} {{{_fmt(f)}}}" for g, f in fit["gpus"].items())
    classes = "\n".join(f"  {c + ':':14}{{{_fmt(f)}}}" for c, f in fit["classes"].items())
    comm = "\n".join(
        f"  {k + ':':10} {{alpha_us: {v['alpha_us']:.1f}, bus_bw_gbs: {v['bus_bw_gbs']:.2f}}}"
        f"  # {v['source']}" for k, v in fit["tp_comm"].items())
    return f"""# Efficiency factors of the performance model (coral_solver.perf / coral_solver.perf_model).
# GENERATED by bench/calibrate.py from measured public data — do not edit by hand; rerun it.
# Sources (public data at these commits, read at fit time from a local copy named with
# bench/calibrate.py --data, never copied into this repository; docs/catalog-sources.md):
#   {r['sources']['helix']}
#   {r['sources']['vidur']}
# Held-out error (leave one GPU type out, per-layer step times): median |error|
#   {h['median_abs_err_all_points']:.1%} over all points, median of per-GPU medians
#   {h['median_of_gpu_medians']:.1%}, worst GPU {h['worst_gpu_median']:.1%}. See bench/results/calibrate.md.
#
# Factors (dimensionless unless a unit is in the name):
#   prefill_mfu     achieved / peak dense FLOPS of the linear layers when compute-bound
#   decode_mbu      achieved / peak memory bandwidth when reading weights
#   kv_mbu          achieved / peak bandwidth reading the KV cache in decode attention
#   attn_mfu        achieved / peak FLOPS of prefill attention
#   overlap         0: compute and memory time overlap fully (roofline max); 1: they add
#   layer_floor_us  fixed time per layer per step (kernel launches)
# A GPU listed under `gpus:` was fitted on its own measurements (it is "calibrated"); any other GPU
# uses its class (profiles/gpus.yaml `class`: median of the fitted members) and is uncalibrated.
source: "bench/calibrate.py on Helix @ {HELIX_COMMIT[:7]} and Vidur @ {VIDUR_COMMIT[:7]}"

engine:
  gpu_memory_utilization: 0.9     # vLLM default
  reserve_gb: {fit['reserve']['reserve_gb']:.2f}                # {fit['reserve']['source']}
  max_num_seqs: 256               # vLLM default
  max_num_batched_tokens: 8192    # vLLM V1 chunked-prefill budget
  step_overhead_ms: {fit['overhead']['step_overhead_ms']:.2f}          # {fit['overhead']['source']}
  ttft_queue_steps: 1.0           # a new request waits one running step before its prefill

classes:
{classes}

gpus:
{gpus}

# One all-reduce: alpha_us + 2 (tp-1)/tp * bytes / bus_bw. Keys: an interconnect (the default for
# its GPUs) or a GPU type with its own fit. NCCL figures: vLLM's custom all-reduce on NVLink has a
# lower floor, so TP on NVLink is priced conservatively.
tp_comm:
{comm}

pipeline:                         # hand-off between stages on different nodes, per step
  alpha_ms: {fit['pipeline']['alpha_ms']:.3f}
  bw_gbs: {fit['pipeline']['bw_gbs']:.2f}                   # {fit['pipeline']['source']}

# Model families the measurements cover: dense 16-bit transformers (Llama-1/2/3, Qwen-72B, ...).
# MoE and quantised checkpoints are predicted from the same factors but flagged uncalibrated.
calibrated_quantizations: [bf16]
calibrated_moe: false
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="folder with profiles-helix/ and profiles-vidur/ (default: <repo>/../shared/data)")
    parser.add_argument("--profiles", type=Path, default=REPO / "profiles")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--no-write", action="store_true", help="do not rewrite calibration.yaml")
    args = parser.parse_args(argv)
    needed = [args.data / "profiles-helix", args.data / "profiles-vidur"]
    missing = [str(p) for p in needed if not p.is_dir()]
    if missing:
        print(f"calibrate: measured data not found ({', '.join(missing)}); nothing refitted, "
              "nothing changed. Pass --data DIR to point at it.")
        return 0
    report = run(args.data, args.profiles, args.results, not args.no_write)
    h = report["held_out"]
    print(f"held-out median |error| {h['median_abs_err_all_points']:.1%} over all points; "
          f"per GPU: " + ", ".join(f"{g} {v['median_abs_err']:.1%}" for g, v in h["per_gpu"].items()))
    print(f"wrote {args.results / 'calibrate.json'} and .md"
          + ("" if args.no_write else f"; {args.profiles / 'calibration.yaml'}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
