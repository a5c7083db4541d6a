"""One replica of any role served in virtual time (the paper comparison's view of
:func:`coral_hpc.simulate.serve.serve_replica`, which ``coral-hpc simulate`` serves with too;
the loop lives in :mod:`coral_replica_sim.replica`).

Step times are the sim engine's own (:meth:`~coral_replica_sim.replica.StepModel.batch_times`:
a step's prompt chunks attend per sequence, Σ chunk·(computed + chunk/2)); a request may bring
``external`` prompt tokens whose KV a prefill replica computed, so a prefill replica's outcome can
feed a decode one.
"""

from __future__ import annotations

from coral_hpc.simulate.serve import LIMITS
from coral_hpc.simulate.serve import serve_replica as serve
from coral_replica_sim.replica import Outcome, Request

__all__ = ["LIMITS", "Outcome", "Request", "serve"]
