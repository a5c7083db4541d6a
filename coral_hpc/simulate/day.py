"""A day of requests per model, from an hour-long public trace stretched to 24 hours (the
virtual-time day ``bench/scale_day.py`` replays through the daemon's planner).

The public traces here are about an hour long (Azure LLM 2023 code 57 min and conversation
58 min; Mooncake conversation 59 min). How a model's day is made from its trace (every choice
is printed with the results):

* **Time scaling**: the trace's span is stretched to the day (x ~25: one trace minute becomes
  ~25 day minutes), so the day's rate curve is the trace's hour-scale shape. Each model starts at
  its own point of the trace (``SiteModel.phase``, wrapping round the end), so the models' peaks
  fall at different hours and the site's total is smoother than any one model's. The traces hold
  no daily cycle, so neither does the day: nothing here is a diurnal model.
* **Rate curve**: the stretched trace's arrivals counted per hour of the day (``BIN_S``: 2.4
  minutes of trace, 375-800 rows), interpolated linearly between the hours' midpoints and scaled
  so the day's mean is the model's rate (``SiteModel.mean_rps``); per minute the count is
  Poisson with that intensity, arrivals uniform within the minute. The trace's seconds-scale
  bursts are not kept: stretched 25x they would become minutes-long on/off periods (54 % of the
  Azure code trace's 12-second bins are empty), which no day of real traffic has; so the SLO
  samples see Poisson arrivals, gentler than the traces' own.
* **Lengths**: each request's prompt and output tokens are those of a row drawn uniformly from
  the trace rows of its bin (the trace's length distribution, its prompt/output pairing and its
  drift over the hour are kept), clipped to the architecture's context length.
* **Seeds**: minute ``m`` of model ``k`` draws from ``numpy.random.default_rng([seed, k, m])``, so
  the per-minute gateway counters and the requests a sampled window serves are the same
  requests, and a window can be regenerated without holding the day (~40 M requests) in memory.

The trace files are read from ../shared/data/traces and never copied into the project.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coral_hpc.simulate.traces import TraceRows
from coral_hpc.simulate.traces import load_rows as load_rows_of

__all__ = ["TraceRows", "ModelDay", "load_rows"]

DAY_S = 86_400.0
MINUTE_S = 60.0
MINUTES = int(DAY_S // MINUTE_S)
#: Width of the bins of the rate curve, seconds of the day (~2.4 minutes of trace).
BIN_S = 3600.0

#: Where each trace lives under the traces folder, and what it is called in reports.
TRACE_SOURCES = {
    "azure-conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake-fast25/conversation_trace.jsonl",
}


def load_rows(trace: str, traces_dir: Path) -> TraceRows:
    """The rows of ``trace`` (a key of :data:`TRACE_SOURCES`) under ``traces_dir``
    (:func:`coral_hpc.simulate.traces.load_rows`, the reader ``coral-hpc simulate`` uses).

    Raises ValueError (:class:`~coral_hpc.simulate.traces.TraceError`) naming the file when it
    is absent, or its line when a row is malformed."""
    if trace not in TRACE_SOURCES:
        raise ValueError(f"trace {trace!r}: expected one of {sorted(TRACE_SOURCES)}")
    return load_rows_of(traces_dir / TRACE_SOURCES[trace], name=trace)


class ModelDay:
    """One model's day (see the module doc): per-minute counts and token sums, and the requests
    of any window."""

    def __init__(self, rows: TraceRows, phase: float, mean_rps: float, index: int, seed: int,
                 max_context: int):
        if not 0.0 <= phase < 1.0 or mean_rps <= 0:
            raise ValueError(f"phase must be in [0, 1) and mean_rps > 0, got {phase}, {mean_rps}")
        self.rows = rows
        self.index, self.seed, self.max_context = index, seed, max_context
        bins = int(DAY_S // BIN_S)
        span = rows.span_s
        day_t = ((rows.t - phase * span) % span) * (DAY_S / span)
        row_bin = np.minimum((day_t // BIN_S).astype(int), bins - 1)
        counts = np.bincount(row_bin, minlength=bins).astype(float)
        #: requests/s per minute, linear between the bins' midpoints (wrapping round the day);
        #: its mean over the day is ``mean_rps``
        mid = (np.arange(-1, bins + 1) + 0.5) * BIN_S
        curve = np.interp((np.arange(MINUTES) + 0.5) * MINUTE_S, mid,
                          np.concatenate([counts[-1:], counts, counts[:1]]))
        self.intensity = curve / curve.mean() * mean_rps
        order = np.argsort(row_bin, kind="stable")
        self._prompt, self._output = rows.prompt[order], rows.output[order]
        edges = np.searchsorted(row_bin[order], np.arange(bins + 1))
        self._lo, self._hi = edges[:-1].copy(), edges[1:].copy()
        # an hour with no trace rows (the code trace pauses) still gets the interpolated rate
        # from its neighbours: its lengths come from the whole trace
        empty = self._lo == self._hi
        self._lo[empty], self._hi[empty] = 0, len(order)
        minute_bin = (np.arange(MINUTES) * MINUTE_S // BIN_S).astype(int)
        self._minute_bin = minute_bin
        rng = np.random.default_rng([seed, index])
        #: requests arriving in each minute of the day
        self.counts = rng.poisson(self.intensity * MINUTE_S)
        self.prompt_sums = np.zeros(MINUTES, dtype=np.int64)
        self.output_sums = np.zeros(MINUTES, dtype=np.int64)
        for minute in np.flatnonzero(self.counts):
            _, prompt, output = self._minute(int(minute))
            self.prompt_sums[minute] = int(prompt.sum())
            self.output_sums[minute] = int(output.sum())

    def _minute(self, minute: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(arrival s of the day, prompt, output) of minute ``minute``'s requests."""
        n = int(self.counts[minute])
        rng = np.random.default_rng([self.seed, self.index, minute])
        b = self._minute_bin[minute]
        pick = rng.integers(self._lo[b], self._hi[b], n) if n else np.zeros(0, dtype=int)
        at = minute * MINUTE_S + np.sort(rng.uniform(0.0, MINUTE_S, n))
        prompt = np.minimum(self._prompt[pick], self.max_context - 1)
        output = np.minimum(self._output[pick], self.max_context - prompt)
        return at, prompt, output

    def requests(self, start: float, end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(arrival s of the day, prompt, output) of the requests arriving in [start, end)."""
        first, last = int(start // MINUTE_S), int(np.ceil(end / MINUTE_S))
        parts = [self._minute(m) for m in range(max(first, 0), min(last, MINUTES))]
        if not parts:
            return np.zeros(0), np.zeros(0, dtype=int), np.zeros(0, dtype=int)
        at, prompt, output = (np.concatenate(x) for x in zip(*parts))
        keep = (at >= start) & (at < end)
        return at[keep], prompt[keep], output[keep]

    def hourly(self, values: np.ndarray) -> np.ndarray:
        """Per-minute ``values`` summed per hour of the day."""
        return values.reshape(24, -1).sum(axis=1)
