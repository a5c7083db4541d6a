"""Request arrivals for load tests: a slice of the real Azure LLM inference trace (2023, Splitwise),
fitted to one model's request mix and to a target rate; a Poisson trace with the same mix when the
trace folder is absent.

The trace (``../shared/data/traces/azure-llm-2023``, CC-BY-4.0, Patel et al., ISCA 2024) has one row
per request: arrival ``TIMESTAMP``, ``ContextTokens`` (prompt) and ``GeneratedTokens`` (output).
It is read from its folder and never copied into the project.

How a slice becomes a replay (every choice stated, so a reader knows what the SLO check measured):

* **Slice**: ``n = round(rate × duration)`` consecutive rows from row ``start``. The trace's own
  inter-arrival gaps — its bursts and lulls — are kept, stretched by one factor so that the ``n``
  requests span ``duration`` seconds exactly (``n / duration`` = the target rate). The window is
  half-open: the factor maps the gap up to row ``start + n`` onto the end of the window.
* **Mix**: each request's prompt and output counts are multiplied by ``model mean / slice mean``
  (rounded, at least 1), so the slice's means equal the model's declared mix — the mix the plan
  was computed for — while the trace's spread and its prompt/output correlation are kept.
  Counts are then clipped to the engine's context (``max_model_len``), counted in the summary.
* **Poisson fallback** (no trace folder): exponential gaps at the target rate; token counts drawn
  from exponential distributions with the model's means (seeded, so a run is reproducible).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coral_hpc.simulate.traces import TraceRow, load_azure

__all__ = ["Arrival", "Mix", "TraceRow", "Workload", "load_trace", "poisson_workload",
           "scale_rate", "slice_workload", "trace_dir", "workload"]

#: The trace folder beside a source checkout (``<checkout>/../shared/data/traces/azure-llm-2023``),
#: or ``$CORAL_AZURE_TRACE_DIR`` when set (an installed package has no checkout beside it).
DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[3] / "shared/data/traces/azure-llm-2023"

TRACE_FILES = {
    "conv": "AzureLLMInferenceTrace_conv.csv",
    "code": "AzureLLMInferenceTrace_code.csv",
}


@dataclass(frozen=True)
class Mix:
    """Mean prompt and output tokens per request (ARCHITECTURE "Request mix")."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Arrival:
    """One request to send: ``at`` seconds after the replay starts."""

    at: float
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    """A replayable list of arrivals and where it came from."""

    arrivals: tuple[Arrival, ...]
    duration_s: float
    source: str  #: e.g. "azure-llm-2023/conv rows 1000..1119" or "poisson (no trace folder)"
    clipped: int = 0  #: requests whose counts were clipped to the engine's context

    @property
    def rate_rps(self) -> float:
        return len(self.arrivals) / self.duration_s if self.duration_s > 0 else 0.0

    def mean_mix(self) -> tuple[float, float]:
        """(mean prompt tokens, mean output tokens) of the arrivals."""
        n = max(len(self.arrivals), 1)
        return (sum(a.prompt_tokens for a in self.arrivals) / n,
                sum(a.max_tokens for a in self.arrivals) / n)


def trace_dir() -> Path:
    """The Azure 2023 trace folder (may not exist)."""
    env = os.environ.get("CORAL_AZURE_TRACE_DIR")
    return Path(env) if env else DEFAULT_TRACE_DIR


def load_trace(kind: str = "conv", folder: Path | None = None) -> list[TraceRow]:
    """All rows of the ``conv`` or ``code`` trace, in arrival order
    (:func:`coral_hpc.simulate.traces.load_azure`, the reader ``coral-hpc simulate`` uses).

    Raises FileNotFoundError when the folder or file is absent, ValueError naming the file and
    line of a malformed row.
    """
    if kind not in TRACE_FILES:
        raise ValueError(f"trace kind {kind!r}: expected one of {sorted(TRACE_FILES)}")
    return load_azure((folder or trace_dir()) / TRACE_FILES[kind])


def _fit(value: float, scale: float) -> int:
    return max(1, round(value * scale))


def _clip(prompt: int, output: int, max_model_len: int | None) -> tuple[int, int, bool]:
    """Keep prompt + output within the engine's context (the engine rejects longer requests)."""
    if max_model_len is None or prompt + output <= max_model_len:
        return prompt, output, False
    output = min(output, max(1, max_model_len // 4))
    prompt = min(prompt, max_model_len - output)
    return prompt, output, True


def slice_workload(rows: Sequence[TraceRow], mix: Mix, rate_rps: float, duration_s: float,
                   start: int = 0, max_model_len: int | None = None,
                   label: str = "trace") -> Workload:
    """``round(rate × duration)`` consecutive rows from ``start``, fitted to ``mix`` and stretched
    in time to ``rate_rps`` (see the module doc). Wraps around the end of the trace.
    """
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError(f"rate ({rate_rps}) and duration ({duration_s}) must be > 0")
    n = max(1, round(rate_rps * duration_s))
    if len(rows) < n + 1:
        raise ValueError(f"{label}: {len(rows)} rows, a slice of {n} needs {n + 1}")
    start %= len(rows) - n
    window = rows[start:start + n + 1]  # +1: the row that closes the half-open window
    span = window[-1].t - window[0].t
    if span <= 0:
        raise ValueError(f"{label} rows {start}..{start + n}: all at one instant")
    stretch = duration_s / span
    picked = window[:n]
    scale_in = mix.input_tokens / (sum(r.context_tokens for r in picked) / n)
    scale_out = mix.output_tokens / (sum(r.generated_tokens for r in picked) / n)
    arrivals, clipped = [], 0
    for row in picked:
        prompt, output, cut = _clip(_fit(row.context_tokens, scale_in),
                                    _fit(row.generated_tokens, scale_out), max_model_len)
        clipped += cut
        arrivals.append(Arrival((row.t - window[0].t) * stretch, prompt, output))
    return Workload(tuple(arrivals), duration_s,
                    f"{label} rows {start}..{start + n - 1} (time x{stretch:.3g})", clipped)


def poisson_workload(mix: Mix, rate_rps: float, duration_s: float, seed: int = 0,
                     max_model_len: int | None = None) -> Workload:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``; token counts exponential with the
    mix's means (the trace-free stand-in, same mix and rate)."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError(f"rate ({rate_rps}) and duration ({duration_s}) must be > 0")
    rng = random.Random(seed)
    arrivals, clipped, t = [], 0, rng.expovariate(rate_rps)
    while t < duration_s:
        prompt, output, cut = _clip(max(1, round(rng.expovariate(1 / mix.input_tokens))),
                                    max(1, round(rng.expovariate(1 / mix.output_tokens))),
                                    max_model_len)
        clipped += cut
        arrivals.append(Arrival(t, prompt, output))
        t += rng.expovariate(rate_rps)
    return Workload(tuple(arrivals), duration_s, f"poisson seed {seed} (no trace folder)", clipped)


def workload(mix: Mix, rate_rps: float, duration_s: float, start: int = 0, kind: str = "conv",
             max_model_len: int | None = None, folder: Path | None = None) -> Workload:
    """The Azure trace slice when the trace folder exists, else the Poisson fallback."""
    base = folder or trace_dir()
    if not (base / TRACE_FILES[kind]).is_file():
        return poisson_workload(mix, rate_rps, duration_s, seed=start,
                                max_model_len=max_model_len)
    return slice_workload(load_trace(kind, base), mix, rate_rps, duration_s, start,
                          max_model_len, label=f"azure-llm-2023/{kind}")


def scale_rate(base: Workload, factor: float) -> Workload:
    """The same requests arriving ``factor`` times faster (``factor`` × the rate, same mix)."""
    if not factor > 0 or math.isinf(factor):
        raise ValueError(f"load factor must be a finite number > 0, got {factor}")
    return Workload(tuple(Arrival(a.at / factor, a.prompt_tokens, a.max_tokens)
                          for a in base.arrivals),
                    base.duration_s / factor, f"{base.source} at x{factor:g} rate", base.clipped)
