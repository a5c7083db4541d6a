"""The daemon's own Prometheus endpoint, behind the same keys as its gateway's ``/metrics``.

prometheus_client's ``start_http_server`` answers anyone who can connect, and on a login node
that is everyone logged in, loopback included. This server asks for ``Authorization: Bearer
<key>``: one of the gateway's client keys (``gateway.api_keys_file``, re-read when it changes; a
deleted file revokes them all) or the daemon's internal key. Without a keys file
(``gateway.open_on_loopback``) it is open, and then it listens on loopback only. Beyond
loopback the keys would cross the network: it serves HTTPS with the gateway's certificate, or
plain HTTP only when the site's TLS-terminating proxy is in front (``gateway.behind_tls_proxy``).
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from coral_hpc.config import Deployment
from coral_hpc.errors import PermanentError
from coral_hpc.gateway.auth import KeyChecker, KeysFileError, hash_key, is_loopback, read_keys_file
from coral_hpc.gateway.tls import server_context

log = logging.getLogger("coral_hpc.daemon")

_UNAUTHORIZED = (b'{"error": {"message": "missing or invalid API key: send \'Authorization: '
                 b'Bearer <key>\'", "type": "authentication_error"}}')


class MetricsAccess:
    """Who may read the daemon's metrics: a client key of ``api_keys_file`` or the key in
    ``internal_key_file``; everyone when ``api_keys_file`` is None (open_on_loopback)."""

    def __init__(self, api_keys_file: Path | None, internal_key_file: Path | None) -> None:
        self.api_keys_file = api_keys_file
        self.internal_key_file = internal_key_file
        self._lock = threading.Lock()   # the server answers each request in a thread
        self._stamp: tuple[int, int, int] | None = None
        self._keys = KeyChecker([])

    def _client_keys(self) -> KeyChecker:
        assert self.api_keys_file is not None
        try:
            st = os.stat(self.api_keys_file)
        except FileNotFoundError:
            # fail closed, as the gateway does: deleting the file revokes every key
            self._stamp, self._keys = None, KeyChecker([])
            return self._keys
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._keys = KeyChecker(read_keys_file(self.api_keys_file))
            except KeysFileError as exc:
                log.error("%s (the daemon's metrics keep the previous keys)", exc)
            self._stamp = stamp
        return self._keys

    def _internal_digest(self) -> str | None:
        if self.internal_key_file is None:
            return None
        try:
            key = self.internal_key_file.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return hash_key(key) if key else None

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header value may read the metrics."""
        if self.api_keys_file is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        internal = self._internal_digest()
        if internal and scheme.lower() == "bearer" and token.strip() and hmac.compare_digest(
                hash_key(token.strip()), internal):
            return True
        with self._lock:
            return self._client_keys().name_for(authorization) is not None


def access_for(deployment: Deployment, internal_key_file: Path | None) -> MetricsAccess:
    """The :class:`MetricsAccess` of ``deployment``'s keys (its gateway's) and the internal key."""
    keys = deployment.gateway.api_keys_file
    return MetricsAccess(Path(keys).expanduser() if keys else None, internal_key_file)


def guarded_app(registry: CollectorRegistry, access: MetricsAccess) -> Callable[..., Any]:
    """prometheus_client's WSGI app behind :meth:`MetricsAccess.allows` (401 otherwise)."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not access.allows(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("Content-Type", "application/json"),
                                                ("WWW-Authenticate", "Bearer")])
            return [_UNAUTHORIZED]
        return metrics_app(environ, start_response)

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True   # a scrape in flight does not hold the daemon's exit


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6   # --metrics [::1]:9100


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Scrapes every few seconds are not worth a log line each."""


def check_metrics_listen(host: str, deployment: Deployment) -> None:
    """Refuse a metrics address that would let others in: beyond loopback without keys, or with
    keys but neither TLS nor the site's TLS proxy (the keys would travel in clear)."""
    gateway = deployment.gateway
    if is_loopback(host):
        return
    if gateway.api_keys_file is None:
        raise PermanentError(
            f"--metrics host {host!r} is reachable from other machines, but without "
            "gateway.api_keys_file the daemon's metrics ask for no key "
            "(gateway.open_on_loopback opens loopback only): use --metrics 127.0.0.1:0, or set "
            "gateway.api_keys_file"
        )
    if gateway.tls_cert is None and not gateway.behind_tls_proxy:
        raise PermanentError(
            f"--metrics host {host!r} is reachable from other machines and API keys would cross "
            "the network in clear: set gateway.tls_cert and gateway.tls_key (the daemon's "
            "metrics serve HTTPS with them), or use --metrics 127.0.0.1:0"
        )


def start_metrics_server(host: str, port: int, registry: CollectorRegistry,
                         deployment: Deployment,
                         internal_key_file: Path | None) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``host:port`` (port 0 picks one) behind the deployment's keys, in a
    thread; the server (``server_port``, ``shutdown()``) and its thread."""
    check_metrics_listen(host, deployment)
    app = guarded_app(registry, access_for(deployment, internal_key_file))
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    gateway = deployment.gateway
    if not is_loopback(host) and gateway.tls_cert and gateway.tls_key:
        context = server_context(Path(gateway.tls_cert), Path(gateway.tls_key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
