"""The ``coral-hpc`` command line as the Slurm-backed serve tests drive it: a real process per
command, in the repository, with the test's Slurm environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from coral_hpc.config import load_deployment
from coral_hpc.slurm import make_client
from tests.conftest import REPO

#: ``coral-hpc`` in this interpreter (no console script needed in the venv)
CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]


def cli(env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``coral-hpc ARGS`` in the repository; its exit status and output, never raised."""
    return subprocess.run([*CLI, *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def status(env: dict, config: Path) -> dict:
    """``coral-hpc status --json``, which must succeed."""
    out = cli(env, "status", str(config), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def status_if_any(env: dict, config: Path) -> dict | None:
    """``coral-hpc status --json``, or None while serve has not made its database yet (or
    status fails)."""
    if not Path(load_deployment(config).db_path).exists():
        return None
    out = cli(env, "status", str(config), "--json")
    return json.loads(out.stdout) if out.returncode == 0 else None


def live_jobs(env: dict, deployment: str) -> list[str]:
    """The deployment's job ids Slurm still lists as not ended, sorted."""
    snapshot = make_client("cli", env=env).snapshot(deployment)
    return sorted(j.job_id for j in snapshot.jobs if j.end_kind is None)
