"""Asking a daemon on another host to stop: a file in the shared state folder.

``coral-hpc down`` on the daemon's own host sends SIGTERM; from any other login node it cannot
signal the process, so it writes ``<state_dir>/<deployment>/stop-request.json`` (who asks, when),
and the daemon, which looks for the file every tick of its main loop, stops as on SIGTERM.
A request older than the daemon's own start is someone else's leftover and is removed unread.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from coral_hpc.atomic import write_atomic

STOP_FILE_NAME = "stop-request.json"


def stop_file(state_path: Path) -> Path:
    return Path(state_path) / STOP_FILE_NAME


def request_stop(state_path: Path, reason: str = "coral-hpc down") -> Path:
    """Write a stop request (atomically); returns its path."""
    path = stop_file(state_path)
    write_atomic(path, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                   "reason": reason, "time": time.time()}) + "\n")
    return path


class StopRequests:
    """The daemon's side: :meth:`pending` returns who asked, once, for a request newer than
    ``since``."""

    def __init__(self, state_path: Path, since: float):
        self.path = stop_file(state_path)
        self.since = since
        try:
            if self.path.stat().st_mtime < since:
                self.path.unlink()  # a leftover from before this daemon started
        except OSError:
            pass

    def pending(self) -> str | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            data = {}
        self.path.unlink(missing_ok=True)
        reason = data.get("reason", "a stop request")
        return f"{reason} on {data.get('host')} (pid {data.get('pid')})"
