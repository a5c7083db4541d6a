"""The gateway's own HTTP/1.1 server against real sockets: pipelining, 100-continue, limits,
timeouts, cancellation and flow control. (The gateway's behaviour through it, end to end, is in
tests/e2e/test_gateway_*.py.)"""

from __future__ import annotations

import asyncio
import json

from coral_hpc.gateway import http_server
from coral_hpc.gateway.http_server import (
    HttpServer,
    Request,
    Response,
    Route,
    ServerSettings,
    StreamResponse,
)


def _error(status: int, message: str, kind: str) -> Response:
    return Response(status, json.dumps({"error": {"message": message, "type": kind}}).encode())


async def _echo(request: Request) -> Response:
    return Response(body=json.dumps({"path": request.path, "body": request.body.decode(),
                                     "key": request.key}).encode())


def _check_key(request: Request) -> Response | None:
    if request.headers.get("authorization") != "Bearer good":
        return _error(401, "bad key", "authentication_error")
    request.key = "alice"
    return None


async def _start(routes: dict | None = None, **limits) -> tuple[HttpServer, int]:
    settings = ServerSettings(
        routes or {("POST", "/echo"): Route(_echo, _check_key)}, error=_error,
        max_body_bytes=limits.get("max_body_bytes", 1000),
        idle_timeout_s=limits.get("idle_timeout_s", 5.0),
        body_timeout_s=limits.get("body_timeout_s", 5.0))
    server = HttpServer(settings)
    port = await server.start("127.0.0.1", 0)
    return server, port


def _post(body: bytes, key: str = "good", extra: bytes = b"") -> bytes:
    return (b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
            + b"\r\nContent-Length: %d\r\n" % len(body) + extra + b"\r\n" + body)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return status, headers, body


def test_pipelined_requests_are_answered_in_order_on_one_connection():
    async def main():
        server, port = await _start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(_post(b"n%d" % i) for i in range(5)))
        bodies = [json.loads((await _read_answer(reader))[2])["body"] for _ in range(5)]
        writer.close()
        await server.close()
        return bodies

    assert asyncio.run(main()) == [f"n{i}" for i in range(5)]


def test_head_check_answers_before_the_body_and_keeps_the_connection():
    async def main():
        server, port = await _start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"secret", key="bad") + _post(b"after"))
        first = await _read_answer(reader)
        second = await _read_answer(reader)
        writer.close()
        await server.close()
        return first, second

    (s1, _, b1), (s2, _, b2) = asyncio.run(main())
    assert s1 == 401 and json.loads(b1)["error"]["type"] == "authentication_error"
    assert s2 == 200 and json.loads(b2) == {"path": "/echo", "body": "after", "key": "alice"}


def test_expect_100_continue_is_answered_then_the_body_is_read():
    async def main():
        server, port = await _start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n"
                     b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"body")
        answer = await _read_answer(reader)
        writer.close()
        await server.close()
        return interim, answer

    interim, (status, _, body) = asyncio.run(main())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert status == 200 and json.loads(body)["body"] == "body"


def test_limits_are_answered_with_their_status_and_the_connection_closed():
    cases = [
        (_post(b"x" * 1001), 413),                                       # Content-Length
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n" + b"1f4\r\n" + b"x" * 500 + b"\r\n"
         + b"1f4\r\n" + b"x" * 500 + b"\r\n" + b"1f4\r\n" + b"x" * 500 + b"\r\n0\r\n\r\n", 413),
        (b"POST /echo HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(200))
         + b"\r\n", 431),                                                # too many fields
        (b"POST /echo HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
        (b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
    ]

    async def one(data: bytes) -> tuple[int, bytes]:
        server, port = await _start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        status, headers, _ = await _read_answer(reader)
        rest = await asyncio.wait_for(reader.read(), 5)       # b"": the server closed
        writer.close()
        await server.close()
        assert headers.get("connection") == "close"
        return status, rest

    for data, want in cases:
        status, rest = asyncio.run(one(data))
        assert (status, rest) == (want, b""), (data[:40], status)


def test_idle_connections_close_and_a_late_body_gets_a_408(monkeypatch):
    monkeypatch.setattr(http_server, "SWEEP_INTERVAL_S", 0.05)

    async def main():
        server, port = await _start(idle_timeout_s=0.3, body_timeout_s=0.3)
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        idle_writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")     # a head never finished
        body_reader, body_writer = await asyncio.open_connection("127.0.0.1", port)
        body_writer.write(_post(b"0123456789")[:-5])                 # a body never finished
        closed = await asyncio.wait_for(idle_reader.read(), 3)
        late = await _read_answer(body_reader)
        idle_writer.close()
        body_writer.close()
        await server.close()
        return closed, late[0]

    closed, late = asyncio.run(main())
    assert closed == b"" and late == 408


def test_a_client_that_goes_away_cancels_its_handler():
    cancelled = asyncio.Event

    async def main():
        gone = cancelled()
        started = cancelled()

        async def slow(request: Request) -> Response:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                gone.set()
                raise
            return Response()

        server, port = await _start({("POST", "/echo"): Route(slow)})
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post(b"{}"))
        await asyncio.wait_for(started.wait(), 5)
        writer.close()
        await asyncio.wait_for(gone.wait(), 5)
        await server.close()
        return gone.is_set()

    assert asyncio.run(main())


def test_a_stream_waits_for_a_client_that_does_not_read():
    """A producer writing to a client that stops reading sees ``write_paused`` and is called back
    once the client reads again; nothing is lost."""
    piece = b"x" * 65536
    pieces = 64                                    # 4 MiB: far beyond the socket buffers

    async def main():
        state = {"paused": 0, "resumed": 0}

        async def produce(request: Request) -> StreamResponse:
            out = StreamResponse(headers={"Content-Type": "text/plain"})
            await out.prepare(request)
            resumed = asyncio.Event()

            def on_resume() -> None:
                state["resumed"] += 1
                resumed.set()

            out.on_resume = on_resume
            for _ in range(pieces):
                assert out.send(piece)
                if out.write_paused:
                    state["paused"] += 1
                    resumed.clear()
                    await resumed.wait()
            await out.write_eof()
            return out

        server, port = await _start({("POST", "/echo"): Route(produce)})
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        writer.transport.set_write_buffer_limits(0)
        writer.write(_post(b""))
        await asyncio.sleep(0.3)                   # not reading: the server's buffer fills
        head = await reader.readuntil(b"\r\n\r\n")
        received = 0
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            if size == 0:
                break
            received += len(await reader.readexactly(size))
            await reader.readexactly(2)
        writer.close()
        await server.close()
        return head, received, state

    head, received, state = asyncio.run(main())
    assert b"Transfer-Encoding: chunked" in head
    assert received == len(piece) * pieces
    assert state["paused"] >= 1 and state["resumed"] >= 1
