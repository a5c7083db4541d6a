"""`coral-hpc status` when no daemon runs (issue 27.1): after `down`, or a kill -9 and scancel,
the database still says READY, and status printed that. Now it says no daemon runs (and when
the last one beat), asks Slurm for the stored jobs in one batched call and probes the endpoints,
and marks every row's facts as live (``source: slurm``) or last known.

Slurm is the fake of tests/fakes/slurm.py (the recorded local cluster); the endpoint that
answers is a real HTTP server on loopback."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli.status import status
from coral_hpc.config import load_deployment
from coral_hpc.errors import TransientError
from coral_hpc.store import open_store
from tests.fakes.slurm import FakeSlurm, recorded_snapshot
from tests.unit.reconcile_facts import rec
from tests.unit.test_status_elsewhere import _job

REPO = Path(__file__).resolve().parents[2]


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def setup(tmp_path, monkeypatch):
    text = (REPO / "examples" / "models.yaml").read_text()
    lines = [f"db_path: {tmp_path / 'coral.db'}" if line.startswith("db_path:") else
             f"state_dir: {tmp_path / 'state'}" if line.startswith("state_dir:") else line
             for line in text.splitlines()]
    path = tmp_path / "models.yaml"
    path.write_text("\n".join(lines) + "\n")
    deployment = load_deployment(path)
    slurm = FakeSlurm(recorded_snapshot(), time.time)
    calls: list[list[str]] = []
    real_job_states = slurm.job_states

    def job_states(ids):
        calls.append(list(ids))
        return real_job_states(ids)

    slurm.job_states = job_states  # type: ignore[method-assign]
    monkeypatch.setattr("coral_hpc.slurm.client_for_deployment", lambda _d: slurm)
    return path, deployment, slurm, calls


def _store_ready(deployment, rid: str, job_id: str, url: str) -> None:
    """What the daemon left: a replica it last saw READY and healthy a minute ago."""
    now = time.time()
    store = open_store(deployment.db_path)
    try:
        store.add_replica(rec(rid, "ready", model=deployment.models[0].name, job_id=job_id,
                              created_at=now - 600, submitted_at=now - 590,
                              started_at=now - 500, ready_at=now - 400, health_ok_at=now - 60,
                              last_seen_at=now - 60, endpoint=url))
    finally:
        store.close()


def _status(path: Path, *args: str):
    out = CliRunner().invoke(status, [str(path), *args], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    return json.loads(out.output) if "--json" in args else out.output


def test_a_stored_ready_replica_whose_job_slurm_no_longer_has_is_not_ready(setup):
    path, deployment, slurm, calls = setup
    _store_ready(deployment, "gone", "9001", _closed_port_url())       # scancelled, forgotten
    _store_ready(deployment, "cancelled", "9002", _closed_port_url())  # sacct still knows it
    slurm.finished["9002"] = "CANCELLED by 1000"
    before = time.time()
    data = _status(path, "--json")
    assert data["daemon"] is None and data["source"] == "slurm"
    assert data["observed_at"] >= before
    rows = {r["id"]: r for r in data["replicas"]}
    assert rows["gone"]["state"] == "FAILED" and rows["gone"]["slurm_state"] == "GONE"
    assert rows["cancelled"]["state"] == "FAILED"
    assert rows["cancelled"]["slurm_state"] == "CANCELLED"
    for row in rows.values():
        assert row["source"] == "slurm" and row["observed_at"] >= before
        assert row["endpoint"] is None
    assert all(m["ready_replicas"] == 0 for m in data["models"])
    assert calls == [["9001", "9002"]]                  # one batched call for every stored job
    human = _status(path)
    assert "no daemon running" in human and "READY" not in human
    assert "replica states from Slurm" in human


def test_a_running_job_is_ready_only_when_its_endpoint_answers_now(setup, endpoint):
    path, deployment, slurm, calls = setup
    _store_ready(deployment, "alive", "9003", endpoint)
    _store_ready(deployment, "silent", "9004", _closed_port_url())
    for job_id in ("9003", "9004"):
        slurm.add_job(_job(job_id, deployment.deployment, "x"))
    rows = {r["id"]: r for r in _status(path, "--json")["replicas"]}
    assert (rows["alive"]["state"], rows["alive"]["health"]) == ("READY", True)
    assert rows["alive"]["endpoint"] == endpoint and rows["alive"]["slurm_state"] == "RUNNING"
    assert (rows["silent"]["state"], rows["silent"]["health"]) == ("UNHEALTHY", False)
    assert {r["source"] for r in rows.values()} == {"slurm"}


def test_when_slurm_cannot_be_asked_the_stored_states_are_marked_last_known(setup):
    path, deployment, slurm, calls = setup
    _store_ready(deployment, "stale", "9005", _closed_port_url())
    slurm.fail_next("job_states", TransientError("slurmctld not responding"))
    data = _status(path, "--json")
    assert data["source"] == "last-known" and "slurmctld not responding" in data["slurm_error"]
    (row,) = data["replicas"]
    assert row["source"] == "last-known" and row["observed_at"] < time.time() - 30
    slurm.fail_next("job_states", TransientError("slurmctld not responding"))
    human = _status(path)
    assert "READY (last known)" in human and "not live" in human


def test_status_names_the_running_daemon_and_its_heartbeat_and_leaves_slurm_alone(setup):
    path, deployment, slurm, calls = setup
    _store_ready(deployment, "r", "9006", _closed_port_url())
    lease = deployment.state_path / "daemon.lease.json"
    lease.parent.mkdir(parents=True, exist_ok=True)
    beat = time.time() - 5
    lease.write_text(json.dumps({"deployment": deployment.deployment,
                                 "host": socket.gethostname(), "pid": os.getpid(),
                                 "token": "secret", "renewed_at": beat, "stale_after_s": 60,
                                 "gateway": "127.0.0.1:8000"}))
    data = _status(path, "--json")
    assert data["source"] == "daemon" and calls == []     # the daemon's record is live
    assert data["daemon"]["pid"] == os.getpid() and data["daemon"]["heartbeat_at"] == beat
    assert data["daemon"]["host"] == socket.gethostname() and "token" not in data["daemon"]
    assert data["replicas"][0]["state"] == "READY" and data["replicas"][0]["source"] == "daemon"
    assert "heartbeat 5 s ago" in _status(path)

    # the daemon was killed: its lease names a pid that no longer runs on this host
    lease.write_text(json.dumps({**json.loads(lease.read_text()), "pid": _dead_pid()}))
    data = _status(path, "--json")
    assert data["daemon"] is None and data["source"] == "slurm"
    assert data["last_daemon"]["heartbeat_at"] == beat
    assert "last heartbeat on" in _status(path)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_from_another_login_node_a_dead_daemons_published_ready_is_checked_with_slurm(
        setup, endpoint):
    """The database is on the dead daemon's host; this host has only its status.json. The rows
    it published READY are derived again from Slurm and the endpoints."""
    from coral_hpc.daemon.status_file import status_data, status_file, write_status

    path, deployment, slurm, calls = setup
    _store_ready(deployment, "gone", "9101", _closed_port_url())
    _store_ready(deployment, "alive", "9102", endpoint)
    store = open_store(deployment.db_path)
    try:
        published = status_data(deployment, store, time.time())
    finally:
        store.close()
    assert {r["state"] for r in published["replicas"]} == {"READY"}
    write_status(status_file(deployment.state_path), published)
    Path(deployment.db_path).unlink()                   # the database is on the other host
    lease = deployment.state_path / "daemon.lease.json"
    lease.write_text(json.dumps({"deployment": deployment.deployment, "host": "login-elsewhere",
                                 "pid": 4242, "token": "t", "renewed_at": time.time() - 3600}))
    slurm.add_job(_job("9102", deployment.deployment, "x"))
    data = _status(path, "--json")
    assert data["daemon"] is None and data["source"] == "slurm"
    rows = {r["id"]: r for r in data["replicas"]}
    assert (rows["gone"]["state"], rows["gone"]["slurm_state"]) == ("FAILED", "GONE")
    assert (rows["alive"]["state"], rows["alive"]["health"]) == ("READY", True)
    assert {r["source"] for r in rows.values()} == {"slurm"}
    assert data["models"][0]["ready_replicas"] == 1
    assert data["last_daemon"]["host"] == "login-elsewhere"
    assert calls == [["9101", "9102"]]
