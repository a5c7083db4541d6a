"""The routing table: the one file through which the daemon tells the gateway where to send requests.

Format (JSON, written atomically by the daemon, read by the gateway when it changes)::

    {"version": 7,                       # monotonic; the gateway ignores a table not newer than its own
     "generated_at": "2026-05-01T12:00:00+00:00",
     "models": {"qwen3-8b": {"replicas": [{"id": "r3", "url": "http://a100-01:8301", "weight": 4.2}]},
                "phi-4":    {"replicas": []}}}

Every configured model is listed; ``replicas`` holds only READY replicas. ``weight`` is the replica's
planned throughput (requests/s of the model's mix), so routing shares follow the plan. A replica of a
disaggregated model also has ``"role": "prefill"`` or ``"decode"`` (absent = ``"both"``); its weight
is then its phase's throughput in the same requests/s (:mod:`coral_hpc.gateway.disagg`).
``job_id`` (optional) is the replica's Slurm job, which the gateway's access log names.
A model scaled to zero that has no READY replica also has ``"wake"`` (:class:`WakeInfo`):
``{"state": "cold" | "waking", "startup_s": 95, "ready_by": 1767000000.0, "impossible": "..."}``
— what the gateway tells a request for it (held, or 503 with Retry-After).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from coral_hpc.atomic import write_atomic
from coral_hpc.config import Deployment
from coral_hpc.errors import PermanentError

#: File names inside a deployment's state folder (``<state_dir>/<deployment>/``).
TABLE_FILE_NAME = "routing-table.json"
REPLICA_KEY_FILE_NAME = "replica.key"
INTERNAL_KEY_FILE_NAME = "internal.key"


class RoutingTableError(PermanentError):
    """A routing-table file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class ReplicaRoute:
    """One READY replica: where it listens and how much of its model's traffic it should take."""

    id: str
    url: str
    weight: float
    role: str = "both"  #: "both" (aggregated), "prefill" or "decode"
    job_id: str | None = None  #: its Slurm job, for the access log (absent in older tables)


@dataclass(frozen=True)
class WakeInfo:
    """A model scaled to zero without a READY replica: ``state`` cold or waking; ``startup_s``
    the measured start-up (submit to READY); ``ready_by`` (epoch seconds) when its first replica
    is expected READY, from Slurm's expected start plus the start-up, if known; ``impossible``
    why no wake can succeed (no partition can ever run it), if so."""

    state: str
    startup_s: float
    ready_by: float | None = None
    impossible: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (unset fields left out)."""
        out: dict[str, Any] = {"state": self.state, "startup_s": round(self.startup_s, 1)}
        if self.ready_by is not None:
            out["ready_by"] = round(self.ready_by, 1)
        if self.impossible is not None:
            out["impossible"] = self.impossible
        return out


def _wake_info(data: Any, where: str) -> WakeInfo:
    if not isinstance(data, dict) or data.get("state") not in ("cold", "waking"):
        raise ValueError(f"{where}.wake: expected {{state: cold|waking, startup_s: N}}")
    startup, ready_by, impossible = data.get("startup_s"), data.get("ready_by"), data.get(
        "impossible")
    if not isinstance(startup, (int, float)) or isinstance(startup, bool) or not (
            math.isfinite(startup) and startup >= 0):
        raise ValueError(f"{where}.wake.startup_s: expected seconds >= 0, got {startup!r}")
    if ready_by is not None and (not isinstance(ready_by, (int, float))
                                 or isinstance(ready_by, bool) or not math.isfinite(ready_by)):
        raise ValueError(f"{where}.wake.ready_by: expected epoch seconds, got {ready_by!r}")
    if impossible is not None and not isinstance(impossible, str):
        raise ValueError(f"{where}.wake.impossible: expected a sentence")
    return WakeInfo(data["state"], float(startup),
                    None if ready_by is None else float(ready_by), impossible)


#: what a replica may serve (the planner's roles)
ROUTE_ROLES = ("both", "prefill", "decode")


def _route_dict(r: ReplicaRoute) -> dict[str, Any]:
    out: dict[str, Any] = {"id": r.id, "url": r.url, "weight": r.weight}
    if r.role != "both":  # aggregated replicas keep the original three keys
        out["role"] = r.role
    if r.job_id is not None:
        out["job_id"] = r.job_id
    return out


@dataclass(frozen=True)
class RoutingTable:
    """A parsed routing table. ``models`` maps every configured model to its READY replicas."""

    version: int
    models: Mapping[str, tuple[ReplicaRoute, ...]]
    generated_at: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    #: models scaled to zero without a READY replica (absent: warm, or never scaled to zero)
    wake: Mapping[str, WakeInfo] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form written to disk."""
        return {
            "version": self.version,
            "generated_at": self.generated_at,
            "models": {
                name: {"replicas": [_route_dict(r) for r in reps],
                       **({"wake": self.wake[name].to_dict()} if name in self.wake else {})}
                for name, reps in self.models.items()
            },
        }


def default_table_path(deployment: Deployment) -> Path:
    """Where the daemon publishes the routing table of ``deployment`` by default."""
    return deployment.state_path / TABLE_FILE_NAME


def default_replica_key_path(deployment: Deployment) -> Path:
    """The file (mode 0600) holding the API key every replica of ``deployment`` requires."""
    return deployment.state_path / REPLICA_KEY_FILE_NAME


def default_internal_key_path(deployment: Deployment) -> Path:
    """The file (mode 0600) holding the key the daemon reads its gateway's ``/internal/*`` and
    ``/metrics`` with.

    A key of its own rather than the replica key: the replica key goes into every replica job's
    environment on the compute nodes, this one never leaves the state folder, so whoever reads
    a replica's environment reads no gateway counters. Nor a client key: the daemon needs no
    entry in the site's keys file, and one deleted there does not blind the daemon."""
    return deployment.state_path / INTERNAL_KEY_FILE_NAME


def _check_url(url: Any, where: str) -> str:
    if not isinstance(url, str):
        raise ValueError(f"{where}.url: expected a string such as 'http://host:8000'")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"{where}.url: {url!r} is not 'http://host:port' (no path)")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"{where}.url: {url!r} has an invalid port") from None
    return url.rstrip("/")


def _replica_route(rep: Any, at: str, model: str, seen: set[str]) -> ReplicaRoute:
    """One replica entry of a model's ``replicas`` list, checked; ``seen`` holds the ids
    already listed for ``model`` (raises ValueError naming ``at`` and the bad field)."""
    if not isinstance(rep, dict):
        raise ValueError(f"{at}: expected {{id, url, weight}}")
    rid = rep.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError(f"{at}.id: expected a non-empty string")
    if rid in seen:
        raise ValueError(f"{at}.id: {rid!r} listed twice for model {model!r}")
    seen.add(rid)
    weight = rep.get("weight")
    if (
        not isinstance(weight, (int, float))
        or isinstance(weight, bool)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ValueError(f"{at}.weight: expected a number > 0 (req/s), got {weight!r}")
    role = rep.get("role", "both")
    if role not in ROUTE_ROLES:
        raise ValueError(f"{at}.role: expected one of {', '.join(ROUTE_ROLES)}, got {role!r}")
    job_id = rep.get("job_id")
    if job_id is not None and (not isinstance(job_id, str) or not job_id):
        raise ValueError(f"{at}.job_id: expected a non-empty string")
    return ReplicaRoute(rid, _check_url(rep.get("url"), at), float(weight), role, job_id)


def routing_table_from_dict(data: Any, source: str = "<routing table>") -> RoutingTable:
    """Validate ``data`` (parsed JSON) into a :class:`RoutingTable`.

    Raises :class:`RoutingTableError` naming ``source`` and the first bad field.
    """
    try:
        if not isinstance(data, dict):
            raise ValueError("(top level): expected an object with version, generated_at, models")
        unknown = set(data) - {"version", "generated_at", "models"}
        if unknown:
            raise ValueError(f"(top level): unknown key(s) {sorted(unknown)}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version: expected an integer ≥ 0, got {version!r}")
        generated_at = data.get("generated_at", "")
        if not isinstance(generated_at, str):
            raise ValueError("generated_at: expected an ISO 8601 string")
        raw_models = data.get("models")
        if not isinstance(raw_models, dict):
            raise ValueError("models: expected an object mapping model name to {replicas: [...]}")
        models: dict[str, tuple[ReplicaRoute, ...]] = {}
        wake: dict[str, WakeInfo] = {}
        for name, entry in raw_models.items():
            where = f"models.{name}"
            if not isinstance(entry, dict) or not isinstance(entry.get("replicas"), list):
                raise ValueError(f"{where}: expected {{replicas: [...]}}")
            seen: set[str] = set()
            replicas = [_replica_route(rep, f"{where}.replicas[{index}]", name, seen)
                        for index, rep in enumerate(entry["replicas"])]
            models[str(name)] = tuple(replicas)
            if entry.get("wake") is not None:
                wake[str(name)] = _wake_info(entry["wake"], where)
    except ValueError as exc:
        raise RoutingTableError(f"{source}: {exc}") from None
    return RoutingTable(version=version, models=models, generated_at=generated_at, wake=wake)


def read_routing_table(path: str | os.PathLike[str]) -> RoutingTable:
    """Read and validate the routing table at ``path``.

    Raises :class:`FileNotFoundError` when there is none yet, :class:`RoutingTableError` when it
    is not valid JSON or not a valid table.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RoutingTableError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    return routing_table_from_dict(data, str(path))


def write_routing_table(path: str | os.PathLike[str], table: RoutingTable) -> None:
    """Write ``table`` to ``path`` atomically: a temporary file in the same folder, fsync, rename.

    A reader therefore sees the old table or the new one, never half of one. The table holds no
    secrets, so it is world-readable (0644) like any status file.
    """
    # Round-trip through the validator so the daemon can never publish a table the gateway rejects.
    routing_table_from_dict(table.to_dict(), str(path))
    write_atomic(path, json.dumps(table.to_dict(), indent=1, sort_keys=True) + "\n")
