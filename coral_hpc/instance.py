"""The deployment instance: which state folder a replica job belongs to.

Two ``models.yaml`` files can carry the same ``deployment`` name (two copies of the example in two
directories): their jobs must never be mistaken for each other's, or two daemons adopt and cancel
each other's replicas in a loop (issue 16: 69 jobs in 80 s). The instance is a random id created
once in the deployment's shared state folder (``<state_dir>/<deployment>/instance.json``) and
written into every job's tag: a daemon adopts, counts and cancels only jobs of its own instance.
Every login node reads the same id from the shared filesystem, so ``status``/``down``/``logs``
agree wherever they run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import time
from pathlib import Path

from coral_hpc.atomic import private_dir
from coral_hpc.errors import PermanentError

INSTANCE_FILE_NAME = "instance.json"
_INSTANCE_RE = re.compile(r"^[0-9a-f]{12}$")


class InstanceError(PermanentError):
    """The instance file exists but cannot be read: nothing may be adopted or cancelled."""


def instance_file(state_path: Path) -> Path:
    """``<state_dir>/<deployment>/instance.json``."""
    return Path(state_path) / INSTANCE_FILE_NAME


def read_instance(state_path: Path) -> str | None:
    """The instance id of the state folder; None when no daemon ever served from it.
    Raises :class:`InstanceError` for a file that is there but unreadable or malformed."""
    path = instance_file(state_path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InstanceError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        value = json.loads(text)["instance"]
    except (ValueError, KeyError, TypeError):
        raise InstanceError(
            f"{path}: not an instance file (expected {{\"instance\": ...}})") from None
    if not isinstance(value, str) or not _INSTANCE_RE.match(value):
        raise InstanceError(f"{path}: instance {value!r} is not 12 hex digits")
    return value


def ensure_instance(state_path: Path, deployment: str) -> str:
    """The instance id, created (atomically, ``O_EXCL``) on first use."""
    existing = read_instance(state_path)
    if existing is not None:
        return existing
    path = instance_file(state_path)
    private_dir(path.parent)
    record = {"instance": secrets.token_hex(6), "deployment": deployment,
              "created_at": time.time(), "created_on": socket.gethostname()}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass  # another process created it first: use theirs
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record) + "\n")
    found = read_instance(state_path)
    if found is None:
        raise InstanceError(f"{path}: vanished while it was created")
    return found
