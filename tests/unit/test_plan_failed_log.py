"""A planning failure the site must fix (a missing solver) is logged as one clear line, not a
traceback: the message already names the solver and how to install it (issue 25)."""

from __future__ import annotations

import logging

from coral_hpc.plan.planner import SolverUnavailable
from tests.unit.test_reconcile_loop import Loop, ScriptedPlanner, slot

MESSAGE = ("policy.solver pyomo:gurobi: Pyomo knows it, but it is not installed or not licensed "
           "on this host; to use it: pip install gurobipy; or set policy.solver: highs")


def _failures(tmp_path, caplog, error: Exception) -> list[logging.LogRecord]:
    planner = ScriptedPlanner(slot())
    planner.error = error
    loop = Loop(tmp_path, planner)
    try:
        with caplog.at_level(logging.ERROR, logger="coral_hpc.daemon"):
            loop.cycle()
    finally:
        loop.close()
    return [r for r in caplog.records if r.getMessage().startswith("planning failed")]


def test_a_missing_solver_is_one_line_without_a_traceback(tmp_path, caplog):
    (record,) = _failures(tmp_path, caplog, SolverUnavailable(MESSAGE))
    assert not record.exc_info  # no traceback
    assert record.getMessage() == f"planning failed: {MESSAGE}"
    assert "\n" not in record.getMessage()


def test_an_unexpected_planning_error_keeps_its_traceback(tmp_path, caplog):
    (record,) = _failures(tmp_path, caplog, RuntimeError("bug"))
    assert record.exc_info
