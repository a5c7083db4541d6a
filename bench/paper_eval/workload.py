"""A model's 30 minutes of requests, from its trace: the trace's rate curve and its request lengths.

The Azure traces carry 2.6 (code) and 5.6 (conversation) requests/s; the paper replays 10-37.5
requests/s per model. So a model's workload keeps what the trace says at that scale and draws the
rest, seeded:

* **Rate curve**: the trace's arrivals in its 30-minute window from the model's offset (wrapping
  round the end), counted per ``BIN_S`` seconds and scaled so the run's mean is the model's rate;
  arrivals are a Poisson process with that piecewise-constant intensity (the trace's minute-scale
  bursts and lulls are kept; within a bin arrivals are Poisson).
* **Lengths**: each arrival's prompt and output token counts are those of a row drawn uniformly
  from the window's rows (the trace's length distribution and prompt/output pairing are kept).

The trace files are read from ../shared/data/traces and never copied into the project.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.support.trace_slice import TraceRow, load_trace

#: Width of the bins of the rate curve, seconds.
BIN_S = 10.0
#: Length of one run, seconds (the paper's 30 minutes).
RUN_S = 1800.0

TRACE_KIND = {"azure-code": "code", "azure-conv": "conv", "burstgpt->conv": "conv"}


@dataclass(frozen=True)
class ModelWorkload:
    """Arrival times (s from the run's start) and token counts of one model's requests."""

    model: str
    at: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    source: str
    mix: tuple[int, int]  #: mean prompt / output tokens of the trace window (the planner's mix)

    def window(self, start: float, end: float) -> slice:
        """Index range of the requests arriving in [start, end)."""
        lo, hi = np.searchsorted(self.at, [start, end], side="left")
        return slice(int(lo), int(hi))

    def mean_mix(self) -> tuple[int, int]:
        """(mean prompt tokens, mean output tokens) of the trace window the requests are drawn
        from: fixed by the trace and offset, so every rate and seed plans for the same mix."""
        return self.mix


def _window_rows(
    rows: list[TraceRow], offset_s: float, length_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times from the window's start, prompts, outputs) of the trace rows in the window."""
    t = np.array([r.t for r in rows])
    t = t - t[0]
    span = t[-1]
    shifted = (t - offset_s) % span  # wrap round the end of the trace
    keep = shifted < length_s
    return (
        shifted[keep],
        np.array([r.context_tokens for r in rows])[keep],
        np.array([r.generated_tokens for r in rows])[keep],
    )


def model_workload(
    model: str,
    trace: str,
    offset_s: float,
    rate_rps: float,
    seed: int,
    folder: Path | None = None,
    run_s: float = RUN_S,
) -> ModelWorkload:
    """``model``'s requests over one run at a mean of ``rate_rps`` (see the module doc)."""
    kind = TRACE_KIND[trace]
    rows = load_trace(kind, folder)
    times, prompts, outputs = _window_rows(rows, offset_s, run_s)
    bins = int(np.ceil(run_s / BIN_S))
    counts, _ = np.histogram(times, bins=bins, range=(0.0, bins * BIN_S))
    intensity = counts / counts.mean() * rate_rps  # req/s per bin, mean = rate_rps
    rng = np.random.default_rng(seed)
    per_bin = rng.poisson(intensity * BIN_S)
    at = np.concatenate(
        [np.sort(rng.uniform(i * BIN_S, (i + 1) * BIN_S, n)) for i, n in enumerate(per_bin)]
    )
    at = at[at < run_s]
    pick = rng.integers(0, len(prompts), len(at))
    mix = (max(1, round(float(prompts.mean()))), max(1, round(float(outputs.mean()))))
    return ModelWorkload(
        model,
        at,
        np.maximum(prompts[pick], 1),
        np.maximum(outputs[pick], 1),
        f"azure-llm-2023/{kind} from {offset_s:.0f} s, rate curve x"
        f"{rate_rps / (len(times) / run_s):.2f}",
        mix,
    )
