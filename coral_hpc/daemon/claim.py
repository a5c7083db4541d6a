"""Which host serves a deployment, claimed on the shared filesystem.

The daemon's lock (:class:`~coral_hpc.daemon.process.DaemonLock`) is a ``flock`` on the daemon
host's local disk: it stops a second daemon on the same login node, not one on another login
node of the same cluster, which would plan and submit the same deployment a second time. So the
daemon also claims ``<state_dir>/<deployment>/daemon-host.json`` — host, pid and a heartbeat it
renews every poll — and refuses to start while another host's heartbeat is fresh. A claim whose
heartbeat is older than ``stale_after_s`` (its daemon died, its host went away) may be taken
over. Written atomically (temp file + rename), read with close-to-open consistency on NFS.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from coral_hpc.daemon.process import AlreadyRunning

log = logging.getLogger("coral_hpc.daemon")

#: a heartbeat older than this many poll intervals (and at least MIN_STALE_S) is a dead daemon's
STALE_POLLS = 5
MIN_STALE_S = 60.0


def claim_path(state_path: Path) -> Path:
    return state_path / "daemon-host.json"


class HostClaim:
    """This daemon's claim on the deployment; the constructor writes nothing."""

    def __init__(self, path: Path, stale_after_s: float, clock: Callable[[], float] = time.time,
                 host: str | None = None, pid: int | None = None):
        self.path = path
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.host = host or socket.gethostname()
        self.pid = pid or os.getpid()

    def read(self) -> dict | None:
        """The current claim, or None when there is none (or it is unreadable)."""
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def _ours(self, claim: dict | None) -> bool:
        return claim is not None and claim.get("host") == self.host and claim.get("pid") == self.pid

    def acquire(self) -> None:
        """Claim the deployment, or raise :class:`AlreadyRunning` naming the host that serves it.
        A claim by this host is taken over: the local lock already proved its daemon gone."""
        current = self.read()
        now = self.clock()
        if current is not None and current.get("host") != self.host:
            age = now - float(current.get("heartbeat", 0.0))
            if age < self.stale_after_s:
                raise AlreadyRunning(
                    f"a coral-hpc daemon on {current.get('host')} (pid {current.get('pid')}) "
                    f"serves this deployment (heartbeat {age:.0f} s ago in {self.path}); run "
                    f"coral-hpc on that host, or stop it there first"
                )
            log.warning("taking over the claim of %s, silent for %.0f s",
                        current.get("host"), age)
        self._write(now)

    def refresh(self) -> bool:
        """Renew the heartbeat; False (and nothing written) when another daemon took over."""
        current = self.read()
        if current is not None and not self._ours(current):
            log.error("%s now names %s (pid %s): another daemon took over this deployment",
                      self.path, current.get("host"), current.get("pid"))
            return False
        self._write(self.clock())
        return True

    def release(self) -> None:
        """Remove the claim if it is still ours."""
        if self._ours(self.read()):
            self.path.unlink(missing_ok=True)

    def _write(self, now: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{self.host}.{self.pid}.tmp")
        tmp.write_text(json.dumps({"host": self.host, "pid": self.pid, "heartbeat": now}) + "\n")
        tmp.replace(self.path)


def served_elsewhere(state_path: Path, stale_after_s: float = MIN_STALE_S,
                     clock: Callable[[], float] = time.time,
                     host: str | None = None) -> dict | None:
    """The claim of a daemon on *another* host whose heartbeat is fresh, or None. Commands that
    act on a deployment (``down``) or read its database (``status``) use it to send the user to
    the host that serves it instead of acting from the wrong login node."""
    me = host or socket.gethostname()
    claim = HostClaim(claim_path(state_path), stale_after_s, clock).read()
    if claim is None or claim.get("host") == me:
        return None
    age = clock() - float(claim.get("heartbeat", 0.0))
    return {**claim, "age_s": age} if age < stale_after_s else None
