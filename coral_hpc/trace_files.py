"""Request trace files read as they lie (never copied): the Azure LLM inference trace (2023,
CSV) and the Mooncake conversation trace (FAST'25, JSONL), one row per request with its arrival
and its prompt and output tokens.

* **Azure LLM 2023** (``AzureLLMInferenceTrace_{code,conv}.csv``, CC-BY-4.0, Patel et al.,
  ISCA 2024): one row per request, ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``),
  ``ContextTokens`` (prompt) and ``GeneratedTokens`` (output).
* **Mooncake** (``conversation_trace.jsonl``, Apache-2.0): one JSON object per line with
  ``timestamp`` (milliseconds), ``input_length`` and ``output_length``.

Below every command that reads a trace: ``coral-hpc simulate`` (:mod:`coral_hpc.simulate.traces`
draws a model's requests from it), the load test (:mod:`coral_hpc.loadtest.workload`) and a
model's observed lengths (``models[].lengths``, :mod:`coral_hpc.model_lengths`, which the daemon
reads too).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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
