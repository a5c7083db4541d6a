"""The sim engine's continuous-batching scheduler: :mod:`coral_solver.batching`, where the
planner's capacity model runs it too (one scheduler, not a copy)."""

from __future__ import annotations

from coral_solver.batching import (
    DEFAULT_BLOCK_SIZE,
    Batch,
    Scheduler,
    Sequence,
    TokenEvent,
    blocks_for,
)

__all__ = ["DEFAULT_BLOCK_SIZE", "Batch", "Scheduler", "Sequence", "TokenEvent", "blocks_for"]
