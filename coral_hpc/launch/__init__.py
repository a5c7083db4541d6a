"""Replica jobs: the spec of one replica, submission (submitit, or sbatch for heterogeneous
jobs), template rendering and the job-side entrypoint that starts the engine."""
