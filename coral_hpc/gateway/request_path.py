"""The request path: one OpenAI request (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``) checked, routed and forwarded::

    key (401, on the head) → size (413, on the head or while reading) → JSON (400)
    → model known (404) → key may use it (403) and is within its limits (429)
    → disaggregated (prefill → decode, :mod:`~coral_hpc.gateway.disagg`) or
      a READY replica (503 + Retry-After when none; a model scaled to zero is woken instead,
      :mod:`~coral_hpc.gateway.wake`: the request is held until a replica is READY, or refused
      with 503 + Retry-After; a held stream gets its 200 head and ``: waking`` SSE comment
      lines meanwhile, and says why in an SSE error event if it cannot be served after all)
    → forward (:mod:`~coral_hpc.gateway.forward`); on a transport failure before any byte
      reached the client, mark the replica down and retry on another one (at most
      ``max_retries`` times); a replica's own 5xx answer is retried on another one too, without
      marking it down (the last answer goes back when none is left); once a stream has
      started, a failure ends it with an SSE error event.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from coral_hpc.gateway.answers import error_response
from coral_hpc.gateway.disagg import Disaggregation
from coral_hpc.gateway.forward import Forwarder, UpstreamFailed, UpstreamServerError
from coral_hpc.gateway.http_server import Request, Response, StreamResponse
from coral_hpc.gateway.metering import DemandMeter, GatewayMetrics
from coral_hpc.gateway.outcome import ANONYMOUS, Outcome
from coral_hpc.gateway.ratelimit import RateLimiter
from coral_hpc.gateway.routing import ReplicaState, Router
from coral_hpc.gateway.settings import GatewaySettings
from coral_hpc.gateway.state import GatewayState
from coral_hpc.gateway.streaming import error_event
from coral_hpc.gateway.wake import Waker

if TYPE_CHECKING:
    from coral_hpc.gateway.metering import _Children

#: OpenAI endpoints forwarded to replicas.
PROXIED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: an unknown model's name is logged cut to this many characters (it is the client's text)
MAX_LOGGED_MODEL = 200
#: what a wake found when the model woke on prefill and decode replicas (the two-hop path)
_DISAGGREGATED = object()


class RequestPath:
    """The handlers of :data:`PROXIED_PATHS`: :meth:`check_head` before the body is read,
    :meth:`handle` after (module docstring)."""

    def __init__(self, settings: GatewaySettings, state: GatewayState, router: Router,
                 meter: DemandMeter, metrics: GatewayMetrics, limiter: RateLimiter,
                 forwarder: Forwarder, disagg: Disaggregation, waker: Waker,
                 catch_up_table: Callable[[], None]) -> None:
        self.settings = settings
        self.state = state
        self.router = router
        self.meter = meter
        self.metrics = metrics
        self.limiter = limiter
        self.forwarder = forwarder
        self.disagg = disagg
        self.waker = waker
        self._catch_up_table = catch_up_table

    def check_head(self, request: Request) -> Response | None:
        """Before the body is read: the API key (401); the server checks the size after."""
        keys = self.state.keys
        if keys is not None:
            key = keys.name_for(request.headers.get("authorization"))
            if key is None:
                self.metrics.client_errors.labels("401").inc()
                return error_response(
                    401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                    "authentication_error")
            request.key = key
        return None

    async def handle(self, request: Request) -> Response | StreamResponse:
        """Check, route and forward one OpenAI request (key and size were checked on its head)."""
        key = request.key or ANONYMOUS
        parsed = self._parse(request.body)
        if isinstance(parsed, Response):
            return parsed
        payload, stream = parsed
        model = payload["model"]
        request.note = Outcome(model[:MAX_LOGGED_MODEL], stream)
        if model not in self.state.known:
            self.metrics.client_errors.labels("404").inc()
            return error_response(
                404, f"model {model!r} is not served here; GET /v1/models lists them",
                "not_found_error")
        refused = self._refused_by_key_policy(key, model)
        if refused is not None:
            return refused
        children = self.metrics.children(model, key)
        children.requests.inc()
        if not self.router.replicas(model):
            self._catch_up_table()
        if self.disagg.wants(model) or self.disagg.only_prefill_left(model):
            return await self._serve_disaggregated(request, model, payload, key, children)
        return await self._serve(request, model, payload, key, children, stream)

    def _parse(self, body: bytes) -> tuple[dict[str, Any], bool] | Response:
        """The request's JSON object and whether it asks for a stream, or the 400 that says
        what is wrong with it."""
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return self._bad_request(f"request body is not valid JSON: {exc}")
        except RecursionError:
            # the C decoder stops at the interpreter's recursion limit (~1,000 levels); no
            # OpenAI request nests more than a few levels
            return self._bad_request("request body nests JSON too deeply")
        if not isinstance(payload, dict) or not isinstance(payload.get("model"), str):
            return self._bad_request("request body must be a JSON object with a string 'model'")
        stream = payload.get("stream", False)
        if not isinstance(stream, bool):
            return self._bad_request("'stream' must be true or false")
        return payload, stream

    def _bad_request(self, message: str) -> Response:
        self.metrics.client_errors.labels("400").inc()
        return error_response(400, message, "invalid_request_error")

    def _refused_by_key_policy(self, key: str, model: str) -> Response | None:
        """403 when the key may not use ``model``; 429 (with Retry-After) when it is over its
        requests or tokens per minute (:mod:`coral_hpc.gateway.ratelimit`)."""
        keys = self.state.keys
        if keys is None:
            return None
        entry = keys.entry(key)
        if entry is None:
            return None
        if not keys.allows(key, model):
            self.metrics.client_errors.labels("403").inc()
            return error_response(403, f"API key {key!r} may not use model {model!r}; it may "
                                       f"use {', '.join(entry.models)}", "permission_error")
        if entry.rpm is None and entry.tpm is None:
            return None
        held = self.limiter.admit(key, entry.rpm, entry.tpm)
        if held is None:
            return None
        limit, wait_s = held
        self.metrics.client_errors.labels("429").inc()
        what = (f"{entry.rpm} requests" if limit == "rpm" else f"{entry.tpm} tokens")
        retry = max(1, math.ceil(wait_s))
        return error_response(429, f"API key {key!r} is over its limit of {what} per minute; "
                                   f"retry in {retry} s", "rate_limit_error",
                              headers={"Retry-After": str(retry)})

    async def _serve_disaggregated(self, request: Request, model: str, payload: dict[str, Any],
                                   key: str, children: _Children, arrived: bool = False,
                                   early: StreamResponse | None = None
                                   ) -> Response | StreamResponse:
        """Through a prefill and a decode replica (:mod:`~coral_hpc.gateway.disagg`);
        ``arrived``: its arrival is counted already (it woke the model); ``early``: a held
        stream's answer, its head out already."""
        if not arrived:
            self.meter.record_arrival(model, key)
        started = time.perf_counter()
        response = await self.disagg.serve(request, model, payload, key, children, started,
                                           early)
        children.latency.observe(time.perf_counter() - started)
        if early is not None and response is not early:
            # an error answer after the held stream's head went out: the stream says it
            return await end_early(early, error_text(response), response.status)
        return response

    def _no_replica(self, model: str, key: str, children: _Children) -> Response:
        """503 with Retry-After: no READY replica of ``model`` now (counted as rejected demand,
        which the daemon scales on)."""
        self.meter.record_arrival(model, key, rejected=True)
        children.rejected.inc()
        return error_response(503, f"model {model!r} has no READY replica now; retry later",
                              "service_unavailable",
                              headers={"Retry-After": str(self.settings.retry_after_s)})

    async def _serve(self, request: Request, model: str, payload: dict[str, Any], key: str,
                     children: _Children, stream: bool) -> Response | StreamResponse:
        """On a replica serving both phases, another one after a failure (module docstring)."""
        replica: ReplicaState | None = self.router.choose(model)
        early: StreamResponse | None = None  # a held stream's answer, begun before the hold
        if replica is not None:
            self.meter.record_arrival(model, key)
        elif not self.waker.scaled(model):
            return self._no_replica(model, key, children)
        else:
            woken = await self._wake(request, model, payload, key, children, stream)
            if not isinstance(woken, tuple):
                return woken  # refused, or served on the two-hop path
            replica, early = woken
        started = time.perf_counter()
        body = request.body
        tried: list[ReplicaState] = []
        while True:
            try:
                response = await self.forwarder.attempt(request, replica, body, payload, key,
                                                        children, started, stream, early)
                break
            except UpstreamServerError as exc:
                tried.append(replica)
                replica = self._next(model, tried)
                if replica is None:
                    response = exc.response  # every replica tried failed it: say what the last said
                    break
            except UpstreamFailed as exc:  # taken out of routing by attempt()
                tried.append(replica)
                replica = self._next(model, tried)
                if replica is None:
                    self.metrics.errors.labels(model, "upstream_failed").inc()
                    message = f"{len(tried)} replica(s) of {model!r} failed: {exc}"
                    if early is not None:
                        return await end_early(early, message, 502)
                    return error_response(502, message, "upstream_error")
            self.metrics.retries.labels(model).inc()
        children.latency.observe(time.perf_counter() - started)
        if early is not None and response is not early:
            # every replica answered an error after the held stream's head went out
            return await end_early(early, error_text(response), response.status)
        return response

    def _next(self, model: str, tried: list[ReplicaState]) -> ReplicaState | None:
        """Another replica after a failure, while retries are left."""
        if len(tried) > self.settings.max_retries:
            return None
        return self.router.choose(model, exclude=tried)

    async def _wake(self, request: Request, model: str, payload: dict[str, Any], key: str,
                    children: _Children, stream: bool
                    ) -> tuple[ReplicaState, StreamResponse | None] | Response | StreamResponse:
        """A model scaled to zero with no READY replica: wake it and hold the request until a
        replica is READY, or refuse it (:mod:`~coral_hpc.gateway.wake`). A READY replica and
        the held stream's answer when its head went out, or the request's final answer."""
        self.meter.record_arrival(model, key)
        early = tick = None
        if stream and self.waker.holds(model, request.headers):
            early = StreamResponse(status=200, headers={
                "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no"})
            tick = keepalive(request, early, model)
        try:
            found, why_not = await self.waker.replica_for(
                model, request.headers, lambda: self._woken(model), self._catch_up_table, tick)
        except ConnectionResetError:  # the client left a held stream
            self.metrics.errors.labels(model, "client_gone").inc()
            assert early is not None
            return early
        if early is not None and not early.prepared:
            early = None  # found at the first look: nothing went out, answer as usual
        if found is _DISAGGREGATED:  # woken on prefill and decode replicas
            # a held stream whose head is out gets the decode replica's events in it
            return await self._serve_disaggregated(request, model, payload, key, children,
                                                   arrived=True, early=early)
        if found is None:
            assert why_not is not None
            children.rejected.inc()
            _, message, retry = why_not
            if early is not None:  # the 200 head is out: the stream says why and ends
                return await end_early(early, message, 503)
            return error_response(503, message, "service_unavailable",
                                  headers={"Retry-After": str(retry)} if retry else None)
        assert isinstance(found, ReplicaState)
        return found, early

    def _woken(self, model: str) -> ReplicaState | object | None:
        """While a model wakes: a READY aggregated replica, :data:`_DISAGGREGATED` when its
        prefill and decode replicas can take the request, else None."""
        if self.disagg.wants(model) or self.disagg.only_prefill_left(model):
            return _DISAGGREGATED
        return self.router.choose(model)


def keepalive(request: Request, early: StreamResponse, model: str
              ) -> Callable[[], Awaitable[None]]:
    """A held stream's tick: the 200 head at first, then an SSE comment line (clients skip
    comments) saying the model is waking."""
    async def tick() -> None:
        if not early.prepared:
            await early.prepare(request)
        await early.write(f": waking {model}\n\n".encode())
    return tick


async def end_early(early: StreamResponse, message: str, status: int) -> StreamResponse:
    """End a held stream whose head went out with an SSE error event saying why."""
    try:
        await early.write(error_event(message, status))
        await early.write_eof()
    except ConnectionResetError:
        pass  # the client left while held
    return early


def error_text(response: Response | StreamResponse) -> str:
    """The message of an error answer (OpenAI's shape), or its status."""
    try:
        return str(json.loads(getattr(response, "body", b""))["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"the replica answered {response.status}"
