"""`coral-hpc status` from a login node other than the daemon's (its database is on that host's
local disk): it reads the daemon's lease and the status the daemon published in the shared
state folder, names the daemon's host, and says plainly when nothing was published. A stale
lease (its daemon died) no longer names a host. Ported from the claim-file tests when the claim
file (daemon-host.json) gave way to the lease (daemon.lease.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from coral_hpc.config import load_deployment
from coral_hpc.daemon.status_file import status_data, status_file, write_status
from coral_hpc.store import open_store

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from coral_hpc.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
                          env={**os.environ, "SLURM_CONF": "/nonexistent", "COLUMNS": "200"})


def _lease(path: Path, renewed_at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"deployment": "demo", "host": "login-elsewhere", "pid": 4242,
                                "token": "t", "renewed_at": renewed_at, "stale_after_s": 60,
                                "gateway": "login-elsewhere:8000"}))


def test_status_from_another_login_node_reads_what_the_daemon_published(tmp_path):
    config = yaml.safe_load((REPO / "examples" / "models.yaml").read_text())
    config["state_dir"] = str(tmp_path / "shared")
    config["db_path"] = str(tmp_path / "daemon" / "demo.db")  # this host has no database
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    deployment = load_deployment(path)
    lease = deployment.state_path / "daemon.lease.json"
    _lease(lease, time.time())

    nothing = _run("status", str(path))
    assert nothing.returncode == 2, nothing.stderr
    assert "no status published" in nothing.stderr and "on login-elsewhere" in nothing.stderr

    # what the daemon on login-elsewhere writes each cycle (from its own database)
    store = open_store(tmp_path / "elsewhere.db")
    try:
        published = status_data(deployment, store, time.time())
        write_status(status_file(deployment.state_path), published)
    finally:
        store.close()
    shown = _run("status", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "daemon on login-elsewhere pid 4242" in shown.stdout
    assert "as published in the state folder" in shown.stdout
    as_json = json.loads(_run("status", str(path), "--json").stdout)
    assert as_json["published_by"] == "login-elsewhere" and as_json["daemon"]["pid"] == 4242

    _lease(lease, time.time() - 3600)  # its daemon died an hour ago: nobody holds the lease
    stale = json.loads(_run("status", str(path), "--json").stdout)
    assert stale["daemon"] is None and stale["published_by"] is None
