"""coral-hpc: serve many LLMs on a shared, heterogeneous Slurm GPU cluster at least cost."""

__version__ = "0.1.0"
