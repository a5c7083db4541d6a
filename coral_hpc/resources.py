"""Where the shipped sbatch and engine-launch templates live.

In an installed wheel the top-level ``sbatch_templates/`` folder is packaged inside this package
as ``coral_hpc/sbatch_templates``; in a checkout it sits beside this package.
"""

from __future__ import annotations

from pathlib import Path

from coral_solver.resources import profiles_dir

__all__ = ["templates_dir", "profiles_dir"]

_HERE = Path(__file__).resolve().parent


def templates_dir() -> Path:
    """Return the directory holding the hetjob batch script and engine launch scripts."""
    installed = _HERE / "sbatch_templates"
    return installed if installed.is_dir() else _HERE.parent / "sbatch_templates"
