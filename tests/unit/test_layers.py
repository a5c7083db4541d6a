"""The layering in ARCHITECTURE.md holds: checked by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([lint], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower() or "0 broken" in result.stdout.lower()


def test_only_the_slurm_layer_runs_slurm_commands():
    """No module outside coral_hpc/slurm names a Slurm command in an argv list or imports pyslurm."""
    offenders = []
    for path in list((REPO / "coral_hpc").rglob("*.py")) + list((REPO / "solver").rglob("*.py")):
        if "slurm" in path.relative_to(REPO).parts[1:2]:
            continue
        text = path.read_text()
        for needle in ('"sbatch"', '"squeue"', '"sinfo"', '"scancel"', '"sacct"', '"scontrol"',
                       '"sacctmgr"', "import pyslurm"):
            if needle in text:
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert not offenders, offenders
