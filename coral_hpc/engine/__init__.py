"""Engines a replica job runs. ``vllm`` is the real one and lives outside this package (it runs in
Slurm jobs from each partition's environment); ``sim`` (:mod:`coral_hpc.engine.sim`) is a server
that speaks vLLM's OpenAI API and metrics with latencies from :mod:`coral_solver.perf`, so the whole
system runs end to end without GPUs. It never runs a model.

Modules: ``args`` (the ``vllm serve`` flags + ``--sim-*``), ``batching`` (continuous-batching
scheduler, pure), ``pipeline`` (step times and KV capacity of a layout from ``coral_solver.perf``),
``runner`` (steps in scaled real time on asyncio), ``metrics`` (vLLM's Prometheus names),
``text`` (token counting, filler), ``api`` (HTTP), ``sim`` (start-up checks, serve, drain).
Nothing is imported here, so ``python -m coral_hpc.engine`` stays fast.
"""
