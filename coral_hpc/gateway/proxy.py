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
from coral_hpc.gateway.disagg import Disaggregation
from coral_hpc.gateway.http_server import (
    Request,
    Response,
    Route,
    ServerSettings,
    StreamResponse,
)
from coral_hpc.gateway.metering import DemandMeter, GatewayMetrics
from coral_hpc.gateway.ratelimit import RateLimiter
from coral_hpc.gateway.reload import Reloader
from coral_hpc.gateway.replicas import Replicas
from coral_hpc.gateway.routing import ReplicaState, Router
from coral_hpc.gateway.settings import GatewaySettings
from coral_hpc.gateway.state import GatewayState
from coral_hpc.gateway.streaming import SSEFramer, StreamUsage, error_event
from coral_hpc.gateway.tokens import count_whole_answer, estimate_prompt_tokens, usage_counts
from coral_hpc.gateway.upstream import UpstreamError

log = logging.getLogger("coral_hpc.gateway")

__all__ = ["Gateway", "GatewaySettings"]

#: OpenAI endpoints forwarded to replicas.
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
ANONYMOUS = "anonymous"
#: an unknown model's name is logged cut to this many characters (it is the client's text)
MAX_LOGGED_MODEL = 200


class _Outcome:
    """What the access log says of a proxied request beyond its status (``Request.note``)."""

    __slots__ = ("model", "stream", "replica", "prompt_tokens", "output_tokens", "estimated",
                 "error")

    def __init__(self, model: str, stream: bool) -> None:
        self.model = model
        self.stream = stream
        self.replica: ReplicaState | None = None     # the replica whose answer the client got
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.estimated: bool | None = None
        self.error: str | None = None                # what went wrong after the status was sent


class _UpstreamFailed(Exception):
    """A replica failed before any byte of its answer reached the client: safe to retry."""


class _UpstreamServerError(Exception):
    """A replica answered 5xx (nothing of it reached the client yet): try another replica.

    Seen on the real engine: after a SIGTERM that did not come through the daemon (someone's
    scancel, a preemption) vLLM's API server goes on answering ``/health`` 200 and accepting
    requests while it drains, but fails every new one with 500 ("cannot schedule new futures
    after shutdown") until the daemon notices the job has gone. Another replica answers it.
    The replica is not marked down: one request that fails everywhere must not take every
    replica of its model out of routing."""

    def __init__(self, response: Response):
        super().__init__(f"answered {response.status}")
        self.response = response


class Gateway:
    """The gateway's state and handlers. Construct, then :meth:`start` and serve
    :meth:`server_settings` (:mod:`~coral_hpc.gateway.server`); nothing starts before (no
    threads, no I/O in the constructor)."""

    #: for :mod:`coral_hpc.gateway.disagg`, which forwards through this gateway's machinery
    upstream_failed = _UpstreamFailed
    upstream_server_error = _UpstreamServerError
    error_response = staticmethod(error_response)

    def __init__(self, settings: GatewaySettings, keys: KeyChecker | None = None) -> None:
        self.settings = settings
        self.router = Router()
        self.meter = DemandMeter(window_s=settings.demand_window_s,
                                 windows_kept=settings.demand_windows)
        self.metrics = GatewayMetrics(self._ready_counts)
        self.disagg = Disaggregation(self)  # prefill → decode for disaggregated models
        self.limiter = RateLimiter()          # per-key rpm/tpm (keys file fields)
        self.state = GatewayState(frozenset(settings.models), keys)
        # headers every upstream request carries, as wire bytes (built once per key change)
        self._upstream_headers = b"Content-Type: application/json\r\n"
        self.replicas = Replicas(settings, self.router)
        self.admin = AdminRoutes(self.state, self.router, self.meter, self.metrics)
        self.files = Reloader(settings, self.state, self.router, self.replicas,
                              self._use_replica_key)
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
        """The access log's one hook (``ServerSettings.on_answered``): a line per request to the
        OpenAI routes (``/v1/…``), and per refused one (401) on any route. The metrics routes
        and ``/health``, polled every few seconds by the daemon and monitors, are not logged."""
        path = request.path
        if not path.startswith("/v1/") and status != 401:
            return
        key = request.key
        if key is None and self.state.keys is None:
            key = ANONYMOUS
        lab = self.state.keys.lab_of(key) if key is not None and self.state.keys is not None else None
        note = request.note
        latency = round(time.monotonic() - request.started, 4)
        if isinstance(note, _Outcome):
            replica = note.replica
            self.access_log.record(  # type: ignore[union-attr]
                time.time() - latency, key, lab, request.method, path, note.model, status,
                note.stream, note.prompt_tokens, note.output_tokens, note.estimated, latency,
                replica.id if replica else None, replica.job_id if replica else None,
                replica.url if replica else None, note.error)
        else:
            self.access_log.record(  # type: ignore[union-attr]
                time.time() - latency, key, lab, request.method, path, None, status, None,
                None, None, None, latency, None, None, None, None)

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

    def _use_replica_key(self, key: str) -> None:
        """Send ``key`` to every replica from now on (the replica key file changed)."""
        self._upstream_headers = (b"Content-Type: application/json\r\n"
                                  b"Authorization: Bearer " + key.encode("latin-1") + b"\r\n")

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
        request.note = _Outcome(model[:MAX_LOGGED_MODEL], stream)
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
                    response = await self._forward_stream(request, current, body, payload, key,
                                                          children, started)
                else:
                    response = await self._forward(request, current, body, payload, key)
                break
            except _UpstreamServerError as exc:
                tried.append(current)
                replica = (self.router.choose(model, exclude=tried)
                           if len(tried) <= self.settings.max_retries else None)
                if replica is None:
                    response = exc.response  # every replica tried failed it: say what the last said
                    break
                self.metrics.retries.labels(model).inc()
            except _UpstreamFailed as exc:
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

    async def _post(self, replica: ReplicaState, path: str, body: bytes, extra: bytes = b""):
        """Send the request; the pool's connection once the answer's head is in. Any transport
        failure here happened before a byte reached the client, so it is retryable."""
        try:
            pool = self.replicas.pool(replica)
        except ValueError as exc:
            raise _UpstreamFailed(str(exc)) from None
        try:
            return pool, await pool.post(path, self._upstream_headers + extra, body)
        except UpstreamError as exc:
            raise _UpstreamFailed(f"UpstreamError: {exc}") from None

    async def post_whole(self, replica: ReplicaState, path: str, body: bytes,
                         extra_headers: str = "") -> tuple[int, bytes]:
        """POST ``body`` and read the whole answer: (status, body). A transport failure raises
        :attr:`upstream_failed` (nothing has reached the client)."""
        pool, conn = await self._post(replica, path, body, extra_headers.encode("latin-1"))
        try:
            data = await conn.read_body(pool.read_timeout_s)
        except UpstreamError as exc:
            raise _UpstreamFailed(f"UpstreamError: {exc}") from None
        finally:
            pool.release(conn)
        return conn.status, data

    async def _forward(self, request: Request, replica: ReplicaState, body: bytes,
                       payload: dict, key: str) -> Response:
        pool, conn = await self._post(replica, request.path, body)
        try:
            data = await conn.read_body(pool.read_timeout_s)
        except UpstreamError as exc:
            raise _UpstreamFailed(f"UpstreamError: {exc}") from None
        finally:
            pool.release(conn)
        status = conn.status
        content_type = conn.content_type or "application/json"
        if status == 200:
            _noted(request, replica,
                   self._count_answer(replica.model, key, payload, data, replica.role))
        else:
            _noted(request, replica, None)
            self.metrics.errors.labels(replica.model, f"upstream_{status}").inc()
        response = Response(status=status, body=data, content_type=content_type)
        if status >= 500:
            raise _UpstreamServerError(response)
        return response

    def _count_answer(self, model: str, key: str, payload: dict, data: bytes,
                      role: str = "both") -> tuple[int, int, bool]:
        """Count the tokens of a whole answer; (prompt, generated, estimated)."""
        counts = count_whole_answer(payload, data)
        self._add_tokens(model, key, counts[0], counts[1], counts[2], role)
        return counts

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

    def _add_tokens(self, model: str, key: str, prompt: int, generated: int,
                    estimated: bool, role: str = "both") -> None:
        if self.state.keys is not None:
            self.limiter.spent(key, prompt + generated)
        if role == "decode":
            self.disagg.count_decoded(model, generated)
        children = self.metrics.children(model, key)
        children.prompt.inc(prompt)
        children.generated.inc(generated)
        self.meter.record_tokens(model, key, prompt, generated, estimated)

    async def _forward_stream(self, request: Request, replica: ReplicaState, body: bytes,
                              payload: dict, key: str, children, started: float
                              ) -> Response | StreamResponse:
        pool, conn = await self._post(replica, request.path, body)
        _noted(request, replica, None)   # answering: named even if the client leaves mid-way
        timeout = pool.read_timeout_s
        try:
            content_type = conn.content_type
            if conn.status != 200 or not content_type.startswith("text/event-stream"):
                # an error answer (or a replica that ignored stream=true): pass it through whole
                try:
                    data = await conn.read_body(timeout)
                except UpstreamError as exc:
                    raise _UpstreamFailed(f"UpstreamError: {exc}") from None
                if conn.status != 200:
                    self.metrics.errors.labels(replica.model, f"upstream_{conn.status}").inc()
                response = Response(status=conn.status, body=data,
                                    content_type=content_type or "application/json")
                if conn.status >= 500:
                    raise _UpstreamServerError(response)
                return response
            # Nothing reaches the client before the first chunk, so a replica that dies before
            # it can still be retried elsewhere.
            try:
                first = await conn.read_chunk(timeout)
            except UpstreamError as exc:
                raise _UpstreamFailed(f"UpstreamError: {exc}") from None
            if not first:
                raise _UpstreamFailed("the replica closed the stream before its first chunk")
            children.ttft.observe(time.perf_counter() - started)
            out = StreamResponse(status=200, headers={
                "Content-Type": content_type, "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no"})
            options = payload.get("stream_options")
            wants_usage = isinstance(options, dict) and options.get("include_usage") is True
            usage = StreamUsage(count_chunks=not wants_usage)
            framer = SSEFramer()
            failure: str | None = None

            def forward(chunk: bytes) -> None:
                # called by the upstream connection for every read: no task wakes per chunk
                block = framer.feed(chunk)
                if block:
                    usage.observe(block)
                    if out.send(block) and out.write_paused:
                        conn.pause()       # the client is not reading: neither do we

            try:
                await out.prepare(request)
                out.on_resume = conn.resume
                forward(first)
                try:
                    await conn.pipe(forward, timeout)
                except UpstreamError as exc:
                    failure = f"UpstreamError: {exc}"
                if failure is not None:
                    self.replicas.mark_down(replica, failure)
                    replica.failures += 1
                    self.metrics.errors.labels(replica.model, "stream_broken").inc()
                    if isinstance(request.note, _Outcome):  # 200 was sent; the log says more
                        request.note.error = "replica_failed_mid_stream"
                    await out.write(error_event(
                        f"replica failed mid-stream, the answer is incomplete ({failure})"))
                elif framer.pending:
                    await out.write(framer.pending)   # a last event without its blank line
                await out.write_eof()
            except ConnectionResetError:
                # the client went away: the finally below closes the upstream request
                self.metrics.errors.labels(replica.model, "client_gone").inc()
                return out
            counts = usage_counts(usage.usage)
            estimated = counts is None
            if counts is None:
                counts = (estimate_prompt_tokens(payload), usage.chunks)
            self._add_tokens(replica.model, key, counts[0], counts[1], estimated, replica.role)
            _noted(request, replica, (counts[0], counts[1], estimated))
            return out
        finally:
            # back to the pool when the answer was read whole, else closed: the replica sees the
            # request cancelled
            pool.release(conn)


def _noted(request: Request, replica: ReplicaState, counts: tuple[int, int, bool] | None) -> None:
    """Tell the access log which replica answered ``request`` and with how many tokens."""
    note = request.note
    if isinstance(note, _Outcome):
        note.replica = replica
        if counts is not None:
            note.prompt_tokens, note.output_tokens, note.estimated = counts
