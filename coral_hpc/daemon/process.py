"""Processes and files around the daemon: the gateway child process, the one-daemon lock and
the pid/address file ``coral-hpc down`` and ``status`` read."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from coral_hpc.atomic import write_atomic
from coral_hpc.config import Deployment
from coral_hpc.errors import PermanentError

log = logging.getLogger("coral_hpc.daemon")


def runtime_dir(deployment: Deployment) -> Path:
    """Beside the database on the daemon host's local disk: lock, pid file, gateway logs."""
    return Path(deployment.db_path).expanduser().resolve().parent


def lock_path(deployment: Deployment) -> Path:
    return runtime_dir(deployment) / f"{deployment.deployment}.lock"


def info_path(deployment: Deployment) -> Path:
    return runtime_dir(deployment) / f"{deployment.deployment}.daemon.json"


class AlreadyRunning(PermanentError):
    """Another daemon serves this deployment: two would submit each other's replicas twice."""


class DaemonLock:
    """An exclusive ``flock`` held for the daemon's life; released by the kernel if it dies."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(
                f"another coral-hpc serve holds {self.path}; stop it first (SIGTERM) or use "
                "`coral-hpc status`"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def lock_is_held(path: Path) -> bool:
    """Whether some process holds the daemon lock at ``path`` now."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def write_info(path: Path, data: dict) -> None:
    """Write the daemon's pid/address file atomically."""
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def read_info(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rotate_at_start(path: Path, max_mb: float) -> None:
    """Keep one previous copy of a file that outgrew ``max_mb`` (``path.1``)."""
    try:
        if path.stat().st_size > max_mb * 1024 * 1024:
            path.replace(path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


class GatewayProcess:
    """``coral-hpc gateway CONFIG`` as a child process; the constructor starts nothing."""

    def __init__(self, config_path: Path, deployment: Deployment, listen: str | None = None):
        self.config_path = config_path
        self.deployment = deployment
        self.listen = listen
        base = runtime_dir(deployment)
        self.ready_file = base / f"{deployment.deployment}.gateway.addr"
        self.log_file = base / f"{deployment.deployment}.gateway.log"  # rotated by the gateway
        #: what the gateway prints outside logging (a crash at start): small, rotated at start
        self.output_file = base / f"{deployment.deployment}.gateway.out"
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        """Start the gateway and wait until it listens; returns ``host:port``."""
        self.ready_file.unlink(missing_ok=True)
        argv = [sys.executable, "-c", "from coral_hpc.cli import main; main()", "gateway",
                str(self.config_path), "--ready-file", str(self.ready_file),
                "--log-file", str(self.log_file)]
        if self.listen:
            argv += ["--listen", self.listen]
        _rotate_at_start(self.output_file, self.deployment.retention.log_max_mb)
        with open(self.output_file, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PermanentError(
                    f"the gateway exited with code {self.proc.returncode} at start; see "
                    f"{self.log_file} and {self.output_file}"
                )
            if self.ready_file.exists():
                text = self.ready_file.read_text().strip()
                if text:
                    self.address = text
                    return text
            time.sleep(0.1)
        self.stop()
        raise PermanentError(f"the gateway did not listen within {timeout_s:.0f}s; see {self.log_file}")

    @property
    def url(self) -> str | None:
        return f"http://{self.address}" if self.address else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("gateway did not stop within %.0fs; killing it", timeout_s)
            self.proc.kill()
            self.proc.wait()
