"""The gateway's HTTP application: one OpenAI-compatible endpoint in front of every model's replicas.

Request path (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``)::

    key (401, on the head) → size (413, on the head or while reading) → JSON (400) → model known (404) → a READY replica (503 + Retry-After)
    → forward; on a transport failure before any byte reached the client, mark the replica down
      and retry on another one (at most ``max_retries`` times); a replica's own 5xx answer is
      retried on another one too, without marking it down (the last answer goes back when none
      is left); once a stream has started, a failure ends it with an SSE error event.

Background tasks: a poller that reloads the routing table, the API-keys file, the internal key
and the replica key when they change (a ``stat`` per interval), and a prober that checks every replica's ``/health``
so a replica taken out after a failure comes back when it answers again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time

from coral_hpc.gateway.accesslog import AccessLog
from coral_hpc.gateway.admin import MODELS_PREFIX, AdminRoutes
from coral_hpc.gateway.answers import error_response
from coral_hpc.gateway.auth import KeyChecker
from coral_hpc.gateway.disagg import Disaggregation, PhaseMetrics
from coral_hpc.gateway.forward import Forwarder, UpstreamFailed, UpstreamServerError
from coral_hpc.gateway.http_server import (
    Request,
    Response,
    Route,
    ServerSettings,
    StreamResponse,
)
from coral_hpc.gateway.metering import DemandMeter, GatewayMetrics
from coral_hpc.gateway.outcome import ANONYMOUS, Outcome, log_answered
from coral_hpc.gateway.ratelimit import RateLimiter
from coral_hpc.gateway.reload import Reloader
from coral_hpc.gateway.replicas import Replicas
from coral_hpc.gateway.routing import ReplicaState, Router
from coral_hpc.gateway.settings import GatewaySettings
from coral_hpc.gateway.state import GatewayState
from coral_hpc.gateway.tokens import TokenAccounting

log = logging.getLogger("coral_hpc.gateway")

__all__ = ["Gateway", "GatewaySettings"]

#: OpenAI endpoints forwarded to replicas.
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: an unknown model's name is logged cut to this many characters (it is the client's text)
MAX_LOGGED_MODEL = 200


class Gateway:
    """The gateway's state and handlers. Construct, then :meth:`start` and serve
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
        self.files = Reloader(settings, self.state, self.router, self.replicas,
                              self.forwarder.use_replica_key)
        self._tasks: list[asyncio.Task] = []
        self.access_log = (AccessLog(settings.access_log_dir, settings.access_log_days)
                           if settings.access_log_dir is not None else None)

    # ------------------------------------------------------------------ app and lifecycle

    def server_settings(self) -> ServerSettings:
        """The routes and limits of the HTTP server (:mod:`coral_hpc.gateway.http_server`)."""
        routes = {("POST", path): Route(self.handle_proxy, self.check_proxy_head)
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
                              on_answered=self._answered if self.access_log else None)

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
            asyncio.create_task(self._loop(self.settings.probe_interval_s, self.replicas.probe_all)),
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

    def _answered(self, request: Request, status: int) -> None:
        """The access log's hook (:func:`~coral_hpc.gateway.outcome.log_answered`); set only
        when there is an access log."""
        log_answered(self.access_log, self.state.keys, request, status)  # type: ignore[arg-type]

    async def _loop(self, interval: float, step) -> None:
        """Run ``step`` every ``interval`` seconds; errors are logged here, at the loop boundary."""
        while True:
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gateway background step %s failed", getattr(step, "__name__", step))
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ reloading

    # ------------------------------------------------------------------ health

    def _ready_counts(self) -> dict[str, tuple[int, int]]:
        counts = {m: (0, 0) for m in self.state.known}
        for model, states in self.router.models.items():
            counts[model] = (sum(1 for s in states if s.healthy), len(states))
        return counts

    # ------------------------------------------------------------------ the proxy

    def check_proxy_head(self, request: Request) -> Response | None:
        """Before the body is read: the API key (401); the server checks the size after."""
        if self.state.keys is not None:
            key = self.state.keys.name_for(request.headers.get("authorization"))
            if key is None:
                self.metrics.client_errors.labels("401").inc()
                return error_response(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                              "authentication_error")
            request.key = key
        return None

    async def handle_proxy(self, request: Request) -> Response | StreamResponse:
        """Check, route and forward one OpenAI request (key and size were checked on its head)."""
        key = request.key or ANONYMOUS
        body = request.body
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            self.metrics.client_errors.labels("400").inc()
            return error_response(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        except RecursionError:
            # the C decoder stops at the interpreter's recursion limit (~1,000 levels); no
            # OpenAI request nests more than a few levels
            self.metrics.client_errors.labels("400").inc()
            return error_response(400, "request body nests JSON too deeply", "invalid_request_error")
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            self.metrics.client_errors.labels("400").inc()
            return error_response(400, "request body must be a JSON object with a string 'model'",
                          "invalid_request_error")
        model = payload["model"]
        stream = payload.get("stream", False)
        if not isinstance(stream, bool):
            self.metrics.client_errors.labels("400").inc()
            return error_response(400, "'stream' must be true or false", "invalid_request_error")
        request.note = Outcome(model[:MAX_LOGGED_MODEL], stream)
        if model not in self.state.known:
            self.metrics.client_errors.labels("404").inc()
            return error_response(404, f"model {model!r} is not served here; GET /v1/models lists them",
                          "not_found_error")
        refused = self._refused_by_key_policy(key, model)
        if refused is not None:
            return refused
        children = self.metrics.children(model, key)
        children.requests.inc()
        if not self.router.replicas(model):
            self.files.catch_up_table()
        if self.disagg.wants(model) or self.disagg.only_prefill_left(model):
            self.meter.record_arrival(model, key)
            started = time.perf_counter()
            response = await self.disagg.serve(request, model, payload, key, children, started)
            children.latency.observe(time.perf_counter() - started)
            return response
        replica = self.router.choose(model)
        if replica is None:
            self.meter.record_arrival(model, key, rejected=True)
            children.rejected.inc()
            return error_response(503, f"model {model!r} has no READY replica now; retry later",
                          "service_unavailable",
                          headers={"Retry-After": str(self.settings.retry_after_s)})
        self.meter.record_arrival(model, key)
        started = time.perf_counter()
        tried: list[ReplicaState] = []
        while True:
            current = replica
            current.outstanding += 1
            try:
                if stream:
                    response = await self.forwarder.forward_stream(request, current, body, payload, key,
                                                          children, started)
                else:
                    response = await self.forwarder.forward(request, current, body, payload, key)
                break
            except UpstreamServerError as exc:
                tried.append(current)
                replica = (self.router.choose(model, exclude=tried)
                           if len(tried) <= self.settings.max_retries else None)
                if replica is None:
                    response = exc.response  # every replica tried failed it: say what the last said
                    break
                self.metrics.retries.labels(model).inc()
            except UpstreamFailed as exc:
                current.failures += 1
                self.replicas.mark_down(current, str(exc))
                tried.append(current)
                replica = (self.router.choose(model, exclude=tried)
                           if len(tried) <= self.settings.max_retries else None)
                if replica is None:
                    self.metrics.errors.labels(model, "upstream_failed").inc()
                    return error_response(502, f"{len(tried)} replica(s) of {model!r} failed: {exc}",
                                  "upstream_error")
                self.metrics.retries.labels(model).inc()
            finally:
                self.replicas.done_with(current)
        children.latency.observe(time.perf_counter() - started)
        return response

    def _refused_by_key_policy(self, key: str, model: str) -> Response | None:
        """403 when the key may not use ``model``; 429 (with Retry-After) when it is over its
        requests or tokens per minute (:mod:`coral_hpc.gateway.ratelimit`)."""
        if self.state.keys is None:
            return None
        entry = self.state.keys.entry(key)
        if entry is None:
            return None
        if not self.state.keys.allows(key, model):
            self.metrics.client_errors.labels("403").inc()
            return error_response(403, f"API key {key!r} may not use model {model!r}; it may use "
                               f"{', '.join(entry.models)}", "permission_error")
        if entry.rpm is None and entry.tpm is None:
            return None
        held = self.limiter.admit(key, entry.rpm, entry.tpm)
        if held is None:
            return None
        limit, wait_s = held
        self.metrics.client_errors.labels("429").inc()
        what = (f"{entry.rpm} requests" if limit == "rpm" else f"{entry.tpm} tokens")
        retry = max(1, math.ceil(wait_s))
        return error_response(429, f"API key {key!r} is over its limit of {what} per minute; retry in "
                           f"{retry} s", "rate_limit_error", headers={"Retry-After": str(retry)})


