"""The gateway's application: its units wired together, its routes, and its background tasks.

One OpenAI-compatible endpoint in front of every model's replicas. Each unit has one job:

* :mod:`~coral_hpc.gateway.request_path`: the OpenAI routes, checked, routed and retried;
* :mod:`~coral_hpc.gateway.wake`: a request for a model scaled to zero wakes it (held or 503);
* :mod:`~coral_hpc.gateway.disagg`: the prefill → decode path of disaggregated models;
* :mod:`~coral_hpc.gateway.forward`: one request to one replica, whole or streamed;
* :mod:`~coral_hpc.gateway.replicas`: each replica's connection pool and health;
* :mod:`~coral_hpc.gateway.admin`: ``/health``, the model list, ``/metrics``, ``/internal/*``;
* :mod:`~coral_hpc.gateway.reload`: the routing table and key files, re-read when they change.

Background tasks: a poller that reloads the routing table, the API-keys file, the internal key
and the replica key when they change (a ``stat`` per interval), a prober that checks every
replica's ``/health`` so a replica taken out after a failure comes back when it answers again,
and a reaper of idle upstream connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coral_hpc.gateway.accesslog import AccessLog
from coral_hpc.gateway.admin import MODELS_PREFIX, AdminRoutes
from coral_hpc.gateway.answers import error_response
from coral_hpc.gateway.auth import KeyChecker
from coral_hpc.gateway.disagg import Disaggregation, PhaseMetrics
from coral_hpc.gateway.forward import Forwarder
from coral_hpc.gateway.http_server import Response, Route, ServerSettings
from coral_hpc.gateway.metering import DemandMeter, GatewayMetrics
from coral_hpc.gateway.outcome import AccessLogHook
from coral_hpc.gateway.ratelimit import RateLimiter
from coral_hpc.gateway.reload import Reloader
from coral_hpc.gateway.replicas import Replicas
from coral_hpc.gateway.request_path import PROXIED_PATHS, RequestPath
from coral_hpc.gateway.routing import Router
from coral_hpc.gateway.settings import GatewaySettings
from coral_hpc.gateway.state import GatewayState
from coral_hpc.gateway.tokens import TokenAccounting
from coral_hpc.gateway.wake import WakeMetrics, Waker, WakeSignal

log = logging.getLogger("coral_hpc.gateway")

__all__ = ["Gateway", "GatewaySettings"]  # GatewaySettings: where callers have imported it


class Gateway:
    """The gateway's units and lifecycle. Construct, then :meth:`start` and serve
    :meth:`server_settings` (:mod:`~coral_hpc.gateway.server`); nothing starts before (no
    threads, no I/O in the constructor)."""

    def __init__(self, settings: GatewaySettings, keys: KeyChecker | None = None) -> None:
        self.settings = settings
        self.router = Router()
        self.meter = DemandMeter(window_s=settings.demand_window_s,
                                 windows_kept=settings.demand_windows)
        self.metrics = GatewayMetrics(self._ready_counts)
        self.limiter = RateLimiter()          # per-key rpm/tpm (keys file fields)
        self.state = GatewayState(frozenset(settings.models), keys)
        self.replicas = Replicas(settings, self.router)
        phases = PhaseMetrics(self.metrics.registry)
        self.tokens = TokenAccounting(self.state, self.limiter, self.metrics, self.meter,
                                      phases.count_decoded)
        self.forwarder = Forwarder(self.replicas, self.metrics, self.tokens)
        # prefill → decode for disaggregated models
        self.disagg = Disaggregation(self.router, self.forwarder, self.metrics, phases,
                                     settings.max_retries)
        self.admin = AdminRoutes(self.state, self.router, self.meter, self.metrics)
        # models scaled to zero: their requests wake them (held, or 503 with Retry-After)
        self.waker = Waker(dict(settings.wake), WakeSignal(settings.wake_dir),
                           WakeMetrics(self.metrics.registry), settings.retry_after_s)
        self.files = Reloader(settings, self.state, self.router, self.replicas,
                              self.forwarder.use_replica_key, self.waker)
        self.request_path = RequestPath(settings, self.state, self.router, self.meter,
                                        self.metrics, self.limiter, self.forwarder, self.disagg,
                                        self.waker, self.files.catch_up_table)
        self._tasks: list[asyncio.Task[None]] = []
        self.access_log = (AccessLog(settings.access_log_dir, settings.access_log_days)
                           if settings.access_log_dir is not None else None)
        # the server's on_answered: a line per request when there is an access log
        self._answered = (AccessLogHook(self.access_log, self.state)
                          if self.access_log is not None else None)

    def server_settings(self) -> ServerSettings:
        """The routes and limits of the HTTP server (:mod:`coral_hpc.gateway.http_server`)."""
        proxied = self.request_path
        routes = {("POST", path): Route(proxied.handle, proxied.check_head)
                  for path in PROXIED_PATHS}
        admin = self.admin
        routes.update({
            ("GET", "/v1/models"): Route(admin.handle_models),
            ("GET", "/health"): Route(admin.handle_health),
            ("GET", "/metrics"): Route(admin.handle_metrics),
            ("GET", "/internal/demand"): Route(admin.handle_demand),
            ("GET", "/internal/routing"): Route(admin.handle_routing),
        })
        s = self.settings
        return ServerSettings(routes, error=self._server_error, max_body_bytes=s.max_body_bytes,
                              idle_timeout_s=s.client_idle_timeout_s,
                              body_timeout_s=s.body_timeout_s,
                              prefix_routes={("GET", MODELS_PREFIX): Route(admin.handle_model)},
                              on_answered=self._answered)

    def _server_error(self, status: int, message: str, kind: str) -> Response:
        """An error the HTTP server answers itself (400, 404, 408, 413, 431, …), counted."""
        if status < 500:
            self.metrics.client_errors.labels(str(status)).inc()
        return error_response(status, message, kind)

    async def start(self) -> None:
        """Open the access log, load the files and start the poller, the prober and the
        idle-connection reaper."""
        if self.access_log is not None:
            self.access_log.open()
        self.files.reload()
        await self.replicas.start()
        self._tasks = [
            asyncio.create_task(self._loop(self.settings.poll_interval_s, self.files.reload)),
            asyncio.create_task(self._loop(self.settings.probe_interval_s,
                                           self.replicas.probe_all)),
            asyncio.create_task(self._loop(1.0, self.replicas.reap_idle)),
        ]

    async def stop(self) -> None:
        """Stop the background tasks and close every upstream connection."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.replicas.stop()
        if self.access_log is not None:
            self.access_log.close()

    async def _loop(self, interval: float, step: Callable[[], object]) -> None:
        """Run ``step`` every ``interval`` seconds; errors are logged here, at the loop boundary."""
        while True:
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gateway background step %s failed",
                              getattr(step, "__name__", step))
            await asyncio.sleep(interval)

    def _ready_counts(self) -> dict[str, tuple[int, int]]:
        """(healthy, in the table) replicas per known model, for the readiness gauges."""
        counts = {m: (0, 0) for m in self.state.known}
        for model, states in self.router.models.items():
            counts[model] = (sum(1 for s in states if s.healthy), len(states))
        return counts
