"""Where the shipped performance profiles live.

In an installed wheel the top-level ``profiles/`` folder is packaged inside this package as
``coral_solver/profiles``; in a checkout it is the top-level ``profiles/`` folder, two levels up
(``solver/coral_solver/`` → the checkout). Callers ask here instead of
guessing paths.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def profiles_dir() -> Path:
    """Return the directory holding GPU specs, model architectures and calibration files."""
    installed = _HERE / "profiles"
    return installed if installed.is_dir() else _HERE.parents[1] / "profiles"
