"""The ``coral-hpc`` command line as the Slurm-backed serve tests drive it: a real process per
command, in the repository, with the test's Slurm environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from coral_hpc.config import load_deployment
from coral_hpc.slurm import make_client
from tests.conftest import REPO, wait_until

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


def start_serve(env: dict, config: Path, folder: Path) -> subprocess.Popen:
    """``coral-hpc serve CONFIG`` as a background process on an ephemeral gateway port, its
    Stage-1 cache in FOLDER/templates and its output appended to FOLDER/serve.log."""
    with open(folder / "serve.log", "ab") as log:
        return subprocess.Popen(
            [*CLI, "serve", str(config), "--listen", "127.0.0.1:0",
             "--cache-dir", str(folder / "templates")],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_every_model_ready(env: dict, config: Path, timeout_s: float) -> dict:
    """``status --json`` once every configured model has a READY replica (fails the test after
    ``timeout_s``)."""
    db_path = Path(load_deployment(config).db_path)

    def ready() -> dict | None:
        if not db_path.exists():
            return None
        data = status(env, config)
        return data if all(m["ready_replicas"] >= 1 for m in data["models"]) else None

    data = wait_until(ready, timeout_s, "a READY replica of every model")
    assert isinstance(data, dict)
    return data
