"""A wheel built from the checkout installs into a fresh venv outside it, and runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_finds_its_data():
    result = subprocess.run(
        [str(REPO / "scripts" / "wheel-check")], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "coral-hpc, version" in result.stdout
    assert "site-packages/coral_hpc/sbatch_templates" in result.stdout
    assert "site-packages/coral_solver/profiles" in result.stdout
    # The wheel's top-level import names are the project's own (issue 17): no bare ``solver``.
    assert "top-level import names: coral_hpc coral_replica_sim coral_solver\n" in result.stdout
