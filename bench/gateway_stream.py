#!/usr/bin/env python3
"""Streaming through the gateway against peers, in one run: SSE chunks per second on one core and
the delay each chunk picks up in the proxy, at 100 and 1,000 concurrent streams.

Every proxy (``coral-hpc gateway``, nginx with ``proxy_buffering off``, vLLM's Rust
``vllm-router``) is pinned to ONE core with ``taskset`` and forwards ``POST /v1/completions`` with
``stream: true`` to the same canned streaming upstream; the upstream and the load generator (this
script, ``gen`` and ``upstream`` roles, asyncio + uvloop) share the other core. ``direct`` is the
load generator talking to the upstream with no proxy: the baseline the "added" figures subtract.

The upstream answers each request with vLLM-shaped ``text_completion`` SSE events, one HTTP chunk
(one write) per event, each carrying the ``time.monotonic_ns()`` at which it was written (field
``"t"``; CLOCK_MONOTONIC is one clock for every process of the machine), then ``data: [DONE]``.
The request's prompt says how to pace it: ``interval_ms=0`` sends events back to back (yielding to
other streams between events), ``interval_ms=40`` one every 40 ms (25 tokens/s, a vLLM replica's
decode speed under load). Two measurements per system and concurrency:

* **saturation** (interval 0, 200 events per stream, each finished stream replaced at once):
  chunks/s delivered, and the proxy's own CPU seconds (user+system from /proc) → chunks per
  CPU-second, the one-core capacity, which stays meaningful when the load generator or other work
  on the machine is the limit (flagged when the proxy used < 90 % of its core);
* **paced** (interval 40 ms, 100 events per stream, phases spread at random): per chunk, the time
  from the upstream's write to the generator's read, p50/p99; "added" is the proxy's percentile
  minus direct's.

Writes bench/results/gateway_stream.json and .md. Needs nginx and vllm-router as bench/gateway.py
does (``--install`` to fetch them).

Usage: .venv/bin/python bench/gateway_stream.py [--duration 8] [--install]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from array import array
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

RESULTS = REPO / "bench" / "results"
STREAMS = (100, 1000)
#: Paced: ms between events of one stream. 40 ms (25 tokens/s) is a vLLM replica's decode speed
#: under load; at 1,000 streams 100 ms (10 tokens/s, a large batch decodes each stream slower),
#: which also keeps the generator's shared core below saturation (10k events/s).
PACED_INTERVAL_MS = {100: 40, 1000: 100}
GOAL_RATE_OVER_ROUTER = 0.5
GOAL_ADDED_P99_MS = 1.0

# ----------------------------------------------------------------------------- upstream role

_EVENT_HEAD = (b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,'
               b'"model":"bench","choices":[{"index":0,"text":" tok","logprobs":null,'
               b'"finish_reason":null,"stop_reason":null}],"t":')
_DONE = b"data: [DONE]\n\n"
_INTERVAL_RE = re.compile(rb"interval_ms=(\d+)")
_EVENTS_RE = re.compile(rb'"max_tokens"\s*:\s*(\d+)')


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class _Scheduler:
    """Writes the events of every open stream: back to back, one event per stream per round
    (saturation), or on a 1 ms timer wheel (paced). One writer for all streams keeps the
    upstream's cost per event to one ``write``, so it outpaces the proxies on its core."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.busy: list[_UpstreamConn] = []           # saturation streams
        self.wheel: dict[int, list[_UpstreamConn]] = {}
        self.pumping = False
        self.tick_ms: int | None = None

    def add(self, conn: _UpstreamConn) -> None:
        if conn.interval_ms == 0:
            self.busy.append(conn)
            if not self.pumping:
                self.pumping = True
                self.loop.call_soon(self._pump)
        else:
            now_ms = int(self.loop.time() * 1000)
            self.wheel.setdefault(now_ms + conn.interval_ms, []).append(conn)
            if self.tick_ms is None:
                self.tick_ms = now_ms
                self.loop.call_at((now_ms + 1) / 1000, self._tick)

    def _pump(self) -> None:
        for conn in self.busy:
            if not conn.paused and conn.remaining:
                conn.send_event()
        self.busy = [c for c in self.busy if c.remaining and not c.closed]
        if self.busy:
            self.loop.call_soon(self._pump)
        else:
            self.pumping = False

    def _tick(self) -> None:
        now_ms = int(self.loop.time() * 1000)
        for slot in range(self.tick_ms + 1, now_ms + 1):
            for conn in self.wheel.pop(slot, ()):
                if conn.closed or not conn.remaining:
                    continue
                conn.send_event()
                if conn.remaining:
                    self.wheel.setdefault(slot + conn.interval_ms, []).append(conn)
        self.tick_ms = now_ms
        if self.wheel:
            self.loop.call_at((now_ms + 1) / 1000, self._tick)
        else:
            self.tick_ms = None


class _UpstreamConn(asyncio.Protocol):
    """One keep-alive connection of the canned upstream."""

    scheduler: _Scheduler

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.remaining = 0
        self.interval_ms = 0
        self.paused = False
        self.closed = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            if not head.startswith(b"POST"):
                payload = b'{"status":"ok","data":[{"id":"bench","object":"model"}]}'
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
                continue
            match = _INTERVAL_RE.search(body)
            self.interval_ms = int(match.group(1)) if match else 0
            match = _EVENTS_RE.search(body)
            self.remaining = int(match.group(1)) if match else 100
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
            self.scheduler.add(self)

    def send_event(self) -> None:
        self.remaining -= 1
        event = _chunk(_EVENT_HEAD + b"%d}\n\n" % time.monotonic_ns())
        if not self.remaining:
            event += _chunk(_DONE) + b"0\r\n\r\n"
        self.transport.write(event)  # type: ignore[union-attr]


async def upstream_main(port: int) -> None:
    loop = asyncio.get_running_loop()
    _UpstreamConn.scheduler = _Scheduler(loop)
    server = await loop.create_server(_UpstreamConn, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# ----------------------------------------------------------------------------- generator role


class _StreamClient(asyncio.Protocol):
    """One client connection: sends a streaming request, counts events, records delays (in
    ``delays``: the proxied or the control group's)."""

    def __init__(self, gen: _Generator, delays: array | None = None) -> None:
        self.gen = gen
        self.delays = gen.delays if delays is None else delays
        self.transport: asyncio.Transport | None = None
        self.tail = b""
        self.done: asyncio.Future | None = None
        self.saw_done = False
        self.head_pending = True
        self.ok = True

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def start(self, request: bytes) -> asyncio.Future:
        self.done = asyncio.get_running_loop().create_future()
        self.tail = b""
        self.saw_done = False
        self.head_pending = True
        self.transport.write(request)  # type: ignore[union-attr]
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buf = self.tail + data if self.tail else data
        if self.head_pending:
            if len(buf) < 12:
                self.tail = buf
                return
            self.head_pending = False
            if not buf.startswith(b"HTTP/1.1 200"):
                # an error answer instead of a stream: count it, drop the connection
                self.gen.errors[buf[:12].decode("latin-1")] = \
                    self.gen.errors.get(buf[:12].decode("latin-1"), 0) + 1
                self.transport.close()  # type: ignore[union-attr]
                return
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.tail = buf
            # the chunked terminator may come in a read of its own, after [DONE]
            if self.saw_done and buf.endswith(b"0\r\n\r\n"):
                self._finish(True)
            return
        complete, self.tail = buf[:cut + 2], buf[cut + 2:]
        gen = self.gen
        if gen.measuring:
            count = complete.count(b'"t":')
            if self.delays is gen.delays:
                gen.events += count
            if gen.record_delays and count:
                delays = self.delays
                at = complete.find(b'"t":')
                while at >= 0:
                    end = complete.find(b"}", at)
                    delays.append(now - int(complete[at + 4:end]))
                    at = complete.find(b'"t":', end)
        if not self.saw_done and b"[DONE]" in complete:
            self.saw_done = True
        if self.saw_done and self.tail.endswith(b"0\r\n\r\n"):
            self._finish(True)

    def _finish(self, ok: bool) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(ok)

    def connection_lost(self, exc) -> None:
        self.ok = False
        if not self.saw_done:
            self.gen.broken += 1
        self._finish(self.saw_done)


class _Generator:
    def __init__(self, record_delays: bool) -> None:
        self.measuring = False
        self.record_delays = record_delays
        self.events = 0
        self.broken = 0
        self.errors: dict[str, int] = {}
        self.streams_done = 0
        self.delays = array("q")
        self.control_delays = array("q")    # direct streams of the same run


def _percentiles(delays: array) -> dict:
    ordered = sorted(delays)

    def pick(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

    return {"delay_p50_ms": round(pick(0.50), 3), "delay_p90_ms": round(pick(0.90), 3),
            "delay_p99_ms": round(pick(0.99), 3), "delay_p999_ms": round(pick(0.999), 3),
            "delay_samples": len(ordered)}


async def gen_main(port: int, streams: int, interval_ms: int, events: int, duration: float,
                   warmup: float, control_port: int = 0, control_streams: int = 0) -> dict:
    loop = asyncio.get_running_loop()
    gen = _Generator(record_delays=interval_ms > 0)
    body = json.dumps({"model": "bench", "prompt": f"interval_ms={interval_ms}",
                       "max_tokens": events, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
               b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    stop_at = loop.time() + warmup + duration

    async def slot(to_port: int, delays: array) -> None:
        if interval_ms:
            await asyncio.sleep(random.uniform(0, interval_ms / 1000))   # spread the phases
        client = None
        while loop.time() < stop_at:
            if client is None or not client.ok:
                _, client = await loop.create_connection(lambda: _StreamClient(gen, delays),
                                                         "127.0.0.1", to_port)
            if await client.start(request) and delays is gen.delays:
                gen.streams_done += 1

    tasks = [asyncio.create_task(slot(port, gen.delays)) for _ in range(streams)]
    # the control group: streams straight to the upstream, paced alike, read by this same
    # process at the same time, so the generator's and the upstream's delays (and the host's
    # load) are the same for both groups and the difference is the proxy's
    tasks += [asyncio.create_task(slot(control_port, gen.control_delays))
              for _ in range(control_streams)]
    await asyncio.sleep(warmup)
    gen.measuring = True
    started = time.monotonic()
    await asyncio.sleep(duration)
    gen.measuring = False
    elapsed = time.monotonic() - started
    events_seen = gen.events
    await asyncio.wait(tasks, timeout=30)
    result = {"streams": streams, "interval_ms": interval_ms, "events": events_seen,
              "seconds": round(elapsed, 3), "chunks_per_s": round(events_seen / elapsed),
              "streams_completed": gen.streams_done, "streams_broken": gen.broken,
              "error_answers": gen.errors}
    if gen.delays:
        result.update(_percentiles(gen.delays))
    if gen.control_delays:
        result["control"] = {"streams": control_streams, **_percentiles(gen.control_delays)}
    return result


def _run_loop(coro):
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


# ----------------------------------------------------------------------------- orchestration


#: Streams of the control group (straight to the upstream) in each paced run through a proxy.
CONTROL_STREAMS = {100: 25, 1000: 100}
#: The real-time priority a proxy gets for the isolation run (``chrt -f``): it then runs whenever
#: it is runnable, so other work on its core cannot delay it; what remains of the added delay is
#: the proxy's own.
RT_PRIORITY = 50


def run_gen(args, port: int, streams: int, interval_ms: int, events: int,
            control_streams: int = 0, realtime: bool = False) -> dict:
    prefix = ["chrt", "-f", str(RT_PRIORITY)] if realtime else []
    argv = [*prefix, "taskset", "-c", args.load_cores, sys.executable, __file__, "gen",
            "--port", str(port),
            "--streams", str(streams), "--interval-ms", str(interval_ms), "--events", str(events),
            "--duration", str(args.duration)]
    if control_streams:
        argv += ["--control-port", str(args.upstream_port),
                 "--control-streams", str(control_streams)]
    out = subprocess.run(argv, check=False, capture_output=True, text=True,
                         timeout=args.duration + 120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"generator printed no result: {out.stdout[-500:]} {out.stderr[-2000:]}")
    return json.loads(line[7:])


def _session_pids(pgid: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def runqueue_wait_s(pgid: int) -> float:
    """Seconds the threads of session ``pgid`` spent runnable but waiting for a CPU (the second
    field of /proc/PID/task/TID/schedstat): the time other work on the core took from them."""
    total = 0
    for pid in _session_pids(pgid):
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def set_realtime(pgid: int, on: bool) -> None:
    """Every thread of session ``pgid`` to SCHED_FIFO ``RT_PRIORITY`` (or back to normal)."""
    for pid in _session_pids(pgid):
        argv = (["chrt", "-a", "-f", "-p", str(RT_PRIORITY), str(pid)] if on
                else ["chrt", "-a", "-o", "-p", "0", str(pid)])
        subprocess.run(argv, check=False, capture_output=True)


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def paced_run(args, port: int, streams: int, pgid: int | None, realtime: bool = False
              ) -> dict:
    """One paced run; through a proxy with its control group, the host's load, the proxy's CPU
    per chunk and how long it waited for a CPU."""
    from gateway import session_cpu_s

    interval = PACED_INTERVAL_MS[streams]
    events = 60 if interval >= 100 else 100
    load_before = _loadavg()
    cpu_before = session_cpu_s(pgid) if pgid else 0.0
    wait_before = runqueue_wait_s(pgid) if pgid else 0.0
    paced = run_gen(args, port, streams, interval, events,
                    CONTROL_STREAMS[streams] if pgid else 0, realtime=realtime)
    paced["loadavg_before"], paced["loadavg_after"] = load_before, _loadavg()
    if pgid:
        window = args.duration + 1.5
        cpu = session_cpu_s(pgid) - cpu_before
        paced["proxy_cpu_us_per_chunk"] = round(cpu * 1e6 / max(1, paced["events"]) * (
            args.duration / window), 1)
        paced["proxy_core_busy"] = round(cpu / window, 3)
        paced["proxy_runqueue_wait_ms_per_s"] = round(
            (runqueue_wait_s(pgid) - wait_before) * 1e3 / window, 1)
        control = paced.get("control")
        if control:
            paced["added_p50_ms"] = round(paced["delay_p50_ms"] - control["delay_p50_ms"], 3)
            paced["added_p99_ms"] = round(paced["delay_p99_ms"] - control["delay_p99_ms"], 3)
    return paced


def measure(name: str, port: int, args, pgid: int | None) -> dict:
    from gateway import session_cpu_s

    out: dict = {}
    run_gen(args, port, 50, 0, 50)                              # warm-up: pools, caches
    for streams in STREAMS:
        before = session_cpu_s(pgid) if pgid else 0.0
        sat = run_gen(args, port, streams, 0, 200)
        if pgid:
            cpu = session_cpu_s(pgid) - before
            # the generator's run includes its warm-up second and the drain at the end, so the
            # CPU counted here covers more chunks than the measured window: scale by time
            window = args.duration + 1.0 + 0.5
            sat["proxy_cpu_s"] = round(cpu, 3)
            sat["proxy_core_busy"] = round(cpu / window, 3)
            sat["chunks_per_cpu_s"] = round(sat["chunks_per_s"] * window / cpu) if cpu else None
        paced = paced_run(args, port, streams, pgid)
        out[str(streams)] = {"saturation": sat, "paced": paced}
        print(f"{name:12s} streams {streams:5d}: {sat['chunks_per_s']:8d} chunks/s "
              f"(cpu-normalised {sat.get('chunks_per_cpu_s', '-')}, core busy "
              f"{sat.get('proxy_core_busy', '-')}) | paced {paced['chunks_per_s']} chunks/s, "
              f"delay p50 {paced.get('delay_p50_ms')} ms p99 {paced.get('delay_p99_ms')} ms, "
              f"added p99 {paced.get('added_p99_ms')} ms, run-queue wait "
              f"{paced.get('proxy_runqueue_wait_ms_per_s')} ms/s, load {paced['loadavg_before']}"
              f" | broken {sat['streams_broken'] + paced['streams_broken']}", flush=True)
        if pgid and streams == max(STREAMS) and args.realtime:
            # the same paced run with the proxy, the upstream and the generator at real-time
            # priority: other work can delay none of them, and what is left is the proxy's own
            set_realtime(pgid, True)
            set_realtime(args.upstream_pgid, True)
            try:
                rt = paced_run(args, port, streams, pgid, realtime=True)
            finally:
                set_realtime(pgid, False)
                set_realtime(args.upstream_pgid, False)
            out[str(streams)]["paced_realtime"] = rt
            print(f"{name:12s} streams {streams:5d} at SCHED_FIFO: delay p99 "
                  f"{rt.get('delay_p99_ms')} ms, added p99 {rt.get('added_p99_ms')} ms, run-queue "
                  f"wait {rt.get('proxy_runqueue_wait_ms_per_s')} ms/s", flush=True)
    return out


def main_bench(args) -> None:
    from gateway import (
        Procs,
        ensure_tools,
        ensure_vllm_router,
        free_port,
        start_coral_gateway,
        start_nginx_proxy,
        start_vllm_router,
        wait_port,
    )

    ncpu = os.cpu_count() or 1
    if args.load_cores is None:
        args.load_cores = ",".join(str(c) for c in range(ncpu) if str(c) != args.proxy_core) \
            or args.proxy_core
    ensure_tools(args.install)
    router_bin, router_version = ensure_vllm_router(args.vllm_router_venv, args.install)
    procs = Procs()
    work = Path(tempfile.mkdtemp(prefix="coral-bench-stream-"))
    results: dict = {}
    notes: dict = {}
    load_start = Path("/proc/loadavg").read_text().strip()
    try:
        up_port = free_port()
        upstream = procs.start(["taskset", "-c", args.load_cores, sys.executable, __file__,
                                "upstream", "--port", str(up_port)], work / "upstream.log")
        args.upstream_pgid = upstream.pid
        wait_port(up_port)
        args.upstream_port = up_port
        results["direct"] = measure("direct", up_port, args, None)

        gw_port, coral = start_coral_gateway(procs, work, "benchstream", 100, up_port,
                                             args.proxy_core)
        results["coral"] = measure("coral", gw_port, args, coral.pid)
        procs.stop(coral)

        nx_port, nginx = start_nginx_proxy(procs, work, up_port, args.proxy_core)
        results["nginx"] = measure("nginx", nx_port, args, nginx.pid)
        procs.stop(nginx)

        if router_bin is None:
            notes["vllm-router"] = router_version
        else:
            router = None
            try:
                vr_port, router = start_vllm_router(procs, work, router_bin, up_port,
                                                    args.proxy_core, settle_s=1.0)
                results["vllm-router"] = measure("vllm-router", vr_port, args, router.pid)
            except RuntimeError as exc:
                notes["vllm-router"] = f"did not serve: {exc}; log: " + (
                    work / "vllm-router.log").read_text()[-500:]
            if router is not None:
                procs.stop(router)
    finally:
        procs.stop_all()
    write_results(args, results, notes, router_version if router_bin else None, load_start)


def _row(sat: dict, paced: dict, rt: dict | None) -> dict:
    control = paced.get("control") or {}
    row = {"chunks_per_s": sat["chunks_per_s"],
           "chunks_per_cpu_s": sat.get("chunks_per_cpu_s"),
           "proxy_core_busy": sat.get("proxy_core_busy"),
           "delay_p50_ms": paced.get("delay_p50_ms"),
           "delay_p99_ms": paced.get("delay_p99_ms"),
           "control_p99_ms": control.get("delay_p99_ms"),
           "added_p50_ms": paced.get("added_p50_ms"),
           "added_p99_ms": paced.get("added_p99_ms"),
           "paced_cpu_us_per_chunk": paced.get("proxy_cpu_us_per_chunk"),
           "paced_runqueue_wait_ms_per_s": paced.get("proxy_runqueue_wait_ms_per_s"),
           "paced_loadavg_1min": float(paced["loadavg_before"].split()[0]),
           "broken_streams": sat["streams_broken"] + paced["streams_broken"]}
    if rt:
        row.update({"realtime_added_p50_ms": rt.get("added_p50_ms"),
                    "realtime_added_p99_ms": rt.get("added_p99_ms"),
                    "realtime_runqueue_wait_ms_per_s": rt.get("proxy_runqueue_wait_ms_per_s"),
                    "realtime_loadavg_1min": float(rt["loadavg_before"].split()[0])})
        row["broken_streams"] += rt["streams_broken"]
    return row


def write_results(args, results: dict, notes: dict, router_version: str | None,
                  load_start: str) -> None:
    summary = {name: {streams: _row(res["saturation"], res["paced"], res.get("paced_realtime"))
                      for streams, res in per.items()} for name, per in results.items()}
    ratios: dict = {}
    coral = summary.get("coral")
    for peer in ("nginx", "vllm-router"):
        # a peer that delivered nothing (it happened to vllm-router at 1,000 streams) has no ratio
        if coral and peer in summary and all(summary[peer][n]["chunks_per_s"]
                                             and summary[peer][n]["chunks_per_cpu_s"]
                                             for n in summary[peer]):
            ratios[peer] = {
                streams: {
                    "chunks_per_s": round(coral[streams]["chunks_per_s"]
                                          / summary[peer][streams]["chunks_per_s"], 3),
                    "chunks_per_cpu_s": round(coral[streams]["chunks_per_cpu_s"]
                                              / summary[peer][streams]["chunks_per_cpu_s"], 3),
                } for streams in coral}
    goals = None
    if coral and "vllm-router" in ratios:
        r = ratios["vllm-router"]["1000"]
        top = coral["1000"]
        goals = {
            "chunk_rate_over_router_at_least": GOAL_RATE_OVER_ROUTER,
            "chunk_rate_over_router_cpu_normalised": r["chunks_per_cpu_s"],
            "chunk_rate_over_router_wall": r["chunks_per_s"],
            "rate_met": (r["chunks_per_cpu_s"] or 0) >= GOAL_RATE_OVER_ROUTER,
            "added_p99_ms_at_most": GOAL_ADDED_P99_MS,
            "added_p99_ms": top["added_p99_ms"],
            "delay_met": top["added_p99_ms"] <= GOAL_ADDED_P99_MS,
            "realtime_added_p99_ms": top.get("realtime_added_p99_ms"),
            "realtime_delay_met": (top["realtime_added_p99_ms"] <= GOAL_ADDED_P99_MS
                                   if top.get("realtime_added_p99_ms") is not None else None),
        }
    doc = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": load_start,
                    "loadavg_end": _loadavg()},
        "setup": {"proxy_core": args.proxy_core, "load_and_upstream_cores": args.load_cores,
                  "duration_s": args.duration, "paced_interval_ms": PACED_INTERVAL_MS,
                  "control_streams": CONTROL_STREAMS, "realtime_priority": (
                      RT_PRIORITY if args.realtime else None),
                  "events_per_stream": {"saturation": 200, "paced": "100 at 40 ms, 60 at 100 ms"},
                  "vllm_router": router_version},
        "summary": summary, "ratios": ratios, "goals": goals, "raw": results, "notes": notes,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "gateway_stream.json").write_text(json.dumps(doc, indent=2) + "\n")

    def ms(value) -> str:
        return "–" if value is None else f"{value} ms"

    lines = [
        "# Gateway streaming (SSE) vs peers",
        "",
        (f"Generated {doc['generated_at']} by `bench/gateway_stream.py` ({os.cpu_count()} shared "
         f"CPUs; /proc/loadavg at start `{load_start}`, at end `{doc['machine']['loadavg_end']}`: "
         "other engineers' work shares the machine; each paced run's own 1-minute load average "
         "is in its row)."),
        (f"Each proxy pinned to core {args.proxy_core}; upstream (canned vLLM-shaped SSE, one HTTP "
         f"chunk per event) and load generator (asyncio/uvloop) on core(s) {args.load_cores}; "
         f"{args.duration:g} s per measurement after 1 s of warm-up. Saturation: 200 events per "
         "stream back to back, each finished stream replaced at once. Paced: an event every "
         "40 ms per stream at 100 streams (25 tokens/s), every 100 ms at 1,000 (10 tokens/s), "
         "phases spread at random; delay = generator read time − upstream write time of each "
         "event (one monotonic clock). **Added** = the proxied streams' percentile minus that of "
         f"a control group ({CONTROL_STREAMS[100]} resp. {CONTROL_STREAMS[1000]} streams straight "
         "to the upstream, paced alike) read by the same generator in the same run, so the "
         "generator's, the upstream's and the host's share of the delay cancels. **Run-queue "
         "wait**: how long per second the proxy's threads were runnable but waited for a CPU "
         "(/proc/…/schedstat), the time other work on its core took from it."
         + (f" **Real-time**: the same 1,000-stream paced run once more with the proxy, the "
            f"upstream and the generator at SCHED_FIFO {RT_PRIORITY} (`chrt`), so each runs "
            "whenever it is runnable and other work cannot delay it: what is left is the "
            "proxy's own delay." if args.realtime else "")),
        "",
        ("| system | streams | chunks/s (saturation) | proxy core busy | chunks per CPU-second "
         "(one-core capacity) | paced p50 | paced p99 | control p99 | added p50 | added p99 | "
         "proxy CPU per paced chunk | run-queue wait | load (1 min) | real-time added p50 / p99 "
         "(run-queue wait) | broken streams |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per in summary.items():
        for streams, row in per.items():
            busy = row["proxy_core_busy"]
            wait = row["paced_runqueue_wait_ms_per_s"]
            wait = "–" if wait is None else f"{wait} ms/s"
            rt = "–"
            if row.get("realtime_added_p99_ms") is not None:
                rt = (f"{row['realtime_added_p50_ms']} / {row['realtime_added_p99_ms']} ms "
                      f"({row['realtime_runqueue_wait_ms_per_s']} ms/s, load "
                      f"{row['realtime_loadavg_1min']})")
            lines.append(
                f"| {name} | {streams} | {row['chunks_per_s']} | "
                f"{'–' if busy is None else f'{busy:.0%}'} | "
                f"{row['chunks_per_cpu_s'] or '–'} | {ms(row['delay_p50_ms'])} | "
                f"{ms(row['delay_p99_ms'])} | {ms(row['control_p99_ms'])} | "
                f"{ms(row['added_p50_ms'])} | {ms(row['added_p99_ms'])} | "
                f"{row['paced_cpu_us_per_chunk'] or '–'} µs | "
                f"{wait} | "
                f"{row['paced_loadavg_1min']} | {rt} | {row['broken_streams']} |")
    lines += ["", "Ratios (coral / peer; chunks per CPU-second is the one-core capacity, the "
              "wall rate is capped by the generator's core when the proxy is not busy): "
              + json.dumps(ratios), ""]
    if goals:
        line = (
            f"Goals at 1,000 streams: ≥ {GOAL_RATE_OVER_ROUTER}× vllm-router's chunk rate on one "
            f"core → {'met' if goals['rate_met'] else 'MISSED'} "
            f"({goals['chunk_rate_over_router_cpu_normalised']}× per CPU-second, "
            f"{goals['chunk_rate_over_router_wall']}× wall); added p99 delay ≤ "
            f"{GOAL_ADDED_P99_MS} ms → {'met' if goals['delay_met'] else 'MISSED'} "
            f"({goals['added_p99_ms']} ms on the shared core)")
        if goals["realtime_added_p99_ms"] is not None:
            line += (f", {'met' if goals['realtime_delay_met'] else 'MISSED'} at real-time "
                     f"priority ({goals['realtime_added_p99_ms']} ms)")
        lines.append(line + ".")
    for name, note in notes.items():
        lines.append(f"- {name}: {note}")
    (args.results / "gateway_stream.md").write_text("\n".join(lines) + "\n")
    print((args.results / "gateway_stream.md").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    up = sub.add_parser("upstream", help="(internal) the canned streaming upstream")
    up.add_argument("--port", type=int, required=True)
    gen = sub.add_parser("gen", help="(internal) one load-generator run")
    gen.add_argument("--port", type=int, required=True)
    gen.add_argument("--streams", type=int, required=True)
    gen.add_argument("--interval-ms", type=int, default=0)
    gen.add_argument("--events", type=int, default=100)
    gen.add_argument("--duration", type=float, default=8)
    gen.add_argument("--control-port", type=int, default=0)
    gen.add_argument("--control-streams", type=int, default=0)
    parser.add_argument("--no-realtime", dest="realtime", action="store_false",
                        help="skip the run with each proxy at real-time priority (needs root)")
    parser.add_argument("--duration", type=float, default=8, help="seconds per measurement")
    parser.add_argument("--proxy-core", default="0")
    parser.add_argument("--load-cores", default=None)
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--vllm-router-venv", type=Path, default=Path("/tmp/vr-venv"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.role == "upstream":
        _run_loop(upstream_main(args.port))
    elif args.role == "gen":
        result = _run_loop(gen_main(args.port, args.streams, args.interval_ms, args.events,
                                    args.duration, warmup=1.0, control_port=args.control_port,
                                    control_streams=args.control_streams))
        print("RESULT " + json.dumps(result), flush=True)
    else:
        main_bench(args)


if __name__ == "__main__":
    main()
