"""One daemon per deployment, wherever it is started: a lease on the shared state folder.

The local ``flock`` (``coral_hpc.daemon.process.DaemonLock``) only stops a second daemon on the
same host. The lease is a small JSON file in ``<state_dir>/<deployment>/daemon.lease.json`` — the
folder every login node and compute node shares — naming the holder (host, pid, a token unique to
this run) and when it last renewed. The rule:

- The holder renews every :data:`RENEW_S` seconds and checks, each time, that the file still holds
  its own token; if not, it lost the lease and stops.
- Another daemon may take the lease over only when it is **stale**: not renewed for
  :data:`STALE_AFTER_S` seconds (6 renewals missed; allows for NFS attribute caching and clock
  skew between login nodes), or — on the holder's own host — when the holder's pid is gone
  (a ``kill -9`` is taken over at once).
- Otherwise the second daemon exits with status 2, naming the holder's host and pid.

Writes go in place (open, write, fsync) rather than by rename: NFS clients cache directory
entries, so a replaced file can be read stale for tens of seconds; an opened file is revalidated
(close-to-open consistency). A takeover writes, waits :data:`SETTLE_S` and reads back: of two
daemons taking over together, the one whose token is not there stops.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coral_hpc.atomic import private_dir, write_atomic
from coral_hpc.daemon.process import pid_alive
from coral_hpc.errors import PermanentError

LEASE_FILE_NAME = "daemon.lease.json"
#: The holder renews this often (the daemon's main loop ticks every 0.5 s).
RENEW_S = 10.0
#: A lease not renewed for this long is stale and may be taken over from another host.
STALE_AFTER_S = 60.0
#: After writing a takeover, wait this long and read back before acting.
SETTLE_S = 0.5


class LeaseHeld(PermanentError):
    """Another daemon holds the lease: starting a second one would submit and cancel twice."""

    def __init__(self, holder: dict, path: Path, now: float):
        self.holder = holder
        age = now - float(holder.get("renewed_at", now))
        super().__init__(
            f"deployment {holder.get('deployment')!r} is already served by the daemon on host "
            f"{holder.get('host')} (pid {holder.get('pid')}, lease {path} renewed {age:.0f}s "
            f"ago); stop it first (`coral-hpc down`, or SIGTERM on {holder.get('host')}). A lease "
            f"not renewed for {STALE_AFTER_S:.0f}s is taken over"
        )


def lease_file(state_path: Path) -> Path:
    return Path(state_path) / LEASE_FILE_NAME


def read_lease(path: Path) -> dict | None:
    """The lease record, or None when absent or unreadable (a write in progress)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_stale(record: dict, now: float, host: str | None = None) -> bool:
    """Whether ``record`` may be taken over at ``now`` by a daemon on ``host``."""
    try:
        renewed = float(record["renewed_at"])
        pid = int(record["pid"])
    except (KeyError, TypeError, ValueError):
        return True  # not a lease anyone can hold
    if record.get("released"):
        return True
    if host is not None and record.get("host") == host and not pid_alive(pid):
        return True
    return now - renewed > STALE_AFTER_S


def holder(state_path: Path, now: float | None = None) -> dict | None:
    """The live holder's record (host, pid, gateway, ...), or None when nobody holds it."""
    record = read_lease(lease_file(state_path))
    now = time.time() if now is None else now
    if record is None or is_stale(record, now, socket.gethostname()):
        return None
    return record


@dataclass
class Lease:
    """This daemon's lease on ``state_path``. Construct, :meth:`acquire`, :meth:`renew` from the
    main loop, :meth:`release` on the way out."""

    state_path: Path
    deployment: str
    clock: Callable[[], float] = time.time
    host: str = ""
    pid: int = 0

    def __post_init__(self) -> None:
        self.path = lease_file(self.state_path)
        self.host = self.host or socket.gethostname()
        self.pid = self.pid or os.getpid()
        self.token = secrets.token_hex(8)
        self.extra: dict = {}
        self.renewed_at: float | None = None

    # ------------------------------------------------------------------ the record

    def _record(self, now: float) -> dict:
        return {"deployment": self.deployment, "host": self.host, "pid": self.pid,
                "token": self.token, "renewed_at": now, "stale_after_s": STALE_AFTER_S,
                **self.extra}

    def _write(self, record: dict, create: bool) -> bool:
        """Create the file exclusively (``create``: False when it exists), or replace it
        atomically: a renewal must never leave the file empty for a moment, or the holder's
        own :meth:`ours` (the act step's check, in another thread) reads nothing and stops
        acting — seen on the loaded 2-core machine with real engines starting, where a write
        between truncate and data took longer than the re-read's 50 ms."""
        text = json.dumps(record) + "\n"
        if not create:
            write_atomic(self.path, text)
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def ours(self) -> bool:
        """Whether the file holds this daemon's token now."""
        record = read_lease(self.path)
        if record is None:  # caught between truncate and write (ours, in place): look again
            time.sleep(0.05)
            record = read_lease(self.path)
        return record is not None and record.get("token") == self.token

    # ------------------------------------------------------------------ life cycle

    def acquire(self, sleep: Callable[[float], None] = time.sleep) -> dict | None:
        """Take the lease, or raise :class:`LeaseHeld` naming the holder. Returns the stale
        record taken over (None when the lease was free)."""
        private_dir(self.path.parent)
        for _ in range(5):
            now = self.clock()
            current = read_lease(self.path)
            if current is None and not self.path.exists():
                if not self._write(self._record(now), create=True):
                    continue  # someone created it just now: look again
                taken = None
            elif current is not None and not is_stale(current, now, self.host):
                raise LeaseHeld(current, self.path, now)
            elif current is None:
                sleep(SETTLE_S)  # being written (or garbage): read again before judging
                if read_lease(self.path) is None and self.path.exists():
                    self._write(self._record(self.clock()), create=False)
                    taken = {}
                else:
                    continue
            else:
                self._write(self._record(now), create=False)
                taken = current
            sleep(SETTLE_S)
            if self.ours():
                self.renewed_at = now
                return taken
        current = read_lease(self.path) or {}
        raise LeaseHeld(current, self.path, self.clock())

    def renew(self, force: bool = False) -> bool:
        """Renew when due (every :data:`RENEW_S`); False when the lease was lost to another
        daemon (the caller must stop acting)."""
        now = self.clock()
        if not force and self.renewed_at is not None and now - self.renewed_at < RENEW_S:
            return True
        if not self.ours():
            return False
        self._write(self._record(now), create=False)
        self.renewed_at = now
        return True

    def publish(self, **fields) -> None:
        """Add fields (gateway address, pids) to the record; written at once."""
        self.extra.update(fields)
        if self.ours():
            self._write(self._record(self.clock()), create=False)
            self.renewed_at = self.clock()

    def release(self) -> None:
        """Mark the lease released (a restart anywhere may take it at once)."""
        if self.ours():
            self._write({**self._record(self.clock()), "released": True}, create=False)
