"""The endpoint file a replica job writes once its engine answers ``/health``.

``<state_dir>/<deployment>/endpoints/<replica_id>.json``, written atomically (temp file in the same
folder + rename, mode 600) so a reader never sees half a file. The daemon reads it with
:func:`read_endpoint`.

The file decides where prompts and the replica key go, so it is authenticated: the job signs its
content with the replica key (which only the service account and its jobs can read) as ``mac``,
an HMAC-SHA256 over the canonical JSON of every other field, and a reader given the key refuses
a file whose ``mac`` is missing or wrong (:class:`EndpointRefused`), e.g. one another user forged.
"""

from __future__ import annotations

import hashlib
import hmac
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


class EndpointRefused(ValueError):
    """An endpoint file that is not signed with the replica key: never routed to."""


def endpoint_mac(data: dict, key: str) -> str:
    """HMAC-SHA256 (hex) of ``data`` (its ``mac`` field left out) under ``key``."""
    body = {k: v for k, v in data.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()


def write_endpoint(path: Path, endpoint: Endpoint, key: str | None = None) -> None:
    """Publish ``endpoint`` at ``path`` atomically, signed with the replica ``key`` if any."""
    data = asdict(endpoint)
    if key:
        data["mac"] = endpoint_mac(data, key)
    write_json_atomic(path, data)


def read_endpoint(path: Path, key: str | None = None) -> Endpoint | None:
    """The endpoint at ``path``; None when absent or not (yet) a valid endpoint file.

    With the replica ``key``, a file whose ``mac`` is missing or does not match its content
    raises :class:`EndpointRefused`; without (no replica key configured), the file is taken as
    written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    mac = data.pop("mac", None)
    if key:
        if not isinstance(mac, str):
            raise EndpointRefused(f"{path} is not signed with the replica key")
        if not hmac.compare_digest(mac, endpoint_mac(data, key)):
            raise EndpointRefused(f"{path} has a wrong signature (not written by the replica)")
    try:
        return Endpoint(**data)
    except (ValueError, TypeError):
        return None
