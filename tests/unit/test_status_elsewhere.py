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
import tempfile
import time
from pathlib import Path

import yaml

from coral_hpc.config import load_deployment
from coral_hpc.daemon.status_file import status_data, status_file, write_status
from coral_hpc.slurm.snapshot import JobInfo
from coral_hpc.store import open_store
from coral_hpc.types import JobTag
from tests.support.no_slurm import no_slurm_env

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    # no Slurm here: its commands fail at once (SLURM_CONF=/nonexistent alone waits 60 s)
    no_slurm = no_slurm_env(Path(tempfile.gettempdir()) / f"coral-no-slurm-{os.getuid()}")
    return subprocess.run([sys.executable, "-c", "from coral_hpc.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
                          env={**os.environ, "SLURM_CONF": "/nonexistent", "COLUMNS": "200",
                               **no_slurm})


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
    assert as_json["daemon"]["heartbeat_at"] > time.time() - 60 and "token" not in as_json["daemon"]
    assert "heartbeat" in shown.stdout

    _lease(lease, time.time() - 3600)  # its daemon died an hour ago: nobody holds the lease
    stale = json.loads(_run("status", str(path), "--json").stdout)
    assert stale["daemon"] is None and stale["published_by"] is None
    assert stale["source"] != "daemon"       # what it published is not the live daemon's word


def _job(job_id: str, deployment: str, instance: str) -> JobInfo:
    tag = JobTag(deployment, "qwen3-8b", f"r{job_id}", "qwen3-8b.tp1.a100-36", instance)
    return JobInfo(job_id=job_id, tag=tag, name=tag.job_name(), state="RUNNING", reason=None,
                   partition="a100", nodes=("a100-01",), num_nodes=1, submit_time=1.0,
                   start_time=2.0, end_time=None, time_limit_s=3600, time_left_s=3000,
                   expected_start=None, restarts=0, gpus=1, gpu_type="a100")


def test_down_from_another_login_node_asks_by_file_then_stops_only_this_instances_jobs(
        tmp_path, monkeypatch):
    """The daemon runs on login-elsewhere (its lease says so; its database is on that host's
    disk): `down` here cannot signal it, so it writes a stop request in the shared state folder,
    waits until the daemon let its lease go, then stops this instance's jobs found in Slurm
    (not another instance's of the same deployment name)."""
    import threading

    from click.testing import CliRunner

    from coral_hpc.cli.down import down
    from coral_hpc.daemon.stop_request import StopRequests
    from coral_hpc.instance import ensure_instance
    from tests.fakes.slurm import FakeSlurm, recorded_snapshot

    config = yaml.safe_load((REPO / "examples" / "models.yaml").read_text())
    config["state_dir"] = str(tmp_path / "shared")
    config["db_path"] = str(tmp_path / "daemon" / "demo.db")  # on the other host, not here
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    deployment = load_deployment(path)
    ours = ensure_instance(deployment.state_path, deployment.deployment)
    lease = deployment.state_path / "daemon.lease.json"
    _lease(lease, time.time())
    slurm = FakeSlurm(recorded_snapshot(), time.time)
    for job_id, instance in (("501", ours), ("502", ours), ("503", "0therinstance")):
        slurm.add_job(_job(job_id, deployment.deployment, instance))
    # and one from before instance tags whose spec.json in this state folder says it is ours
    from coral_hpc.launch.spec import replica_spec
    from coral_hpc.types import ReplicaLayout, StageLayout

    old = replica_spec(deployment, "qwen3-8b", "r504", "qwen3-8b.tp1.a100-36",
                       ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto"),
                       api_key_file=None)
    old.write()
    slurm.add_job(_job("504", deployment.deployment, ""))
    monkeypatch.setattr("coral_hpc.slurm.client_for_deployment", lambda _deployment: slurm)
    signalled = []
    monkeypatch.setattr("os.kill", lambda pid, sig: signalled.append((pid, sig)))

    # the daemon on login-elsewhere: its main loop looks for a stop request, then lets go
    asked: list[str] = []
    requests = StopRequests(deployment.state_path, since=time.time() - 1)

    def other_host_daemon() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            who = requests.pending()
            if who is not None:
                asked.append(who)
                record = json.loads(lease.read_text())
                lease.write_text(json.dumps({**record, "released": True}))
                return
            time.sleep(0.05)

    elsewhere = threading.Thread(target=other_host_daemon)
    elsewhere.start()
    result = CliRunner().invoke(down, [str(path), "--json"])
    elsewhere.join(35)
    assert result.exit_code == 0, result.output
    assert signalled == []                       # pid 4242 lives on another host
    assert len(asked) == 1 and asked[0].startswith("coral-hpc down on ")
    assert json.loads(result.output)["jobs"] == {"501": "CANCELLED", "502": "CANCELLED",
                                                 "504": "CANCELLED"}
    assert sorted(j for j, _, _ in slurm.cancelled) == ["501", "502", "504"]
    assert "503" in slurm.queue                  # another instance's job, left alone
