"""Coral's two-stage planner, pure: numpy, Pyomo and HiGHS only.

This package imports nothing of ``coral_hpc``; it has its own plain input and output types
(:mod:`coral_solver.types`). ``coral_hpc.plan`` converts a cluster snapshot into them.
"""
