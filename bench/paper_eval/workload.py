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

from pathlib import Path

from coral_hpc.loadtest.workload import TRACE_FILES, trace_dir
from coral_hpc.simulate.traces import BIN_S, ModelWorkload, load_rows, scaled_workload

__all__ = ["BIN_S", "RUN_S", "TRACE_KIND", "ModelWorkload", "model_workload"]

#: Length of one run, seconds (the paper's 30 minutes).
RUN_S = 1800.0

TRACE_KIND = {"azure-code": "code", "azure-conv": "conv", "burstgpt->conv": "conv"}


def model_workload(
    model: str,
    trace: str,
    offset_s: float,
    rate_rps: float,
    seed: int,
    folder: Path | None = None,
    run_s: float = RUN_S,
) -> ModelWorkload:
    """``model``'s requests over one run at a mean of ``rate_rps``
    (:func:`coral_hpc.simulate.traces.scaled_workload`, the one ``coral-hpc simulate`` draws)."""
    kind = TRACE_KIND[trace]
    rows = load_rows((folder or trace_dir()) / TRACE_FILES[kind])
    return scaled_workload(model, rows, offset_s, rate_rps, seed, run_s,
                           source=f"azure-llm-2023/{kind}")
