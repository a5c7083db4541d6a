"""Request traces read for replay: the Azure LLM inference trace (2023, CSV) and the Mooncake
conversation trace (FAST'25, JSONL), and a model's requests drawn from one at a given rate.

The files are read where they lie (e.g. ``../shared/data/traces``) and never copied.

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
  from the window's rows (the trace's length distribution and prompt/output pairing are kept).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Width of the bins of the rate curve, seconds.
BIN_S = 10.0


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file (and line) and what is
    expected."""


@dataclass(frozen=True)
class TraceRow:
    """One request of the Azure trace: arrival (seconds since midnight) and its token counts."""

    t: float
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class TraceRows:
    """One trace: arrival (seconds from its first row), prompt and output tokens per row."""

    name: str
    t: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    @property
    def span_s(self) -> float:
        return float(self.t[-1])

    def mean_mix(self) -> tuple[int, int]:
        """(mean prompt tokens, mean output tokens) over the whole trace."""
        return (max(1, round(float(self.prompt.mean()))), max(1, round(float(self.output.mean()))))


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

    def window(self, start: float, end: float) -> slice:
        """Index range of the requests arriving in [start, end)."""
        lo, hi = np.searchsorted(self.at, [start, end], side="left")
        return slice(int(lo), int(hi))

    def mean_mix(self) -> tuple[int, int]:
        """(mean prompt tokens, mean output tokens) of the trace window the requests are drawn
        from: fixed by the trace and offset, so every rate and seed plans for the same mix."""
        return self.mix


def _seconds_of_day(stamp: str) -> float:
    """``2023-11-16 18:15:46.6805900`` → seconds since midnight (7 fractional digits kept)."""
    _, clock = stamp.strip().split(" ")
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def load_azure(path: Path) -> list[TraceRow]:
    """All rows of an Azure LLM 2023 CSV, in arrival order.

    Raises FileNotFoundError when the file is absent, :class:`TraceError` naming the file and
    line of a malformed row."""
    rows: list[TraceRow] = []
    with Path(path).open(newline="") as handle:
        reader = csv.DictReader(handle)
        for line, record in enumerate(reader, start=2):
            try:
                rows.append(TraceRow(_seconds_of_day(record["TIMESTAMP"]),
                                     int(record["ContextTokens"]),
                                     int(record["GeneratedTokens"])))
            except (KeyError, ValueError, AttributeError) as exc:
                raise TraceError(f"{path}:{line}: malformed row {record!r}: {exc}; expected "
                                 "TIMESTAMP, ContextTokens, GeneratedTokens (Azure LLM "
                                 "2023)") from None
    rows.sort(key=lambda r: r.t)
    return rows


def _load_mooncake(path: Path) -> tuple[list[float], list[int], list[int]]:
    times, prompts, outputs = [], [], []
    with Path(path).open() as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                times.append(float(item["timestamp"]) / 1000.0)
                prompts.append(int(item["input_length"]))
                outputs.append(int(item["output_length"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{line_no}: malformed row: {exc}; expected JSON with "
                                 "timestamp (ms), input_length, output_length "
                                 "(Mooncake)") from None
    return times, prompts, outputs


def load_rows(path: str | Path, name: str | None = None) -> TraceRows:
    """The rows of the trace file at ``path``: an Azure LLM CSV (``.csv``) or a Mooncake JSONL
    (``.jsonl``), sorted by arrival, times from the first row, token counts at least 1.

    Raises :class:`TraceError` naming the file when it is absent, unreadable, of another
    format, malformed or empty."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file; expected an Azure LLM .csv or a "
                         "Mooncake .jsonl")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            rows = load_azure(path)
            times = [r.t for r in rows]
            prompts = [r.context_tokens for r in rows]
            outputs = [r.generated_tokens for r in rows]
        elif suffix in (".jsonl", ".json"):
            times, prompts, outputs = _load_mooncake(path)
        else:
            raise TraceError(f"{path}: unknown trace format {suffix or '(no suffix)'!r}; "
                             "expected an Azure LLM .csv or a Mooncake .jsonl")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text trace: {exc}") from None
    if len(times) < 2:
        raise TraceError(f"{path}: {len(times)} request(s); a trace needs at least 2")
    order = np.argsort(times, kind="stable")
    t, prompt, output = (np.array(x)[order] for x in (times, prompts, outputs))
    if t[-1] <= t[0]:
        raise TraceError(f"{path}: every request arrives at one instant")
    return TraceRows(name or path.name, t - t[0], np.maximum(prompt, 1), np.maximum(output, 1))


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
    return ModelWorkload(model, at, np.maximum(prompts[pick], 1), np.maximum(outputs[pick], 1),
                         f"{label} from {offset_s:.0f} s, rate curve x{rate / own_rps:.2f}", mix)
