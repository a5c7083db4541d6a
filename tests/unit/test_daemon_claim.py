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
