"""The endpoint file a replica job writes once its engine answers ``/health``.

``<state_dir>/<deployment>/endpoints/<replica_id>.json``, written atomically (temp file in the same
folder + rename) so a reader never sees half a file. The daemon reads it with :func:`read_endpoint`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Endpoint:
    """Where a READY replica serves: ``url`` is the base (``url + '/v1/models'``)."""

    replica_id: str
    job_id: str
    url: str
    host: str
    port: int
    model: str
    pid: int  # the engine's process id on the head node
    started_at: float  # epoch seconds: the engine process started
    ready_at: float  # epoch seconds: the engine first answered /health
    node: str = ""  # Slurm node name of the head (SLURMD_NODENAME)
    cuda_visible_devices: str = ""  # GPUs Slurm gave the head node's task
    draining_at: float | None = None  # epoch seconds: SIGTERM/SIGUSR2 received, engine draining


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` through a temp file + rename (readers see old or new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_endpoint(path: Path, endpoint: Endpoint) -> None:
    """Publish ``endpoint`` at ``path`` atomically."""
    write_json_atomic(path, asdict(endpoint))


def read_endpoint(path: Path) -> Endpoint | None:
    """The endpoint at ``path``; None when absent or not (yet) a valid endpoint file."""
    try:
        data = json.loads(path.read_text())
        return Endpoint(**data)
    except (OSError, ValueError, TypeError):
        return None
