"""The gateway's upstream client against real sockets: framing, keep-alive reuse, stale connections,
timeouts. (The end-to-end behaviour through the gateway is in tests/e2e/test_gateway_*.py.)"""

from __future__ import annotations

import asyncio
import time

import pytest

from coral_hpc.gateway.upstream import UpstreamError, UpstreamPool

HEADERS = b"Content-Type: application/json\r\n"


async def _serve(handler):
    """A raw TCP server answering with ``handler(reader, writer)``; returns (server, base URL)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def test_chunked_stream_is_passed_through_byte_identical_and_the_connection_reused():
    events = [b"data: {\"a\": 1}\n\n", b"data: {\"b\": 2}\n\n", b"data: [DONE]\n\n"]
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        while True:
            try:
                request = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
        writer.close()

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 2.0)
        for _ in range(2):
            conn = await pool.post("/v1/completions", HEADERS, b'{"model": "m"}')
            assert conn.status == 200 and conn.content_type == "text/event-stream"
            got = b""
            while chunk := await conn.read_chunk(2.0):
                got += chunk
            pool.release(conn)
            assert got == b"".join(events)
        pool.close()
        server.close()

    asyncio.run(main())
    assert connections == 1


def test_a_body_without_length_ends_at_eof():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\n\r\n{\"ok\": true}")
        await writer.drain()
        writer.close()

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 2.0)
        conn = await pool.post("/x", HEADERS, b"{}")
        assert await conn.read_body(2.0) == b'{"ok": true}'
        pool.release(conn)
        assert pool._idle == []     # a closed connection is never pooled
        server.close()

    asyncio.run(main())


def test_a_stale_keepalive_connection_is_retried_on_a_fresh_one():
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # the next request on this connection is read, then the connection dropped unanswered,
        # as a replica closing an idle keep-alive connection does
        try:
            await _read_request(reader)
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 2.0)
        for _ in range(3):
            conn = await pool.post("/x", HEADERS, b"{}")
            assert await conn.read_body(2.0) == b"ok"
            pool.release(conn)
        server.close()

    asyncio.run(main())
    assert connections == 3


def test_silence_longer_than_the_read_timeout_fails_and_connect_refused_fails():
    async def handler(reader, writer):
        await _read_request(reader)
        await asyncio.sleep(5)

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 0.2)
        with pytest.raises(UpstreamError, match="sent nothing for 0.2 s"):
            await pool.post("/x", HEADERS, b"{}")
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError, match="connect to"):
            await UpstreamPool(url, 2.0, 2.0).post("/x", HEADERS, b"{}")

    asyncio.run(main())


def test_a_replica_dying_mid_body_is_an_error_not_a_short_answer():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 2.0)
        conn = await pool.post("/x", HEADERS, b"{}")
        with pytest.raises(UpstreamError, match="closed by the replica"):
            await conn.read_body(2.0)
        pool.release(conn)
        assert pool._idle == []
        server.close()

    asyncio.run(main())


def _slow_accepting_server(backlog: int, accept_every_s: float):
    """A replica whose event loop is busy: a listen queue of ``backlog`` and one ``accept`` per
    ``accept_every_s``; each accepted connection answers one request at once (thread per
    connection). Returns (base URL, stop)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(backlog)
    listener.settimeout(0.1)
    stopped = threading.Event()

    def answer(sock: socket.socket) -> None:
        with sock:
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(4096)
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    def accept_loop() -> None:
        while not stopped.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=answer, args=(sock,), daemon=True).start()
            time.sleep(accept_every_s)
        listener.close()

    threading.Thread(target=accept_loop, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", stopped.set


def _listen_overflows() -> int:
    """The kernel's count of connections dropped because a listen queue was full
    (``TcpExt: ListenOverflows`` in /proc/net/netstat, this network namespace)."""
    with open("/proc/net/netstat") as netstat:
        lines = [line.split() for line in netstat if line.startswith("TcpExt:")]
    names, values = lines[0], lines[1]
    return int(values[names.index("ListenOverflows")])


@pytest.mark.parametrize("max_opening, all_answered", [(4, True), (10_000, False)])
def test_a_burst_of_new_connections_is_bounded_so_a_slow_accepting_replica_never_drops_a_syn(
        max_opening, all_answered):
    # 120 requests at once to a replica with a listen queue of 8 accepting one connection per
    # 10 ms (its event loop busy). Unbounded, the kernel drops the SYNs (or handshake ACKs)
    # beyond the queue and the requests wait for TCP retransmits past the 1.5 s connect and
    # 2.5 s read timeouts (the soak's 502s); with at most 4 connections opening at once the
    # queue never overflows and every request is answered.
    url, stop = _slow_accepting_server(backlog=8, accept_every_s=0.01)

    async def one(pool: UpstreamPool) -> bool:
        try:
            conn = await pool.post("/x", HEADERS, b"{}")
        except UpstreamError:
            return False
        try:
            return await conn.read_body(2.5) == b"ok"
        finally:
            pool.release(conn)

    async def main() -> list[bool]:
        pool = UpstreamPool(url, 1.5, 2.5, max_opening=max_opening)
        return await asyncio.gather(*(one(pool) for _ in range(120)))

    overflows_before = _listen_overflows()
    try:
        answered = asyncio.run(main())
    finally:
        stop()
    if all_answered:
        assert all(answered)
    else:
        # The control: unbounded, the setup does overflow the listen queue (the kernel counts
        # it) and requests are lost. How many are lost depends on when the retransmitted SYNs
        # land against the accept loop, so the control asserts the mechanism, not a count.
        assert _listen_overflows() > overflows_before
        assert answered.count(False) > 0


def test_pipe_hands_every_byte_to_the_sink_and_times_out_only_on_silence():
    """Piped reads: the body, byte-identical, in as many sink calls as reads; a stream whose
    events come more often than the timeout lives longer than it, silence past it fails."""
    events = [b"data: {\"n\": %d}\n\n" % i for i in range(6)]

    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.1)            # 0.6 s in all, each gap under the 0.25 s timeout
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 0.25)
        conn = await pool.post("/v1/completions", HEADERS, b"{}")
        got: list[bytes] = []
        await conn.pipe(got.append, 0.25)
        assert b"".join(got) == b"".join(events) and len(got) >= 2
        pool.release(conn)
        assert pool.idle_count == 1              # read whole: back to the pool
        server.close()

    asyncio.run(main())


def test_a_piped_stream_that_goes_silent_fails_after_the_timeout():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 2.0)
        conn = await pool.post("/x", HEADERS, b"{}")
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamError, match="sent nothing for 0.3 s"):
            await conn.pipe(got.append, 0.3)
        waited = loop.time() - started
        pool.release(conn)
        server.close()
        return got, waited

    got, waited = asyncio.run(main())
    assert got == [b"hello"] and 0.25 <= waited < 2.0


def test_a_connection_paused_as_its_answer_ended_reads_again_when_reused():
    """Found in bench/gateway_stream.py: a slow client paused the replica connection just as the
    last chunk came in; pooled while paused, its next request never got an answer."""
    async def handler(reader, writer):
        for _ in range(2):
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            await writer.drain()
        await asyncio.sleep(1)

    async def main():
        server, url = await _serve(handler)
        pool = UpstreamPool(url, 2.0, 2.0)
        conn = await pool.post("/x", HEADERS, b"{}")
        first = conn
        await conn.pipe(lambda chunk: conn.pause(), 2.0)     # the client stopped reading
        pool.release(conn)
        conn = await pool.post("/x", HEADERS, b"{}")
        assert conn is first                                 # the pooled connection
        assert await conn.read_body(2.0) == b"hello"
        pool.release(conn)
        server.close()

    asyncio.run(main())
