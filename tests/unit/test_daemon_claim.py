"""One daemon per deployment across login nodes: the claim on the shared state folder, on a fake
clock — a second host is refused while the first one's heartbeat is fresh, takes over once it is
stale, and the first one then stops renewing instead of overwriting."""

from __future__ import annotations

import pytest

from coral_hpc.daemon.claim import HostClaim
from coral_hpc.daemon.process import AlreadyRunning


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_second_login_node_is_refused_then_takes_over_a_silent_claim(tmp_path):
    clock = Clock(1000.0)
    path = tmp_path / "shared" / "demo" / "daemon-host.json"
    login1 = HostClaim(path, stale_after_s=60, clock=clock, host="login1", pid=11)
    login2 = HostClaim(path, stale_after_s=60, clock=clock, host="login2", pid=22)
    login1.acquire()
    clock.now += 30
    assert login1.refresh()
    clock.now += 50  # 50 s after login1's last heartbeat: still fresh
    with pytest.raises(AlreadyRunning) as refused:
        login2.acquire()
    assert "login1" in str(refused.value) and "pid 11" in str(refused.value)
    assert login1.read()["host"] == "login1"
    clock.now += 20  # 70 s of silence: login1's daemon is gone
    login2.acquire()
    assert login2.read() == {"host": "login2", "pid": 22, "heartbeat": clock.now}
    assert not login1.refresh()  # login1 woke up: it must not take the claim back
    assert login2.read()["host"] == "login2"
    login1.release()  # not its claim any more: left alone
    assert path.exists()
    login2.release()
    assert not path.exists()


def test_the_same_host_takes_over_its_own_claim(tmp_path):
    clock = Clock(1000.0)
    path = tmp_path / "daemon-host.json"
    HostClaim(path, 60, clock=clock, host="login1", pid=11).acquire()
    restarted = HostClaim(path, 60, clock=clock, host="login1", pid=12)
    restarted.acquire()  # the local flock already proved pid 11 gone
    assert restarted.read()["pid"] == 12


def test_down_and_status_from_the_wrong_login_node_send_the_user_to_the_daemons_host(tmp_path):
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((repo / "examples" / "models.yaml").read_text())
    config["state_dir"] = str(tmp_path / "shared")
    config["db_path"] = str(tmp_path / "daemon" / "demo.db")  # this host has no database
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    claim = tmp_path / "shared" / "demo" / "daemon-host.json"
    claim.parent.mkdir(parents=True)
    claim.write_text(json.dumps({"host": "login-elsewhere", "pid": 4242,
                                 "heartbeat": time.time()}))

    def run(*args):
        return subprocess.run([sys.executable, "-c", "from coral_hpc.cli import main; main()",
                               *args], capture_output=True, text=True, cwd=repo, timeout=60,
                              env={**os.environ, "SLURM_CONF": "/nonexistent"}, check=False)

    down = run("down", str(path))
    assert down.returncode == 4, down.stderr
    assert "login-elsewhere" in down.stderr and "nothing was stopped" in down.stderr
    status = run("status", str(path))
    assert status.returncode == 2 and "run `coral-hpc status` on login-elsewhere" in status.stderr
    # a silent claim (its daemon died) no longer stands in the way
    claim.write_text(json.dumps({"host": "login-elsewhere", "pid": 4242,
                                 "heartbeat": time.time() - 3600}))
    status = run("status", str(path))
    assert status.returncode == 2 and "login-elsewhere" not in status.stderr
