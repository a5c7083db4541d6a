"""Fakes for unit tests that stand in for systems the unit lane cannot start (Slurm)."""
