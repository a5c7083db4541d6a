"""Forwarding one request to one replica, whole or streamed, and counting its answer's tokens.

A failure before any byte reached the client raises :class:`UpstreamFailed` (the caller may try
another replica, and :meth:`Forwarder.attempt` takes this one out of routing); a replica's own
5xx answer raises :class:`UpstreamServerError` (another replica may answer; this one stays in).
Once a stream has started, a failure ends it with an SSE error event and takes the replica out.
Which replica to try, and how often, is the caller's choice (:mod:`~coral_hpc.gateway.request_path`,
:mod:`~coral_hpc.gateway.disagg`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from coral_hpc.gateway.http_server import Request, Response, StreamResponse
from coral_hpc.gateway.metering import GatewayMetrics
from coral_hpc.gateway.outcome import Outcome, noted
from coral_hpc.gateway.replicas import Replicas
from coral_hpc.gateway.routing import ReplicaState
from coral_hpc.gateway.streaming import SSEFramer, StreamUsage, error_event
from coral_hpc.gateway.tokens import (
    TokenAccounting,
    count_whole_answer,
    estimate_prompt_tokens,
    usage_counts,
)
from coral_hpc.gateway.upstream import UpstreamError, UpstreamPool

if TYPE_CHECKING:  # types only: the connection class is the upstream client's own
    from coral_hpc.gateway.metering import _Children
    from coral_hpc.gateway.upstream import _Connection

_BASE_HEADERS = b"Content-Type: application/json\r\n"


class UpstreamFailed(Exception):
    """A replica failed before any byte of its answer reached the client: safe to retry."""


class UpstreamServerError(Exception):
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


class Forwarder:
    """Sends requests to replicas through their pools (:class:`~coral_hpc.gateway.replicas.
    Replicas`) and charges the answers' tokens (:class:`~coral_hpc.gateway.tokens.
    TokenAccounting`)."""

    def __init__(self, replicas: Replicas, metrics: GatewayMetrics,
                 tokens: TokenAccounting) -> None:
        self.replicas = replicas
        self.metrics = metrics
        self.tokens = tokens
        # headers every upstream request carries, as wire bytes (built once per key change)
        self._headers = _BASE_HEADERS

    def use_replica_key(self, key: str) -> None:
        """Send ``key`` to every replica from now on (the replica key file changed)."""
        self._headers = _BASE_HEADERS + b"Authorization: Bearer " + key.encode("latin-1") + b"\r\n"

    async def attempt(self, request: Request, replica: ReplicaState, body: bytes,
                      payload: dict[str, Any], key: str, children: _Children, started: float,
                      stream: bool, early: StreamResponse | None = None
                      ) -> Response | StreamResponse:
        """Forward to ``replica``, counted as outstanding meanwhile; a transport failure takes
        it out of routing before :class:`UpstreamFailed` goes on to the caller. ``early``: a
        held stream's answer whose head went out while its model woke (streams only)."""
        replica.outstanding += 1
        try:
            if stream:
                return await self.forward_stream(request, replica, body, payload, key, children,
                                                 started, early)
            return await self.forward(request, replica, body, payload, key)
        except UpstreamFailed as exc:
            replica.failures += 1
            self.replicas.mark_down(replica, str(exc))
            raise
        finally:
            self.replicas.done_with(replica)

    async def _post(self, replica: ReplicaState, path: str, body: bytes, extra: bytes = b""
                    ) -> tuple[UpstreamPool, _Connection]:
        """Send the request; the pool's connection once the answer's head is in. Any transport
        failure here happened before a byte reached the client, so it is retryable."""
        try:
            pool = self.replicas.pool(replica)
        except ValueError as exc:
            raise UpstreamFailed(str(exc)) from None
        try:
            return pool, await pool.post(path, self._headers + extra, body)
        except UpstreamError as exc:
            raise UpstreamFailed(f"UpstreamError: {exc}") from None

    async def post_whole(self, replica: ReplicaState, path: str, body: bytes,
                         extra_headers: str = "") -> tuple[int, bytes]:
        """POST ``body`` to ``replica`` (counted as outstanding meanwhile) and read the whole
        answer: (status, body). A transport failure takes the replica out of routing and raises
        :class:`UpstreamFailed` (nothing has reached the client)."""
        replica.outstanding += 1
        try:
            pool, conn = await self._post(replica, path, body, extra_headers.encode("latin-1"))
            try:
                data = await _read_body(conn, pool.read_timeout_s)
            finally:
                pool.release(conn)
        except UpstreamFailed as exc:
            replica.failures += 1
            self.replicas.mark_down(replica, str(exc))
            raise
        finally:
            self.replicas.done_with(replica)
        return conn.status, data

    async def forward(self, request: Request, replica: ReplicaState, body: bytes,
                      payload: dict[str, Any], key: str) -> Response:
        """Forward a request whose answer is not streamed; the replica's answer, as it came."""
        pool, conn = await self._post(replica, request.path, body)
        try:  # read here, not through _read_body: the hot path, one coroutine fewer
            data = await conn.read_body(pool.read_timeout_s)
        except UpstreamError as exc:
            raise UpstreamFailed(f"UpstreamError: {exc}") from None
        finally:
            pool.release(conn)
        status = conn.status
        content_type = conn.content_type or "application/json"
        if status == 200:
            counts = count_whole_answer(payload, data)
            self.tokens.add(replica.model, key, *counts, role=replica.role)
            noted(request, replica, counts)
        else:
            noted(request, replica, None)
            self.metrics.errors.labels(replica.model, f"upstream_{status}").inc()
        response = Response(status=status, body=data, content_type=content_type)
        if status >= 500:
            raise UpstreamServerError(response)
        return response

    async def forward_stream(self, request: Request, replica: ReplicaState, body: bytes,
                             payload: dict[str, Any], key: str, children: _Children,
                             started: float, early: StreamResponse | None = None
                             ) -> Response | StreamResponse:
        """Forward a streamed request: its events as they come, or the replica's answer whole
        when it is an error (or the replica ignored ``stream: true``). The events go into
        ``early`` when a held stream's head went out already."""
        pool, conn = await self._post(replica, request.path, body)
        noted(request, replica, None)   # answering: named even if the client leaves mid-way
        try:
            if conn.status != 200 or not conn.content_type.startswith("text/event-stream"):
                return await self._pass_through(replica, conn, pool.read_timeout_s)
            # Nothing reaches the client before the first chunk, so a replica that dies before
            # it can still be retried elsewhere.
            first = await _first_chunk(conn, pool.read_timeout_s)
            children.ttft.observe(time.perf_counter() - started)
            return await self._relay(request, replica, conn, pool.read_timeout_s, first,
                                     payload, key, early)
        finally:
            # back to the pool when the answer was read whole, else closed: the replica sees the
            # request cancelled
            pool.release(conn)

    async def _pass_through(self, replica: ReplicaState, conn: _Connection,
                            timeout: float) -> Response:
        """An error answer (or a replica that ignored stream=true), whole; a 5xx raises."""
        data = await _read_body(conn, timeout)
        if conn.status != 200:
            self.metrics.errors.labels(replica.model, f"upstream_{conn.status}").inc()
        response = Response(status=conn.status, body=data,
                            content_type=conn.content_type or "application/json")
        if conn.status >= 500:
            raise UpstreamServerError(response)
        return response

    async def _relay(self, request: Request, replica: ReplicaState, conn: _Connection,
                     timeout: float, first: bytes, payload: dict[str, Any], key: str,
                     early: StreamResponse | None = None) -> StreamResponse:
        """Relay the stream's events to the client from ``first`` on, then charge its tokens;
        into ``early`` when given (its head is out: the model woke while the stream was held)."""
        out = early if early is not None else StreamResponse(status=200, headers={
            "Content-Type": conn.content_type, "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no"})
        options = payload.get("stream_options")
        wants_usage = isinstance(options, dict) and options.get("include_usage") is True
        usage = StreamUsage(count_chunks=not wants_usage)
        framer = SSEFramer()

        def forward(chunk: bytes) -> None:
            # called by the upstream connection for every read: no task wakes per chunk
            block = framer.feed(chunk)
            if block:
                usage.observe(block)
                if out.send(block) and out.write_paused:
                    conn.pause()       # the client is not reading: neither do we

        try:
            if out is not early:  # a held stream's head went out before the hold
                await out.prepare(request)
            out.on_resume = conn.resume
            forward(first)
            try:
                await conn.pipe(forward, timeout)
            except UpstreamError as exc:
                await self._broken(request, replica, out, f"UpstreamError: {exc}")
            else:
                if framer.pending:
                    await out.write(framer.pending)   # a last event without its blank line
            await out.write_eof()
        except ConnectionResetError:
            # the client went away: the caller's finally closes the upstream request
            self.metrics.errors.labels(replica.model, "client_gone").inc()
            return out
        self._charge_stream(request, replica, payload, key, usage)
        return out

    async def _broken(self, request: Request, replica: ReplicaState, out: StreamResponse,
                      failure: str) -> None:
        """The replica failed mid-stream: out of routing, and the client is told in an SSE
        error event (its 200 has gone)."""
        self.replicas.mark_down(replica, failure)
        replica.failures += 1
        self.metrics.errors.labels(replica.model, "stream_broken").inc()
        if isinstance(request.note, Outcome):  # 200 was sent; the log says more
            request.note.error = "replica_failed_mid_stream"
        await out.write(error_event(
            f"replica failed mid-stream, the answer is incomplete ({failure})"))

    def _charge_stream(self, request: Request, replica: ReplicaState, payload: dict[str, Any],
                       key: str, usage: StreamUsage) -> None:
        """Charge a finished stream's tokens: its ``usage`` event, else estimated."""
        counts = usage_counts(usage.usage)
        estimated = counts is None
        if counts is None:
            counts = (estimate_prompt_tokens(payload), usage.chunks)
        self.tokens.add(replica.model, key, counts[0], counts[1], estimated, role=replica.role)
        noted(request, replica, (counts[0], counts[1], estimated))


async def _read_body(conn: _Connection, timeout: float) -> bytes:
    """The whole answer body; a transport failure is :class:`UpstreamFailed`."""
    try:
        return await conn.read_body(timeout)
    except UpstreamError as exc:
        raise UpstreamFailed(f"UpstreamError: {exc}") from None


async def _first_chunk(conn: _Connection, timeout: float) -> bytes:
    """The stream's first chunk; none (or a transport failure) is :class:`UpstreamFailed`."""
    try:
        first = await conn.read_chunk(timeout)
    except UpstreamError as exc:
        raise UpstreamFailed(f"UpstreamError: {exc}") from None
    if not first:
        raise UpstreamFailed("the replica closed the stream before its first chunk")
    return first
