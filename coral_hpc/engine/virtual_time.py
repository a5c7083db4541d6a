"""One sim-engine replica served in *virtual* time: :mod:`coral_solver.replica_sim`, the very
same scheduler, pipeline clock and step model as :class:`coral_hpc.engine.runner.SimEngine`
driven by a discrete-event loop instead of a clock. It lives in the solver because Stage 1
rates templates with it (:mod:`coral_solver.simcap`).

The paper comparison (``bench/paper_eval``) and ``coral-hpc simulate`` serve their trace samples
with it, and the virtual replay (``coral_hpc/loadtest/virtual.py``) compares it with the
real processes.
"""

from __future__ import annotations

from coral_solver.replica_sim import EngineLimits, Outcome, Request, serve

__all__ = ["EngineLimits", "Outcome", "Request", "serve"]
