"""A lean HTTP/1.1 client for the gateway's upstream requests: one keep-alive pool per replica.

Why not aiohttp's client: at 10k req/s its per-request machinery (request and response objects,
timers, URL handling, cookie and redirect support the gateway never uses) was the largest CPU cost
of the gateway. The gateway only ever sends a POST with a JSON body to a replica it knows, and
reads a status, a Content-Type and a body (whole, or chunk by chunk for SSE). That is an asyncio
protocol and the llhttp parser (``httptools``, the one uvicorn uses), nothing more.

Failures raise :class:`UpstreamError` and say whether any response byte had arrived; a connection
reused from the pool that fails before answering is retried once on a fresh connection (the replica
had closed an idle keep-alive connection, which says nothing about its health).

New connections are opened at most ``max_opening`` at a time per replica (see
:data:`MAX_OPENING`): a burst must not flood a replica's listen queue, where Linux drops the SYN
and the connect then waits for retransmits at 1 s and 3 s — past the connect timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

#: New connections per replica that may be *opening* at once: connected but not yet answered, so
#: possibly still in the replica's accept queue. Half of the 128-connection listen backlog of
#: aiohttp's server (the sim engine's) — vLLM's uvicorn allows 2048 — so our own burst never
#: overflows it. Measured: ~2,000 unbounded connects to two aiohttp replicas gave 90 connect
#: timeouts (502) in the hour soak of bench/results/gateway_soak.md.
MAX_OPENING = 64
#: A connection stops counting as opening when the replica's first byte arrives or after this
#: long: a replica slower than this to answer is generating (vLLM sends a non-streamed answer's
#: head only when it is done), and holding its slot longer would cap a burst of long requests
#: at ``MAX_OPENING`` per answer time. 1 s is Linux's initial SYN retransmit timeout: a queue that
#: overflowed still costs no more than one retransmit.
OPENING_GRACE_S = 1.0


class UpstreamError(Exception):
    """The request failed in transport (connect, timeout, a broken or malformed answer)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica, answering one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False               # has answered a request before (it came from the pool)
        self._answered: asyncio.Future | None = None   # see :meth:`wait_answer_started`
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = ""
        self._header_name = b""
        self._read_to_eof = True        # neither Content-Length nor chunked: the body ends at EOF
        self.headers_done = False
        self.complete = False
        self.got_bytes = False
        self.keep_alive = True
        self._chunks: deque[bytes] = deque()
        self._error: str | None = None
        self._waiter: asyncio.Future | None = None
        self._paused = False
        self._buffered = 0
        self._may_pause = False         # only a chunk-by-chunk reader drains the buffer
        self._sink: Callable[[bytes], None] | None = None   # see :meth:`pipe`
        self.last_read = 0.0            # loop time of the last bytes (piped reads time out on it)

    # -- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's: reads, writes

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._answer_started()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the replica tried to upgrade the connection")
        except httptools.HttpParserError as exc:
            self._fail(f"malformed answer from the replica: {exc}")
        sink = self._sink
        if sink is not None:
            self.last_read = self._loop.time()
            if self._chunks:
                # everything this read brought, in one piece: one write downstream
                chunks = self._chunks
                chunk = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                sink(chunk)
            return
        # flow control: a client reading slowly must not let a fast replica fill our memory
        if (self._may_pause and not self._paused and self._buffered > 1 << 20
                and self.transport is not None):
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.complete and self._read_to_eof and exc is None:
            self.complete = True
            self.keep_alive = False
            self._wake()
            return
        if not self.complete:
            self._fail(f"connection closed by the replica ({exc or 'EOF'})")

    # -- parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lower == b"content-length" or (lower == b"transfer-encoding"
                                            and b"chunked" in value.lower()):
            self._read_to_eof = False

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return                    # an interim answer; the real one follows
        self.status = status
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._sink is None:
            self._wake()

    def on_message_complete(self) -> None:
        if not self.headers_done:
            return
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # -- helpers
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _answer_started(self) -> None:
        answered = self._answered
        if answered is not None and not answered.done():
            answered.set_result(None)

    def _fail(self, why: str) -> None:
        if self._error is None:
            self._error = why
        self._answer_started()
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()
        self._wake()

    async def _wait(self, timeout: float) -> None:
        if self._error is not None:
            raise UpstreamError(self._error)
        self._waiter = waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout, self._on_timeout, waiter, timeout)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self._error is not None:
            raise UpstreamError(self._error)

    def _on_timeout(self, waiter: asyncio.Future, timeout: float) -> None:
        if not waiter.done():
            self._fail(f"the replica sent nothing for {timeout:g} s")

    # -- request API
    def send(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None  # sent on a connection the pool opened
        if self._paused:
            # paused for the previous answer's slow client, as its last bytes came in
            transport.resume_reading()
        self._reset()
        transport.write(data)

    async def wait_answer_started(self, timeout: float) -> None:
        """Wait until the first answer byte, a failure, or ``timeout``; never raises (the
        caller's :meth:`read_head` reports failures)."""
        if self.got_bytes or self._error is not None:
            return
        self._answered = answered = self._loop.create_future()
        try:
            await asyncio.wait((answered,), timeout=timeout)
        finally:
            self._answered = None

    async def read_head(self, timeout: float) -> None:
        """Wait until the status line and headers have arrived."""
        while not self.headers_done:
            await self._wait(timeout)

    async def read_chunk(self, timeout: float) -> bytes:
        """Every piece of the body that has arrived (waiting for one), ``b""`` at its end.
        Pieces that queued up while the caller was busy come back as one: a gateway that falls
        behind then forwards them in one write instead of paying per piece."""
        self._may_pause = True
        while not self._chunks:
            if self.complete:
                return b""
            await self._wait(timeout)
        if len(self._chunks) == 1:
            chunk = self._chunks.popleft()
        else:
            chunk = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered -= len(chunk)
        if self._paused and not self._chunks and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def pipe(self, sink: Callable[[bytes], None], timeout: float) -> None:
        """Hand every piece of the body to ``sink`` as it arrives, from the protocol's own
        callback (no task wakes per piece: at 1,000 streams that was most of a chunk's cost),
        and return once the body is complete. Raises :class:`UpstreamError` on a failure or
        after ``timeout`` s without a byte; ``sink`` may call :meth:`pause` and
        :meth:`resume` for flow control."""
        self._sink = sink
        self._may_pause = False
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        if self._chunks:
            chunk = b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            sink(chunk)
        self.last_read = self._loop.time()
        if self._error is not None:
            raise UpstreamError(self._error)
        if self.complete:
            return
        self._waiter = waiter = self._loop.create_future()
        # one timer for the whole body, pushed back lazily: no timer per piece
        timer = self._loop.call_later(timeout, self._on_pipe_timer, waiter, timeout)
        self._pipe_timer = timer
        try:
            await waiter
        finally:
            self._pipe_timer.cancel()
            self._waiter = None
            self._sink = None
        if self._error is not None:
            raise UpstreamError(self._error)

    def _on_pipe_timer(self, waiter: asyncio.Future, timeout: float) -> None:
        if waiter.done():
            return
        silent = self._loop.time() - self.last_read
        if silent >= timeout:
            self._fail(f"the replica sent nothing for {timeout:g} s")
        else:
            self._pipe_timer = self._loop.call_later(timeout - silent, self._on_pipe_timer,
                                                     waiter, timeout)

    def pause(self) -> None:
        """Stop reading from the replica (the client is not reading)."""
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        """Read from the replica again."""
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    async def read_body(self, timeout: float) -> bytes:
        """The whole body."""
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        while not self.complete:
            await self._wait(timeout)
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    def close(self) -> None:
        self.closed = True
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections to one replica (``base_url``, e.g. ``http://host:port``)."""

    def __init__(self, base_url: str, connect_timeout_s: float, read_timeout_s: float,
                 max_connections: int = 1024, keepalive_s: float = 4.0,
                 max_idle: int = 128, max_opening: int = MAX_OPENING,
                 opening_grace_s: float = OPENING_GRACE_S) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"replica URL {base_url!r}: only http://host:port is supported")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._host_header = parts.netloc.encode("latin-1")
        self._prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle
        self._idle: list[_Connection] = []   # oldest first; taken from the end (warmest)
        self._slots = asyncio.Semaphore(max_connections)
        self._opening = asyncio.Semaphore(max_opening)
        self.opening_grace_s = opening_grace_s
        self._heads: dict[tuple[str, bytes], bytes] = {}
        self.closed = False

    def request_head(self, path: str, extra_headers: bytes, length: int) -> bytes:
        """The request line and headers, built once per (path, headers) and reused."""
        key = (path, extra_headers)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) > 64:
                self._heads.clear()
            head = self._heads[key] = (
                b"POST " + (self._prefix + path).encode("latin-1") + b" HTTP/1.1\r\nHost: "
                + self._host_header + b"\r\n" + extra_headers + b"Content-Length: "
            )
        return head + str(length).encode() + b"\r\n\r\n"

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self.host, self.port),
                self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamError(f"connect to {self.host}:{self.port} timed out after "
                                f"{self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise UpstreamError(f"connect to {self.host}:{self.port} failed: {exc}") from None
        return conn

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def post(self, path: str, extra_headers: bytes, body: bytes) -> _Connection:
        """Send ``body`` to ``path``; return the connection once the answer's head has arrived.
        The caller reads the body, then calls :meth:`release` (always, in a ``finally``)."""
        await self._slots.acquire()
        try:
            data = self.request_head(path, extra_headers, len(body)) + body
            conn = self._take_idle()
            if conn is not None and await self._send_reused(conn, data):
                return conn
            conn = await self._open(data)
            try:
                await conn.read_head(self.read_timeout_s)
            except BaseException:
                conn.close()
                raise
            return conn
        except BaseException:
            self._slots.release()
            raise

    async def _send_reused(self, conn: _Connection, data: bytes) -> bool:
        """Send on a pooled connection and wait for the head: False when the connection was
        stale (closed before any answer byte: the caller opens a fresh one)."""
        conn.send(data)
        try:
            await conn.read_head(self.read_timeout_s)
            return True
        except BaseException as exc:
            conn.close()
            if conn.got_bytes or not isinstance(exc, UpstreamError):
                raise
            return False

    async def _open(self, data: bytes) -> _Connection:
        """A new connection with ``data`` sent on it, opened within the :data:`MAX_OPENING`
        bound: its slot is held until the answer starts or the grace passes. A connection
        another request gave back while this one waited for a slot is used instead."""
        while True:
            async with self._opening:
                conn = self._take_idle()
                if conn is None:
                    conn = await self._connect()
                    conn.send(data)
                    try:
                        await conn.wait_answer_started(self.opening_grace_s)
                    except BaseException:       # cancelled: the client went away
                        conn.close()
                        raise
                    return conn
            if await self._send_reused(conn, data):
                return conn

    def release(self, conn: _Connection) -> None:
        """Give ``conn`` back: to the pool when its answer was read whole, else closed (which
        tells the replica the request was abandoned)."""
        self._slots.release()
        if (conn.complete and conn.keep_alive and not conn.closed and not self.closed
                and len(self._idle) < self.max_idle):
            conn.used = True
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    @property
    def idle_count(self) -> int:
        """Connections kept open for the next request."""
        return len(self._idle)

    def reap(self, now: float | None = None) -> int:
        """Close idle connections older than ``keepalive_s`` (and any the replica closed); returns
        how many. Called every second: without it a burst leaves its connections open for good."""
        now = time.monotonic() if now is None else now
        keep = [c for c in self._idle if not c.closed and now - c.idle_since < self.keepalive_s]
        closed = len(self._idle) - len(keep)
        if closed:
            for conn in self._idle:
                if conn.closed or now - conn.idle_since >= self.keepalive_s:
                    conn.close()
            self._idle = keep
        return closed

    def close(self) -> None:
        """Close idle connections; connections in use close when released."""
        self.closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
