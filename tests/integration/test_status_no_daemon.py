"""`coral-hpc status --json` with no daemon, against the real local Slurm (issue 27.1).

Nothing is served. The database holds what a daemon that was killed would have left: replicas
it last saw READY. Their jobs are one that never existed (long purged), one this test submits
held (it never runs or takes a GPU) and cancels, and one it leaves held in the queue. status
must ask Slurm and show none of them READY.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.store import open_store
from coral_hpc.types import JobTag
from tests.conftest import wait_until
from tests.unit.reconcile_facts import rec

pytestmark = pytest.mark.slurm


def _models_yaml(path: Path, deployment: str) -> Path:
    path.write_text(f"""
deployment: {deployment}
state_dir: {path.parent}/state
db_path: {path.parent}/daemon.db
engine: {{kind: sim}}
cluster:
  partitions:
    - {{name: v100, gpu_types: [v100], price: {{v100: 1.0}}}}
models:
  - {{name: m1, source: x, architecture: x, mix: {{input_tokens: 1, output_tokens: 1}},
      demand: auto, slo: {{ttft_s: 1, tpot_s: 0.1}}}}
""")
    return path


def _held_job(slurm, deployment: str, replica: str) -> str:
    tag = JobTag(deployment, "m1", replica, "tpl")
    return slurm.sbatch("--hold", "-p", "v100", "--gres=gpu:v100:1", "-t", "5", "-J",
                        tag.job_name(), f"--comment={tag.comment()}", "--wrap=sleep 60")


def _squeue_state(slurm, job_id: str) -> str:
    return slurm.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T",
                     check=False).stdout.strip()


def test_status_without_a_daemon_does_not_show_ready_for_jobs_slurm_no_longer_runs(
        slurm, tmp_path):
    name = f"statusit-{uuid.uuid4().hex[:6]}"
    path = _models_yaml(tmp_path / "models.yaml", name)
    deployment = load_deployment(path)
    cancelled = _held_job(slurm, name, "rcancel")
    held = _held_job(slurm, name, "rheld")
    slurm.run("scancel", cancelled)
    wait_until(lambda: _squeue_state(slurm, cancelled) in ("CANCELLED", ""), 30,
               f"job {cancelled} cancelled")
    now = time.time()
    store = open_store(deployment.db_path)
    try:
        for rid, job_id in (("rgone", "99999990"), ("rcancel", cancelled), ("rheld", held)):
            store.add_replica(rec(rid, "ready", model="m1", job_id=job_id, partitions=("v100",),
                                  created_at=now - 600, submitted_at=now - 590,
                                  started_at=now - 500, ready_at=now - 400,
                                  health_ok_at=now - 60, last_seen_at=now - 60,
                                  endpoint="http://127.0.0.1:9"))
    finally:
        store.close()

    out = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "status", str(path),
         "--json"], capture_output=True, text=True, env=slurm.env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["state"] for r in data["replicas"]].count("READY") == 0, data["replicas"]
    assert data["daemon"] is None and data["source"] == "slurm", data
    rows = {r["id"]: r for r in data["replicas"]}
    assert all(r["state"] != "READY" and r["source"] == "slurm" for r in rows.values()), rows
    assert rows["rgone"]["slurm_state"] == "GONE" and rows["rgone"]["state"] == "FAILED"
    assert rows["rcancel"]["slurm_state"] == "CANCELLED"
    assert rows["rcancel"]["state"] == "FAILED"
    assert rows["rheld"]["slurm_state"] == "PENDING" and rows["rheld"]["state"] == "PENDING"
    assert data["models"][0]["ready_replicas"] == 0
