"""The gateway's HTTP/1.1 server: an asyncio protocol over the llhttp parser (``httptools``).

Why not aiohttp's server: at 10k req/s its per-request machinery (request, response and payload
objects, the router and middleware chain, a task, timers and a writer per request) was 38 % of the
gateway's CPU (bench/results/gateway.md), and with 1,000 open SSE streams each chunk went through
its payload writer. The gateway answers a handful of fixed paths, reads whole JSON bodies of at
most a few MiB and writes whole answers or chunked SSE: this module does exactly that, as the
upstream client (:mod:`coral_hpc.gateway.upstream`) does on the other side.

What it keeps of a hardened server (the gateway's tests hold it to each):

* a connection whose next request head is not complete within ``idle_timeout_s`` of opening or
  of the previous answer is closed (idle keep-alive and slowloris alike);
* the body must arrive within ``body_timeout_s`` (else 408 and close); over ``max_body_bytes``
  is a 413, by ``Content-Length`` before reading or while reading a chunked body;
* request heads over :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` fields are a 431, malformed
  ones a 400, and the connection is closed;
* ``Expect: 100-continue`` is answered once the head passed its checks;
* a client that disconnects cancels its handler (which closes the upstream request);
* pipelined requests are answered in order; an SSE answer respects the client's flow control.

Deadlines are checked by one sweep per second over every connection, not a timer per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import httptools

log = logging.getLogger("coral_hpc.gateway")

#: Largest request head (request line and header fields), like aiohttp's and nginx's 8 KiB lines
#: but for the whole head: an OpenAI request head is a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024
#: Most header fields in one request head.
MAX_HEADERS = 100
#: Pipelined requests parsed ahead of the answer being written before reading is paused.
MAX_PIPELINED = 16
#: How often deadlines are checked; a timeout fires within this of its due time.
SWEEP_INTERVAL_S = 0.5

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_INF = float("inf")


class Request:
    """One request, head and whole body, as a handler gets it."""

    __slots__ = ("method", "path", "headers", "body", "remote", "content_length", "key", "_conn",
                 "started", "note")

    def __init__(self, method: str, path: str, headers: dict[str, str], remote: str,
                 conn: HttpConnection, started: float = 0.0) -> None:
        self.method = method
        self.path = path
        self.headers = headers              # lower-case names → value (a repeated name: last)
        self.body = b""
        self.remote = remote
        self.key: str | None = None         # the client's API-key name, set by a head check
        self._conn = conn
        self.started = started              # time.monotonic() when the head was complete
        self.note: object = None            # what the handler tells ServerSettings.on_answered
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None


class Response:
    """A whole answer."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int = 200, body: bytes = b"",
                 content_type: str = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = {"Content-Type": content_type}
        if headers:
            self.headers.update(headers)

    def encode(self, keep_alive: bool) -> bytes:
        """Status line, headers and body, ready for the socket."""
        head = [b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\nDate: %s\r\n" % (
            self.status, _REASONS.get(self.status, b"Unknown"), len(self.body), _http_date())]
        for name, value in self.headers.items():
            head.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        if not keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        head.append(self.body)
        return b"".join(head)


class StreamResponse:
    """An answer written as it is produced (chunked transfer encoding): :meth:`prepare`, then
    :meth:`write` per piece, then :meth:`write_eof`. A write to a client that went away raises
    :class:`ConnectionResetError`."""

    __slots__ = ("status", "headers", "_conn", "finished")

    @property
    def _connection(self) -> HttpConnection:
        conn = self._conn
        assert conn is not None, "prepare() first"
        return conn

    #: called when a client that was not reading reads again (see :meth:`send`)
    @property
    def on_resume(self) -> Callable[[], None] | None:
        return self._connection.on_resume

    @on_resume.setter
    def on_resume(self, callback: Callable[[], None] | None) -> None:
        self._connection.on_resume = callback

    @property
    def prepared(self) -> bool:
        """The status line and headers have gone out (:meth:`prepare`)."""
        return self._conn is not None

    @property
    def write_paused(self) -> bool:
        """The client's socket buffer is full: stop producing until :attr:`on_resume`."""
        return self._connection.write_paused

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers or {})
        self._conn: HttpConnection | None = None
        self.finished = False

    async def prepare(self, request: Request) -> None:
        """Send the status line and headers."""
        conn = self._conn = request._conn
        head = [b"HTTP/1.1 %d %s\r\nTransfer-Encoding: chunked\r\nDate: %s\r\n" % (
            self.status, _REASONS.get(self.status, b"Unknown"), _http_date())]
        for name, value in self.headers.items():
            head.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        if not conn.keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        conn.write(b"".join(head))

    async def write(self, data: bytes) -> None:
        """Send ``data`` as one chunk; waits while the client is not reading."""
        if not data:
            return
        conn = self._connection
        conn.write(b"%x\r\n%b\r\n" % (len(data), data))
        if conn.write_paused:
            await conn.drain()

    def send(self, data: bytes) -> bool:
        """Send ``data`` as one chunk without waiting (for protocol callbacks, which cannot);
        False when the client has gone. The caller watches :attr:`write_paused`."""
        conn = self._connection
        if conn.closed:
            return False
        conn.write(b"%x\r\n%b\r\n" % (len(data), data))
        return True

    async def write_eof(self) -> None:
        """End the answer."""
        if not self.finished:
            self.finished = True
            self._connection.write(b"0\r\n\r\n")


Handler = Callable[[Request], Awaitable["Response | StreamResponse"]]
#: Checks a request head before its body is read: an answer (401, 413, …) or None to go on.
HeadCheck = Callable[[Request], "Response | None"]


class Route:
    """What a (method, path) is answered by."""

    __slots__ = ("handler", "check_head")

    def __init__(self, handler: Handler, check_head: HeadCheck | None = None) -> None:
        self.handler = handler
        self.check_head = check_head


class ServerSettings:
    """The server's limits, and how it answers its own errors.

    ``routes`` match a whole path; ``prefix_routes`` (method, prefix ending in ``/``) match any
    longer path under the prefix (``/v1/models/{id}``), looked up only when no whole path
    matched, so the fixed paths cost one dict lookup as before.

    ``on_answered(request, status)`` is called once per request whose head was parsed, when its
    answer has been written (a stream: when it ended) or the client went away before (status
    499): whoever answered it, a handler, a head check or the server itself (404, 408, 413, …).
    It runs on the event loop and must be quick (the access log only queues a tuple)."""

    def __init__(self, routes: dict[tuple[str, str], Route], *,
                 error: Callable[[int, str, str], Response], max_body_bytes: int,
                 idle_timeout_s: float, body_timeout_s: float,
                 prefix_routes: dict[tuple[str, str], Route] | None = None,
                 on_answered: Callable[[Request, int], None] | None = None) -> None:
        self.routes = routes
        self.paths = {path for _, path in routes}
        self.prefix_routes = dict(prefix_routes or {})
        self.error = error                  # (status, message, kind) → a counted error answer
        self.max_body_bytes = max_body_bytes
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        self.on_answered = on_answered


#: status of a request whose client went away before its answer was complete (nginx's)
CLIENT_GONE = 499


def _prefix_route(settings: ServerSettings, method: str, path: str) -> Route | None:
    for (m, prefix), route in settings.prefix_routes.items():
        if m == method and path.startswith(prefix) and len(path) > len(prefix):
            return route
    return None


def _under_prefix(settings: ServerSettings, path: str) -> bool:
    return any(path.startswith(prefix) and len(path) > len(prefix)
               for _, prefix in settings.prefix_routes)


_date_cache: list = [0, b""]


def _http_date() -> bytes:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True).encode()
    return _date_cache[1]


class _Answered(Exception):
    """A head check answered the request and its body is not worth reading: answer, close."""

    def __init__(self, answer: Response) -> None:
        super().__init__(answer.status)
        self.answer = answer


class _Reject(Exception):
    """A request head or body the server answers itself, then closes the connection."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class HttpConnection(asyncio.Protocol):
    """One client connection: parse, check, dispatch one request at a time, answer in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._settings = server.settings
        self._loop = server.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self.remote = ""
        self.closed = False
        self.keep_alive = True
        self.write_paused = False
        self._drain: asyncio.Future | None = None
        self.on_resume: Callable[[], None] | None = None   # a producer paused on our buffer
        self._task: asyncio.Task | None = None   # the request being answered
        # parsed and waiting: (route, request, the answer a head check gave or None)
        self._pipeline: deque[tuple[Route, Request, Response | None]] = deque()
        self._read_paused = False
        self.deadline = 0.0                 # when the current wait (head or body) times out
        self._waiting_body = False
        self._new_message()

    def _new_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._request: Request | None = None
        self._route: Route | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._early: Response | None = None  # answered from the head; the body is skipped

    @property
    def _transport(self) -> asyncio.Transport:
        transport = self.transport
        assert transport is not None  # asyncio calls connection_made before anything else
        return transport

    # -- transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP server's: it reads, writes
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else ""
        self.deadline = self._loop.time() + self._settings.idle_timeout_s
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.connections.discard(self)
        self._pipeline.clear()   # never answered, so never logged: the client did not wait
        if self._task is not None and not self._task.done():
            self._task.cancel()             # the client went away: stop the upstream request
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_resume is not None:
            self.on_resume()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Answered):
                self._send_and_close(cause.answer)
            elif isinstance(cause, _Reject):
                self._reject(cause.status, str(cause), cause.kind)
            else:
                self._reject(400, f"malformed HTTP request: {exc}")

    # -- parser callbacks
    def on_message_begin(self) -> None:
        self._new_message()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if len(self._headers) >= MAX_HEADERS:
            raise _Reject(431, f"more than {MAX_HEADERS} header fields")
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _Reject(431, f"request head over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        settings = self._settings
        parser = self._parser
        self.keep_alive = parser.should_keep_alive()
        url = self._url
        query = url.find(b"?")
        path = (url if query < 0 else url[:query]).decode("latin-1")
        method = parser.get_method().decode("latin-1")
        request = self._request = Request(method, path, self._headers, self.remote, self,
                                          time.monotonic())
        route = settings.routes.get((method, path))
        if route is None and settings.prefix_routes:
            route = _prefix_route(settings, method, path)
        if route is None:
            if path in settings.paths or _under_prefix(settings, path):
                raise _Reject(405, f"method {method} is not allowed on {path}")
            raise _Reject(404, f"no such path {path}", "not_found_error")
        self._route = route
        limit = settings.max_body_bytes
        expects = request.headers.get("expect", "").lower() == "100-continue"
        if route.check_head is not None:
            answer = route.check_head(request)
            if answer is not None:
                if expects or (request.content_length or 0) > limit:
                    raise _Answered(answer)             # the body is not worth reading
                else:
                    self._early = answer                # answered once the body is read past
        if request.content_length is not None and request.content_length > limit:
            raise _Reject(413, f"request body over {limit} bytes")
        if expects:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._waiting_body = True
        if self._task is None:
            # the body must come within the body timeout; the idle deadline is over
            self.deadline = self._loop.time() + settings.body_timeout_s

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._settings.max_body_bytes:
            raise _Reject(413, f"request body over {self._settings.max_body_bytes} bytes")
        if self._early is None:
            self._body.append(body)

    def on_message_complete(self) -> None:
        request = self._request
        route = self._route
        # httptools calls this only after on_headers_complete, which set both
        assert request is not None and route is not None
        self._request = None                # handed on: a later reject is not this request's
        self._waiting_body = False
        if self._early is None:
            body = self._body
            request.body = body[0] if len(body) == 1 else b"".join(body)
        if self._task is not None or self._pipeline:
            # pipelined behind an answer still being written
            self._pipeline.append((route, request, self._early))
            if len(self._pipeline) > MAX_PIPELINED and not self._read_paused:
                self._read_paused = True
                self._transport.pause_reading()
            return
        self._start(route, request, self._early)

    # -- answering
    def _answered(self, request: Request, status: int) -> None:
        hook = self._settings.on_answered
        if hook is not None:
            try:
                hook(request, status)
            except Exception:
                log.exception("on_answered for %s %s failed", request.method, request.path)

    def _start(self, route: Route, request: Request, early: Response | None) -> None:
        if early is not None:
            self._transport.write(early.encode(self.keep_alive))
            self._answered(request, early.status)
            self._done()
            return
        self.deadline = _INF
        self._task = self._loop.create_task(self._answer(route, request))

    async def _answer(self, route: Route, request: Request) -> None:
        try:
            response = await route.handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            self._answered(request, CLIENT_GONE)   # the client went away
            return
        except Exception:
            log.exception("gateway handler for %s %s failed", request.method, request.path)
            response = self._settings.error(500, "internal gateway error", "internal_error")
            self.keep_alive = False
        self._task = None
        if self.closed:
            self._answered(request, CLIENT_GONE)
            return
        self.on_resume = None
        if isinstance(response, Response):
            self._transport.write(response.encode(self.keep_alive))
            self._answered(request, response.status)
        else:
            if not response.finished:
                self.keep_alive = False     # a stream that did not end cleanly: close
            self._answered(request, response.status if response.finished else CLIENT_GONE)
        self._done()

    def _done(self) -> None:
        """The answer is out: close, or answer the next pipelined request, or wait for one."""
        if not self.keep_alive:
            self.close()
            return
        if self._pipeline:
            route, request, early = self._pipeline.popleft()
            if self._read_paused and len(self._pipeline) <= MAX_PIPELINED:
                self._read_paused = False
                self._transport.resume_reading()
            self._start(route, request, early)
            return
        if not self._waiting_body:
            self.deadline = self._loop.time() + self._settings.idle_timeout_s
        else:
            self.deadline = self._loop.time() + self._settings.body_timeout_s

    def _reject(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send_and_close(self._settings.error(status, message, kind))

    def _send_and_close(self, response: Response) -> None:
        if self.closed or self._transport.is_closing():
            return
        self.keep_alive = False
        self._pipeline.clear()
        if self._task is not None:
            # an answer is still being written: it must not be cut by this one; just close
            self.close()
            return
        self._transport.write(response.encode(keep_alive=False))
        if self._request is not None:       # a request whose head was parsed: answered now
            self._answered(self._request, response.status)
            self._request = None
        self.close()

    def sweep(self, now: float) -> None:
        """Called about every :data:`SWEEP_INTERVAL_S`: close a connection past its deadline."""
        if now < self.deadline or self.closed or self._task is not None:
            return
        if self._waiting_body:
            self._reject(408, f"request body not received within "
                              f"{self._settings.body_timeout_s:g} s")
        else:
            self.close()                    # idle, or a head trickling in (slowloris)

    # -- for answers
    def write(self, data: bytes) -> None:
        """Write to the client; raises :class:`ConnectionResetError` once it has gone."""
        if self.closed:
            raise ConnectionResetError("the client closed the connection")
        self._transport.write(data)

    async def drain(self) -> None:
        """Wait until the client reads again."""
        if not self.write_paused:
            return
        self._drain = self._loop.create_future()
        try:
            await self._drain
        finally:
            self._drain = None

    def close(self) -> None:
        """Close the connection (what was written is still sent)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class HttpServer:
    """A listening socket and its connections."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.connections: set[HttpConnection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self, host: str, port: int, ssl_context=None, backlog: int = 2048) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._server = await self.loop.create_server(
            lambda: HttpConnection(self), host, port, ssl=ssl_context, backlog=backlog,
            reuse_address=True)
        self._sweeper = self.loop.create_task(self._sweep())
        return self._server.sockets[0].getsockname()[1]

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = self.loop.time()
            for conn in list(self.connections):
                conn.sweep(now)

    async def close(self) -> None:
        """Stop listening, close every connection and cancel their handlers."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
