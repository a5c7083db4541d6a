"""One replica of any role served in virtual time (the paper comparison's view of
:mod:`coral_hpc.engine.virtual_time`, where the loop lives).

Step times are the sim engine's own (:meth:`~coral_hpc.engine.pipeline.StepModel.batch_times`:
a step's prompt chunks attend per sequence, Σ chunk·(computed + chunk/2)); a request may bring
``external`` prompt tokens whose KV a prefill replica computed, so a prefill replica's outcome can
feed a decode one.
"""

from __future__ import annotations

from coral_hpc.engine.pipeline import Layout
from coral_hpc.engine.virtual_time import EngineLimits, Outcome, Request
from coral_hpc.engine.virtual_time import serve as _serve

__all__ = ["Outcome", "Request", "serve"]

#: The sim engine's (= vLLM's) scheduler limits, as every replica of the comparison starts.
LIMITS = EngineLimits()


def serve(layout: Layout, requests: list[Request]) -> list[Outcome]:
    """Serve ``requests`` (sorted by arrival) on one replica of ``layout``; one outcome each.

    A request the KV cache could never hold is answered at its arrival with no tokens."""
    return _serve(layout, requests, LIMITS)
