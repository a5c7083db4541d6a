"""The endpoint file a replica job writes once its engine answers ``/health``.

``<state_dir>/<deployment>/endpoints/<replica_id>.json``, written atomically (temp file in the same
folder + rename) so a reader never sees half a file. The daemon reads it with :func:`read_endpoint`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from coral_hpc.atomic import write_atomic


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


def http_health(url: str, timeout: float = 2.0) -> bool:
    """Whether the engine at ``url`` answers ``GET /health`` with 200: the one probe, used on
    the job's node (the entrypoint waits for its engine) and by the daemon (observe step). The
    default timeout: a replica on the cluster network answers in milliseconds."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` through a temp file + rename (readers see old or new)."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


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
