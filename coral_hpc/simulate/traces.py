"""Request traces read for replay: the Azure LLM inference trace (2023, CSV) and the Mooncake
conversation trace (FAST'25, JSONL), and a model's requests drawn from one at a given rate.

The files are read where they lie (e.g. ``../shared/data/traces``) and never copied, by
:mod:`coral_hpc.trace_files` (its readers are re-exported here).

* **Azure LLM 2023** (``AzureLLMInferenceTrace_{code,conv}.csv``, CC-BY-4.0, Patel et al.,
  ISCA 2024): one row per request, ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``),
  ``ContextTokens`` (prompt) and ``GeneratedTokens`` (output).
* **Mooncake** (``conversation_trace.jsonl``, Apache-2.0): one JSON object per line with
  ``timestamp`` (milliseconds), ``input_length`` and ``output_length``.

How a model's requests are drawn from a trace (:func:`scaled_workload`; every choice stated):

* **Rate curve**: the trace's arrivals in the window of ``run_s`` seconds from ``offset_s``
  (wrapping round the end; a window longer than the trace repeats it), counted per ``BIN_S``
  seconds and scaled so the window's mean is the model's rate; arrivals are a Poisson process
  with that piecewise-constant intensity (the trace's minute-scale bursts and lulls are kept;
  within a bin arrivals are Poisson). With no rate given, the trace's own rate is kept.
* **Lengths**: each arrival's prompt and output token counts are those of a row drawn uniformly
  from the window's rows (the trace's length distribution and prompt/output pairing are kept);
  those rows (a bounded sample of them) are also the lengths the planner's simulated capacity is
  judged on (:attr:`ModelWorkload.lengths`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the readers live below every command that reads a trace; simulate's callers keep these names
from coral_hpc.trace_files import TraceError as TraceError
from coral_hpc.trace_files import TraceRow as TraceRow
from coral_hpc.trace_files import TraceRows as TraceRows
from coral_hpc.trace_files import load_azure as load_azure
from coral_hpc.trace_files import load_rows as load_rows
from coral_solver.types import ObservedLengths

#: Width of the bins of the rate curve, seconds.
BIN_S = 10.0


@dataclass(frozen=True)
class ModelWorkload:
    """Arrival times (s from the run's start) and token counts of one model's requests."""

    model: str
    at: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    source: str
    mix: tuple[int, int]  #: mean prompt / output tokens of the trace window (the planner's mix)
    #: seconds each request already waited before ``at`` (held while its model woke from zero,
    #: ``coral_hpc.simulate.zero``): counted in its time to first token; None: none waited
    waited: np.ndarray | None = None
    #: the (prompt, output) pairs of the trace window the requests are drawn from, at most
    #: OBSERVED_PAIRS of them: what Stage 1's simulated capacity is judged on
    #: (:func:`coral_hpc.simulate.run.replayed_lengths`); fixed by the trace and offset as
    #: ``mix`` is, so every rate and seed keys the same Stage-1 library. None: not known
    lengths: ObservedLengths | None = None

    def window(self, start: float, end: float) -> slice:
        """Index range of the requests arriving in [start, end)."""
        lo, hi = np.searchsorted(self.at, [start, end], side="left")
        return slice(int(lo), int(hi))

    def mean_mix(self) -> tuple[int, int]:
        """(mean prompt tokens, mean output tokens) of the trace window the requests are drawn
        from: fixed by the trace and offset, so every rate and seed plans for the same mix."""
        return self.mix


def _window_rows(rows: TraceRows, offset_s: float,
                 length_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times from the window's start, prompts, outputs) of the trace rows in the window; a
    window longer than the trace repeats it."""
    span = rows.span_s
    copies = max(1, int(np.ceil(length_s / span)))
    t = np.concatenate([rows.t + k * span for k in range(copies)]) if copies > 1 else rows.t
    prompt = np.tile(rows.prompt, copies)
    output = np.tile(rows.output, copies)
    shifted = (t - offset_s) % (span * copies)  # wrap round the end of the trace
    keep = shifted < length_s
    return shifted[keep], prompt[keep], output[keep]


def scaled_workload(model: str, rows: TraceRows, offset_s: float, rate_rps: float | None,
                    seed: int, run_s: float, source: str | None = None) -> ModelWorkload:
    """``model``'s requests over ``run_s`` seconds at a mean of ``rate_rps`` (None: the
    trace's own rate), drawn from ``rows`` (see the module doc)."""
    if run_s <= 0:
        raise ValueError(f"run_s must be > 0, got {run_s}")
    times, prompts, outputs = _window_rows(rows, offset_s, run_s)
    own_rps = len(times) / run_s
    rate = own_rps if rate_rps is None else rate_rps
    bins = int(np.ceil(run_s / BIN_S))
    counts, _ = np.histogram(times, bins=bins, range=(0.0, bins * BIN_S))
    intensity = counts / counts.mean() * rate  # req/s per bin, mean = rate
    rng = np.random.default_rng(seed)
    per_bin = rng.poisson(intensity * BIN_S)
    at = np.concatenate(
        [np.sort(rng.uniform(i * BIN_S, (i + 1) * BIN_S, n)) for i, n in enumerate(per_bin)]
    )
    at = at[at < run_s]
    pick = rng.integers(0, len(prompts), len(at))
    mix = (max(1, round(float(prompts.mean()))), max(1, round(float(outputs.mean()))))
    label = source or rows.name
    lengths = ObservedLengths.bounded(prompts.tolist(), outputs.tolist(),
                                      f"{label} from {offset_s:.0f} s")
    return ModelWorkload(model, at, np.maximum(prompts[pick], 1), np.maximum(outputs[pick], 1),
                         f"{label} from {offset_s:.0f} s, rate curve x{rate / own_rps:.2f}", mix,
                         lengths=lengths)
