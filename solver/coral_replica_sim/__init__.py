"""The replica simulator: one serving replica in virtual time, the one copy the planner and the
sim engine share.

It sits between the performance model and its two users. Below it, it reads only the
performance model (:mod:`coral_solver.catalog`, :mod:`coral_solver.perf` and its pooling side
:mod:`coral_solver.perf_pooling`) for step latencies and KV capacity. Above it, Stage 1 rates a
template by simulating it (:mod:`coral_solver.simcap`), the sim engine (``coral_hpc.engine``)
steps the same scheduler against a wall clock, and ``coral-hpc simulate`` serves trace samples
with :func:`coral_replica_sim.replica.serve`. It imports nothing of the planner (Stage 1,
Stage 2) and nothing of ``coral_hpc``; the import contracts in pyproject.toml check both.

Modules: ``batching`` (the continuous-batching scheduler: pure bookkeeping, no clock) and
``replica`` (a layout, its step model, the pipeline clock and the discrete-event loop).
"""
