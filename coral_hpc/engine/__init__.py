"""Engines a replica job runs. ``vllm`` is the real one and lives outside this package (it runs in
Slurm jobs from each partition's environment); ``sim`` (:mod:`coral_hpc.engine.sim`) is a server
that speaks vLLM's OpenAI API and metrics with latencies from :mod:`coral_solver.perf`, so the whole
system runs end to end without GPUs. It never runs a model.

The sim engine runs the replica simulator (:mod:`coral_replica_sim`: the continuous-batching
scheduler, the step times and KV capacity of a layout, the pipeline clock), the one copy Stage 1
rates templates with, against a wall clock instead of virtual time.

Modules: ``args`` (the ``vllm serve`` flags + ``--sim-*``), ``runner`` (steps in scaled real time
on asyncio), ``disagg`` (KV hand-off between prefill and decode replicas), ``metrics`` (vLLM's
Prometheus names; ``vllm_metrics`` reads them back), ``text`` (token counting, filler), ``api``
(HTTP), ``sim`` (start-up checks, serve, drain).
Nothing is imported here, so ``python -m coral_hpc.engine`` stays fast.
"""
