"""Kept only for ``tests/vllm/test_serve_vllm.py`` (another engineer's file, not changed here):
the serve CLI harness now lives in :mod:`tests.support.serve_harness`, with the rest of the one
serve harness. Import from there; delete this module once that test does."""

from tests.support.serve_harness import (
    CLI,
    cli,
    live_jobs,
    start_serve,
    status,
    status_if_any,
    wait_every_model_ready,
)

__all__ = ["CLI", "cli", "live_jobs", "start_serve", "status", "status_if_any",
           "wait_every_model_ready"]
