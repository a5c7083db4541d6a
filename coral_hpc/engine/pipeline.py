"""Step latencies and KV capacity of a replica's layout, and the pipeline clock:
:mod:`coral_solver.replica_sim`, where the planner's capacity model uses them too (one replica
simulator, not a copy)."""

from __future__ import annotations

from coral_solver.replica_sim import Layout, PipelineClock, StepModel, default_layer_split

__all__ = ["Layout", "PipelineClock", "StepModel", "default_layer_split"]
