"""Each model's observed request lengths, which Stage 1's simulated capacity
(``policy.capacity: simulated``) draws prompt and output lengths from instead of exponential
lengths with the mix's means (issue 24: capacity for the model's request-length distribution).

:func:`read_lengths` reads the trace each model's ``lengths.trace`` names, with the readers
``coral-hpc simulate`` uses (:func:`coral_hpc.trace_files.load_rows`: an Azure LLM CSV or
a Mooncake JSONL), keeps a bounded fixed-seed sample of its (prompt, output) pairs
(:meth:`coral_solver.types.ObservedLengths.bounded`) on the deployment, and reports a trace
that cannot be read at the model's field. :func:`coral_hpc.model_archs.derive_models` calls it,
so every command that plans (validate, plan, simulate, profile, serve and its reloads) has them;
the planner puts them on each model's :class:`~coral_solver.types.ModelSpec`
(:func:`coral_hpc.plan.inputs.model_specs`). ``coral-hpc simulate`` puts the lengths it
replays there instead (:func:`coral_hpc.simulate.run.replayed_lengths`).

The gateway's meter keeps token totals per interval, not each request's lengths, so a measured
distribution is not read here (yet).
"""

from __future__ import annotations

import functools
import os

from coral_hpc.config import Deployment
from coral_hpc.trace_files import TraceError, load_rows
from coral_solver.types import ObservedLengths


def trace_lengths(path: str) -> ObservedLengths:
    """The observed lengths of the trace at ``path`` (every row's prompt and output tokens, at
    most :data:`coral_solver.types.OBSERVED_PAIRS` of them). Raises :class:`TraceError` naming
    the file and what is expected when it is absent, of another format or malformed."""
    try:
        stat = os.stat(path)
    except OSError:
        return _read_trace(path, -1, -1)  # load_rows raises TraceError for an absent file
    return _read_trace(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _read_trace(path: str, mtime_ns: int, size: int) -> ObservedLengths:
    """Keyed by modification time and size as well as the path: a daemon reloading its
    models.yaml reads an unchanged trace once, an edited one afresh (an error is not kept)."""
    rows = load_rows(path)
    return ObservedLengths.bounded(rows.prompt.tolist(), rows.output.tolist(), f"trace {path}")


def read_lengths(deployment: Deployment) -> list[str]:
    """Put every model's observed lengths (``lengths.trace``) on ``deployment``; one problem
    line (file, line, field) per model whose trace cannot be read."""
    problems = []
    found: dict[str, object] = {}
    for index, model in enumerate(deployment.models):
        if model.lengths is None:
            continue
        try:
            found[model.name] = trace_lengths(model.lengths.trace)
        except TraceError as exc:
            problems.append(deployment.problem(("models", index, "lengths", "trace"), str(exc)))
    # a new dict, not the old one changed: a copy of the deployment (model_copy) shares it
    deployment._lengths = found
    return problems
