#!/usr/bin/env python3
"""Gateway soak: an hour of steady traffic with periodic bursts, the gateway's RSS sampled.

Real processes on loopback only: two OpenAI-shaped stub replicas (harness/openai_stub_server.py,
aiohttp) behind one ``coral-hpc gateway`` with API keys. The load is bounded in rate and time:

* steady: ``--rate`` requests/s (default 30), 70 % plain chat completions, 30 % streamed, over a
  pool of keep-alive connections that is replaced every minute (new connections keep coming);
* every ``--burst-every`` seconds (default 600) a burst of ``--burst`` concurrent requests (default
  3,000: the burst after which the old gateway kept ~3,000 idle upstream connections) and 200
  slowloris connections that trickle headers and must be closed by the gateway.

Every ``--sample`` seconds (default 15): the gateway's RSS (VmRSS), its open descriptors and its
established upstream connections. Writes bench/results/gateway_soak.{json,md}: the RSS series, the
least-squares slope (MB/min) over the whole run and over its second half, requests sent, answered
and lost, and the load average (the machine is shared).

Usage: .venv/bin/python bench/gateway_soak.py [--duration 3600] [--rate 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from coral_hpc.gateway.auth import add_key
from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, write_routing_table

RESULTS = REPO / "bench" / "results"
STUB = REPO / "harness" / "openai_stub_server.py"
CORAL_HPC = str(Path(sys.executable).parent / "coral-hpc")


def wait_file(path: Path, proc: subprocess.Popen, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"no {path} after {timeout}s")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def established_to(ports: set[int]) -> int:
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[2].split(":")[1], 16) in ports:
            count += 1
    return count


def slope_mb_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) in MB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    cov = sum((t - mx) * (v - my) for t, v in points)
    return cov / var * 60 if var else None


class Load:
    """The soak's client side: counts what it sent and what came back."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.sent = self.ok = self.failed = self.burst_ok = self.burst_sent = 0
        self.failures: dict[str, int] = {}
        self.slowloris_closed = self.slowloris_opened = 0

    def _fail(self, why: str) -> None:
        self.failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1

    async def one(self, session, i: int, stream: bool) -> bool:
        import aiohttp

        body = {"model": "soak", "messages": [{"role": "user", "content": f"q{i}"}],
                "max_tokens": 8, "stream": stream}
        try:
            async with session.post(self.url + "/v1/chat/completions", json=body,
                                    headers=self.headers,
                                    timeout=aiohttp.ClientTimeout(total=60)) as r:
                data = await r.read()
                if r.status != 200:
                    self._fail(f"http {r.status}")
                    return False
                if stream and not data.rstrip().endswith(b"data: [DONE]"):
                    self._fail("stream without [DONE]")
                    return False
                return True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self._fail(type(exc).__name__)
            return False

    async def steady(self, rate: float, until: float) -> None:
        import aiohttp

        tasks: set[asyncio.Task] = set()
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        renewed = time.monotonic()
        retired: list = []
        i = 0
        next_at = time.monotonic()
        while time.monotonic() < until:
            if time.monotonic() - renewed > 60:       # new client connections every minute
                retired.append(session)             # closed at the end: requests in flight
                session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
                renewed = time.monotonic()
                while len(retired) > 2:
                    await retired.pop(0).close()
            i += 1
            self.sent += 1
            task = asyncio.create_task(self.one(session, i, stream=random.random() < 0.3))
            task.add_done_callback(lambda t: self._count(t))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += random.expovariate(rate)       # Poisson arrivals
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks)
        for old in (*retired, session):
            await old.close()

    def _count(self, task: asyncio.Task) -> None:
        if task.result():
            self.ok += 1

    async def burst(self, n: int) -> None:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            self.burst_sent += n
            results = await asyncio.gather(*(self.one(session, -k, stream=k % 4 == 0)
                                             for k in range(n)))
            self.burst_ok += sum(results)

    async def slowloris(self, address: str, n: int, hold_s: float) -> None:
        host, port = address.rsplit(":", 1)

        async def one() -> None:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                return
            self.slowloris_opened += 1
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            start = time.monotonic()
            try:
                while time.monotonic() - start < hold_s:
                    writer.write(b"X-a: b\r\n")
                    await writer.drain()
                    try:
                        if not await asyncio.wait_for(reader.read(1024), 1.0):
                            self.slowloris_closed += 1
                            return
                    except asyncio.TimeoutError:
                        continue
            except OSError:
                self.slowloris_closed += 1
            finally:
                writer.close()

        await asyncio.gather(*(one() for _ in range(n)))


async def run(args, gateway_pid: int, gw_address: str, key: str, upstream_ports: set[int],
              samples: list[dict]) -> Load:
    load = Load(f"http://{gw_address}", key)
    start = time.monotonic()
    until = start + args.duration

    async def sampler() -> None:
        while time.monotonic() < until + 1:
            samples.append({
                "t_s": round(time.monotonic() - start, 1), "rss_mb": round(rss_mb(gateway_pid), 2),
                "fds": len(os.listdir(f"/proc/{gateway_pid}/fd")),
                "upstream_connections": established_to(upstream_ports),
                "sent": load.sent, "ok": load.ok + load.burst_ok, "failed": load.failed,
                "loadavg_1m": os.getloadavg()[0]})
            await asyncio.sleep(args.sample)

    async def bursts() -> None:
        at = start + args.burst_every / 2
        while at + 60 < until:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            await asyncio.gather(load.burst(args.burst),
                                 load.slowloris(gw_address, 200, args.idle_timeout + 10))
            at += args.burst_every

    await asyncio.gather(sampler(), bursts(), load.steady(args.rate, until))
    return load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3600)
    parser.add_argument("--rate", type=float, default=30, help="steady requests per second")
    parser.add_argument("--burst", type=int, default=3000)
    parser.add_argument("--burst-every", type=float, default=600)
    parser.add_argument("--sample", type=float, default=15)
    parser.add_argument("--idle-timeout", type=float, default=15)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="coral-soak-"))
    procs: list[subprocess.Popen] = []
    uptime_start = Path("/proc/loadavg").read_text().strip()
    try:
        stubs = []
        for name in ("s1", "s2"):
            ready = work / f"{name}.addr"
            proc = subprocess.Popen([sys.executable, str(STUB), "--name", name, "--ready-file",
                                     str(ready), "--token-delay", "0.005"],
                                    stdout=(work / f"{name}.log").open("wb"),
                                    stderr=subprocess.STDOUT)
            procs.append(proc)
            stubs.append(wait_file(ready, proc))
        keys = work / "api-keys"
        key = add_key(keys, "soak")
        models = work / "models.yaml"
        models.write_text(f"""
deployment: soak
state_dir: {work}/state
db_path: {work}/db.sqlite
cluster: {{partitions: [{{name: gpu}}]}}
engine: {{kind: sim}}
gateway: {{listen: "127.0.0.1:8000", api_keys_file: {keys}}}
models:
  - {{name: soak, source: org/soak, architecture: qwen3-8b,
     mix: {{input_tokens: 3, output_tokens: 8}}, demand: {{requests_per_s: 1}},
     slo: {{ttft_s: 1, tpot_s: 0.1}}}}
""")
        table = work / "table.json"
        write_routing_table(table, RoutingTable(version=1, models={"soak": tuple(
            ReplicaRoute(f"s{i}", f"http://{a}", 1.0) for i, a in enumerate(stubs))}))
        ready = work / "gw.addr"
        gateway = subprocess.Popen(
            [CORAL_HPC, "gateway", str(models), "--table", str(table), "--listen", "127.0.0.1:0",
             "--ready-file", str(ready), "--idle-timeout", str(args.idle_timeout),
             "--log-level", "warning"],
            stdout=(work / "gateway.log").open("wb"), stderr=subprocess.STDOUT)
        procs.append(gateway)
        address = wait_file(ready, gateway)
        time.sleep(1.5)                                   # first table poll
        ports = {int(a.rsplit(":", 1)[1]) for a in stubs}
        samples: list[dict] = []
        load = asyncio.run(run(args, gateway.pid, address, key, ports, samples))
        alive = gateway.poll() is None
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    write_results(args, samples, load, alive, uptime_start)


def write_results(args, samples: list[dict], load: Load, alive: bool, uptime_start: str) -> None:
    points = [(s["t_s"], s["rss_mb"]) for s in samples]
    half = [p for p in points if p[0] >= args.duration / 2]
    whole_slope, half_slope = slope_mb_per_min(points), slope_mb_per_min(half)
    answered = load.ok + load.burst_ok
    sent = load.sent + load.burst_sent
    doc = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "setup": {"duration_s": args.duration, "rate_rps": args.rate, "burst": args.burst,
                  "burst_every_s": args.burst_every, "slowloris_per_burst": 200,
                  "idle_timeout_s": args.idle_timeout, "sample_s": args.sample,
                  "upstream": "2 aiohttp stub replicas (harness/openai_stub_server.py), "
                              "5 ms per token, 8 tokens", "cpus": os.cpu_count()},
        "loadavg_start": uptime_start, "loadavg_end": Path("/proc/loadavg").read_text().strip(),
        "requests": {"sent": sent, "answered_200": answered, "failed": load.failed,
                     "failures": load.failures, "lost": sent - answered - load.failed},
        "slowloris": {"opened": load.slowloris_opened, "closed_by_gateway": load.slowloris_closed},
        "gateway_alive_at_end": alive,
        "rss_mb": {"first": points[0][1] if points else None,
                   "max": max(v for _, v in points) if points else None,
                   "last": points[-1][1] if points else None,
                   "slope_mb_per_min_whole": whole_slope,
                   "slope_mb_per_min_second_half": half_slope},
        "samples": samples,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "gateway_soak.json").write_text(json.dumps(doc, indent=1) + "\n")
    def fmt(v):
        return "–" if v is None else f"{v:+.4f}"

    lines = [
        "# Gateway soak: RSS over an hour of traffic with bursts",
        "",
        (f"Generated {doc['generated_at']} by `bench/gateway_soak.py` ({os.cpu_count()} shared "
        f"CPUs; /proc/loadavg at start `{uptime_start}`, at end `{doc['loadavg_end']}`)."),
        (f"{args.duration:.0f} s of {args.rate:g} req/s (Poisson; 70 % plain, 30 % streamed chat "
        f"completions, client connections renewed every minute), a burst of {args.burst} "
        f"concurrent requests plus 200 slowloris connections every {args.burst_every:.0f} s, "
        "through `coral-hpc gateway` (API keys on) to two stub replicas; loopback only."),
        "",
        (f"Requests: {sent} sent, {answered} answered 200, {load.failed} failed "
        f"{load.failures or ''}, {doc['requests']['lost']} lost (no answer at all). Slowloris: "
        f"{load.slowloris_closed} of {load.slowloris_opened} connections closed by the gateway."),
        (f"RSS: first {doc['rss_mb']['first']} MB, max {doc['rss_mb']['max']} MB, last "
        f"{doc['rss_mb']['last']} MB; least-squares slope {fmt(whole_slope)} MB/min over the "
        f"whole run, {fmt(half_slope)} MB/min over the second half "
        "(the old gateway: ~+0.4 MB/min, 54 → 124 MB after 3,000-connection bursts)."),
        "",
        "| minute | RSS MB | fds | upstream conns | sent | answered | failed | load 1m |",
        "|---|---|---|---|---|---|---|---|",
    ]
    step = max(1, int(300 / args.sample))
    for s in samples[::step] + ([samples[-1]] if samples and len(samples) % step != 1 else []):
        lines.append(f"| {s['t_s'] / 60:.1f} | {s['rss_mb']:.1f} | {s['fds']} | "
                     f"{s['upstream_connections']} | {s['sent']} | {s['ok']} | {s['failed']} | "
                     f"{s['loadavg_1m']:.2f} |")
    (args.results / "gateway_soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
