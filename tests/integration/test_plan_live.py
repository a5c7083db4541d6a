"""`coral-hpc plan` against the live local cluster: what Slurm reports now, solved and checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "examples" / "models.yaml"


@pytest.mark.slurm
def test_live_plan_on_the_local_cluster(env, tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "plan", str(MODELS),
         "--json", "--cache-dir", str(tmp_path / "templates")],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["mode"] in ("optimal", "scarce") and doc["checker_problems"] == []
