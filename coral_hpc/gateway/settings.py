"""The gateway's settings: everything its process needs, each tuning field with a default and a
reason. Plain data; the CLI (:mod:`coral_hpc.cli.gateway`) builds it from the configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: settings stay plain data
    from coral_hpc.gateway.wake import WakePolicy


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway process needs. Every tuning field has a default and a reason."""

    models: tuple[str, ...]                      # configured models: 503 when none READY, else 404
    table_path: Path | None = None               # the daemon's routing table
    api_keys_file: Path | None = None            # hashed client keys; None = no client auth
    #: no keys file, and its owner said so (gateway.open_on_loopback); the start refuses a
    #: gateway without keys otherwise, and this one beyond loopback
    open_on_loopback: bool = False
    #: the daemon's key for /metrics and /internal/*
    #: (:func:`~coral_hpc.gateway.table.default_internal_key_path`)
    internal_key_file: Path | None = None
    replica_key_file: Path | None = None         # the key replicas require (sent upstream)
    tls_cert: Path | None = None                 # HTTPS when set (with tls_key)
    tls_key: Path | None = None
    behind_tls_proxy: bool = False               # plain HTTP beyond loopback: a proxy does TLS
    max_body_bytes: int = 4 * 1024 * 1024        # 413 above this
    #: Connecting to a replica on the same cluster network takes milliseconds; seconds mean dead.
    connect_timeout_s: float = 3.0
    #: Longest silence from a replica before it counts as stalled. Generous: a non-streaming
    #: request sends nothing until the whole answer is done.
    read_timeout_s: float = 600.0
    max_retries: int = 2                         # other replicas tried after a transport failure
    poll_interval_s: float = 0.5                 # routing table / keys file change check
    probe_interval_s: float = 1.0                # /health of every replica
    probe_timeout_s: float = 2.0
    probe_timeouts_to_mark_down: int = 3         # consecutive late /health answers
    retry_after_s: int = 10                      # Retry-After on 503: a replica takes a while
    max_connections_per_replica: int = 1024      # one pool per replica
    #: Idle upstream connections kept per replica, each closed after ``upstream_keepalive_s``:
    #: a 3,000-request burst must not leave 3,000 sockets open. 4 s is below the 5 s after which
    #: vLLM's server (uvicorn's default) closes an idle connection itself, so a pooled
    #: connection is rarely one the replica is closing at that moment.
    max_idle_per_replica: int = 128
    upstream_keepalive_s: float = 4.0
    #: A client connection is closed when no complete request head arrives for this long: an
    #: idle keep-alive connection, or one trickling its headers (slowloris). The official
    #: clients keep idle connections for 5 s (httpx), so they rarely meet this limit.
    client_idle_timeout_s: float = 15.0
    #: The whole request body must arrive within this; slower is an attack, not a client.
    body_timeout_s: float = 30.0
    #: the access log's folder (:mod:`coral_hpc.gateway.accesslog`); None = no access log
    access_log_dir: Path | None = None
    access_log_days: float = 90.0                # retention.access_log_days
    demand_window_s: float = 10.0                # policy.demand_window_s: arrivals per window
    demand_windows: int = 20                     # policy.demand_windows: windows kept
    #: models scaled to zero: a request while none is READY wakes them (coral_hpc.gateway.wake)
    wake: dict[str, WakePolicy] = field(default_factory=dict)
    wake_dir: Path | None = None                 # where wakes are asked for (the state folder)
