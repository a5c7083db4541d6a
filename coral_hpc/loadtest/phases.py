"""Open-loop load phases against a real engine, judged as ``coral-hpc profile`` judges them
(:mod:`coral_hpc.profile.openloop`: the same generator, phase length and goal), so a capacity it
measured is checked the way it was measured: which measured figure is a model's capacity, how a
demand is written into a deployment, one phase's figures, and the engine's own view of its
latencies (vLLM's histograms). The real-engine SLO check (``bench/slo_vllm.py``) and the
real-engine serve test read them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from coral_hpc.config import Deployment
from coral_hpc.config.models import ModelConfig
from coral_hpc.engine import vllm_metrics
from coral_hpc.profile import openloop

__all__ = ["ENGINE_HISTOGRAMS", "GOAL", "engine_latency_means", "engine_latency_totals",
           "measured_capacity", "phase_row", "timings", "with_demand"]

#: share of a phase's requests that must meet TTFT and TPOT: ``coral-hpc profile``'s own goal
GOAL = openloop.GOAL


def timings(phase: openloop.Phase) -> list[tuple[float, float] | None]:
    """A phase's requests as (TTFT, TPOT), None where one failed (what :func:`phase_row`
    reads)."""
    return [(t.ttft_s, t.tpot_s) if t else None for t in phase.timings]


def measured_capacity(profile_files: Sequence[Path], deployment: Deployment) -> dict[str, float]:
    """Per model: the requests/s its measured layout served with every request within the
    model's TTFT and TPOT at the model's mix (the figure the planner plans with).

    Raises ValueError naming the profile file that has no point at its model's mix and SLO."""
    models = {m.name: m for m in deployment.models}
    capacity: dict[str, float] = {}
    for path in profile_files:
        profile = yaml.safe_load(path.read_text())
        model = models[profile["model"]]
        want = (model.mix.input_tokens, model.mix.output_tokens, model.slo.ttft_s,
                model.slo.tpot_s)
        points = [t for t in profile.get("throughput") or ()
                  if (t["input_tokens"], t["output_tokens"], t["ttft_s"], t["tpot_s"]) == want]
        if not points:
            raise ValueError(f"{path}: no throughput point for {model.name}'s mix and SLO "
                             f"(input, output, TTFT, TPOT) = {want}")
        capacity[model.name] = float(points[0]["requests_per_s"])
    return capacity


def with_demand(config_text: str, demand: dict[str, float]) -> str:
    """The config with each named model's declared demand set to ``demand[name]`` requests/s."""
    data = yaml.safe_load(config_text)
    for model in data["models"]:
        if model["name"] in demand:
            model["demand"] = {"requests_per_s": round(demand[model["name"]], 3)}
    return yaml.safe_dump(data, sort_keys=False)


def phase_row(model: ModelConfig, rate: float,
              runs: Sequence[tuple[float, float] | None]) -> dict[str, Any]:
    """One model's figures for one load phase: requests, failures, the share within both SLOs
    (a failed request is not within), TTFT and TPOT percentiles."""
    done = [g for g in runs if g]
    ttft_s, tpot_s = model.slo.ttft_s, model.slo.tpot_s
    if ttft_s is None or tpot_s is None:
        raise ValueError(f"model {model.name}: a load phase is judged by TTFT and TPOT, and its "
                         "slo has no ttft_s or tpot_s (an embedding model's latency_ms)")
    ok = [g for g in done if g[0] <= ttft_s and g[1] <= tpot_s]
    return {"rate": rate, "requests": len(runs), "failed": len(runs) - len(done),
            "within_slo": len(ok) / len(runs) if runs else 0.0,
            "ttft_mean_ms": round(1000 * sum(g[0] for g in done) / len(done), 1) if done else None,
            "ttft_ms": [round(v * 1000) for v in _percentiles([g[0] for g in done])],
            "tpot_ms": [round(v * 1000) for v in _percentiles([g[1] for g in done])]}


def _percentiles(values: list[float]) -> list[float]:
    """p50, p90 and p99 (nearest rank), none for no values."""
    if not values:
        return []
    values = sorted(values)
    return [values[min(len(values) - 1, int(q * len(values)))] for q in (0.5, 0.9, 0.99)]


# ------------------------------------------------------- where a phase's time went (diagnostics)

#: vLLM's own latency histograms: TTFT as the engine saw it, and its queue wait
ENGINE_HISTOGRAMS = {"ttft": vllm_metrics.TTFT_SECONDS, "queue": vllm_metrics.QUEUE_TIME_SECONDS}


def engine_latency_totals(endpoint: str) -> dict[str, tuple[float, float]]:
    """Per ENGINE_HISTOGRAMS entry: (sum of seconds, count) in the engine's ``/metrics`` (which
    vLLM serves without the API key), summed over its label sets."""
    totals = vllm_metrics.histogram_totals(
        vllm_metrics.fetch_metrics_text(endpoint, timeout=10), tuple(ENGINE_HISTOGRAMS.values()))
    return {key: totals[name] for key, name in ENGINE_HISTOGRAMS.items()}


def engine_latency_means(before: dict[str, tuple[float, float]],
                         after: dict[str, tuple[float, float]]) -> dict[str, float | None]:
    """Mean milliseconds per ENGINE_HISTOGRAMS entry over the requests between two
    :func:`engine_latency_totals` (None where none finished)."""
    means: dict[str, float | None] = {}
    for key in ENGINE_HISTOGRAMS:
        seconds, count = (a - b for a, b in zip(after[key], before[key]))
        means[key] = round(1000 * seconds / count, 1) if count > 0 else None
    return means
