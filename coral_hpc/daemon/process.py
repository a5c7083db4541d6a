"""Processes and files around the daemon: the gateway child process, the one-daemon lock and
the pid/address file ``coral-hpc down`` and ``status`` read."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from coral_hpc.atomic import private_dir, write_atomic
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
        private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"another coral-hpc serve (host {socket.gethostname()}, pid {holder}) holds "
                f"{self.path}; stop it first (`coral-hpc down`, or SIGTERM) or see "
                "`coral-hpc status`"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for the message above
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


def gateway_record_path(deployment: Deployment) -> Path:
    """Beside the database: the running gateway's pid, address and how it was started."""
    return runtime_dir(deployment) / f"{deployment.deployment}.gateway.json"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 reaches it or is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def recorded_gateway(deployment: Deployment) -> dict | None:
    """The gateway a daemon of this deployment started and that still runs (its pid alive and
    its command line ``coral-hpc gateway <this config>``); None otherwise."""
    record = read_info(gateway_record_path(deployment))
    if not record or not isinstance(record.get("pid"), int):
        return None
    pid = record["pid"]
    argv = _cmdline(pid)
    if not pid_alive(pid) or "gateway" not in argv or record.get("config") not in argv:
        return None  # gone, or the pid now belongs to another process
    return record


def _terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM ``pid`` (not our child), then SIGKILL after ``timeout_s``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    log.warning("gateway pid %d did not stop within %.0fs; killing it", pid, timeout_s)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_recorded_gateway(deployment: Deployment, timeout_s: float = 10.0) -> int | None:
    """Stop a gateway left running by a daemon that died (kill -9); returns its pid."""
    record = recorded_gateway(deployment)
    if record is None:
        return None
    _terminate(record["pid"], timeout_s)
    gateway_record_path(deployment).unlink(missing_ok=True)
    return record["pid"]


class GatewayProcess:
    """``coral-hpc gateway CONFIG`` as a process of its own session; the constructor starts
    nothing. The gateway outlives a daemon killed with -9 (it keeps routing by the last table);
    the next daemon :meth:`adopt` s it, so no process leaks and no request sees a gap."""

    def __init__(self, config_path: Path, deployment: Deployment, listen: str | None = None):
        self.config_path = config_path
        self.deployment = deployment
        self.listen = listen
        base = runtime_dir(deployment)
        self.ready_file = base / f"{deployment.deployment}.gateway.addr"
        self.log_file = base / f"{deployment.deployment}.gateway.log"  # rotated by the gateway
        #: what the gateway prints outside logging (a crash at start): small, rotated at start
        self.output_file = base / f"{deployment.deployment}.gateway.out"
        self.record_file = gateway_record_path(deployment)
        self.proc: subprocess.Popen | None = None
        self.adopted_pid: int | None = None  # a gateway an earlier daemon started
        self.address: str | None = None

    def adopt(self) -> str | None:
        """Take over the gateway an earlier daemon of this deployment left running, when it was
        started the same way (config, --listen); stop it when it was not. Returns its address,
        or None when there is none to adopt (then :meth:`start` one)."""
        record = recorded_gateway(self.deployment)
        if record is None:
            return None
        same = record.get("config") == str(self.config_path) and record.get("listen") == self.listen
        if not same or not record.get("address"):
            log.info("stopping gateway pid %s of an earlier daemon (started differently)",
                     record["pid"])
            _terminate(record["pid"], 10.0)
            self.record_file.unlink(missing_ok=True)
            return None
        self.adopted_pid = record["pid"]
        self.address = record["address"]
        return self.address

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else self.adopted_pid

    def _write_record(self) -> None:
        write_info(self.record_file, {"pid": self.pid, "address": self.address,
                                      "config": str(self.config_path), "listen": self.listen,
                                      "started_at": time.time()})

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
        self.adopted_pid, self.address = None, None
        self._write_record()  # known at once: a daemon killed before it listens leaks nothing
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
                    self._write_record()
                    return text
            time.sleep(0.1)
        self.stop()
        raise PermanentError(f"the gateway did not listen within {timeout_s:.0f}s; see {self.log_file}")

    @property
    def url(self) -> str | None:
        """The gateway's base URL for the daemon's own calls (https when it serves TLS)."""
        if not self.address:
            return None
        scheme = "https" if self.deployment.gateway.tls_cert else "http"
        return f"{scheme}://{self.address}"

    def alive(self) -> bool:
        if self.adopted_pid is not None:
            return pid_alive(self.adopted_pid)
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.adopted_pid is not None:
            _terminate(self.adopted_pid, timeout_s)
            self.adopted_pid = None
            self.record_file.unlink(missing_ok=True)
            return
        if self.proc is None or self.proc.poll() is not None:
            return
        self.record_file.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("gateway did not stop within %.0fs; killing it", timeout_s)
            self.proc.kill()
            self.proc.wait()
