#!/usr/bin/env python3
"""Gateway overhead against peers, in one run: added latency at concurrency 1, req/s at 32.

Every proxy forwards ``POST /v1/completions`` to the same fixed, fast upstream — nginx answering a
canned OpenAI completion (``return 200``), so the upstream is never the bottleneck — and is pinned
to ONE core with ``taskset``; the upstream and the load generator share the other core(s). Load
generator: ``wrk`` (Debian package), one thread, keep-alive connections, a Lua script that POSTs
the JSON body and prints wrk's own latency percentiles. Systems:

* ``direct``   — wrk straight to the upstream (the baseline the "added" latencies subtract);
* ``coral``    — ``coral-hpc gateway`` (this repository), one process;
* ``nginx``    — nginx as a reverse proxy (``proxy_pass`` with upstream keep-alive), one worker;
* ``vllm-router`` — vLLM's Rust router (PyPI ``vllm-router``), if it installs;
* ``aiohttp-minimal`` — a 20-line aiohttp+uvloop forwarder (no auth, routing, metering, failover):
  the floor of the stack the gateway is built on, to tell the stack's cost from ours.

Besides wall-clock figures, the proxy's own CPU time (user+system, from /proc, all processes of
its session) during the concurrency-32 run gives CPU µs per request and so a one-core capacity
that stays meaningful when other work shares the machine.

Writes bench/results/gateway.json and gateway.md. Needs ``nginx`` and ``wrk`` (installed with
apt-get when missing and allowed: ``--install``) and, optionally, ``vllm-router`` in a venv
(``--vllm-router-venv``, created with pip when missing and ``--install``).

With ``--before OLD.json`` (this script's gateway.json from an earlier run, say on the code
before a change) the report sets that run's figures beside this one's, with each run's code
version, niceness and load, and the peers' change between the runs as the measure of noise.

Usage: .venv/bin/python bench/gateway.py [--duration 6] [--install] [--proxy-core 0]
       [--before OLD.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, write_routing_table

RESULTS = REPO / "bench" / "results"
GOAL_ADDED_P50_US = 500
GOAL_RPS_ONE_CORE = 10_000
#: What limits the gateway, from a cProfile of it at c=32 (kept here so every report says it).
LIMITS = (
    "What limits coral (cProfile of the gateway at c=32, 2026-12-01 13:56 UTC, request path "
    "only, after aiohttp's server was replaced by the gateway's own httptools protocol, "
    "coral_hpc/gateway/http_server.py): 43% of a request's CPU is the event loop's own C code "
    "(uvloop: epoll, socket reads and writes, callbacks), 18% the server protocol (parse, "
    "checks, dispatch, answer), 15% the upstream client (coral_hpc/gateway/upstream.py), 9% the "
    "gateway's own work (key check, routing, demand meter), 3% Prometheus, 2% JSON and 9% C "
    "helpers they call (dict, bytes, str). Before (the previous run of this bench, 9.8k req/s "
    "per CPU-second), aiohttp's server machinery was 38% of it. The machine is shared (see the "
    "load averages): wall req/s of every row moves with it (the proxy's run-queue wait says how "
    "long other work held its core); the proxy's CPU per request, and the one-core capacity it "
    "gives, much less. SO_REUSEPORT workers, one per core, would multiply the capacity by the "
    "cores but not the per-core figure, and would need the demand meter and metrics summed "
    "across workers; they are not built."
)

CANNED = json.dumps({
    "id": "cmpl-bench", "object": "text_completion", "created": 1700000000, "model": "bench",
    "choices": [{"index": 0, "text": " a canned answer of a few tokens", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10},
}, separators=(",", ":"))
BODY = json.dumps({"model": "bench", "prompt": "hello there", "max_tokens": 7})

WRK_LUA = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {{"requests":%d,"duration_us":%d,"socket_errors":%d,"non2xx":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
"""


MINIMAL_PROXY = """
import sys, uvloop, aiohttp
from aiohttp import web
from yarl import URL
upstream = URL(sys.argv[2] + "/v1/completions")
async def start(app):
    app["s"] = aiohttp.ClientSession(auto_decompress=False,
                                     skip_auto_headers=("User-Agent", "Accept-Encoding"))
async def handle(request):
    body = await request.read()
    async with request.app["s"].post(upstream, data=body,
                                     headers={"Content-Type": "application/json"}) as r:
        data = await r.read()
        return web.Response(status=r.status, body=data, content_type="application/json")
app = web.Application()
app.on_startup.append(start)
app.router.add_post("/v1/completions", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None,
            loop=uvloop.new_event_loop())
"""


def session_cpu_s(pgid: int) -> float:
    """User+system CPU seconds of every process in session/process group ``pgid``."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:        # field 5 (pgrp), counted after the ")"
            total += int(fields[11]) + int(fields[12])
    return total / tick


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


def ensure_tools(install: bool) -> None:
    missing = [t for t in ("nginx", "wrk") if shutil.which(t) is None]
    if missing and install:
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing],
                       check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        missing = [t for t in ("nginx", "wrk") if shutil.which(t) is None]
    if missing:
        sys.exit(f"bench/gateway.py needs {missing}: apt-get install {' '.join(missing)} "
                 "(or run with --install)")


def ensure_vllm_router(venv: Path, install: bool) -> tuple[str | None, str]:
    """Path of the vllm-router binary, or None and why not."""
    binary = venv / "bin" / "vllm-router"
    if not binary.exists() and install:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        result = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "vllm-router"],
                                check=False, capture_output=True, text=True)
        if result.returncode != 0:
            return None, f"pip install vllm-router failed: {result.stderr.strip()[-400:]}"
    if not binary.exists():
        return None, f"vllm-router is not installed in {venv} (run with --install)"
    version = subprocess.run([str(venv / "bin" / "pip"), "show", "vllm-router"],
                             check=False, capture_output=True, text=True).stdout
    line = next((ln for ln in version.splitlines() if ln.startswith("Version:")), "Version: ?")
    return str(binary), line.split(":", 1)[1].strip()


class Procs:
    """Processes this bench started; all stopped at exit, each by its own pid."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc)


def start_coral_gateway(procs: Procs, work: Path, deployment: str, output_tokens: int,
                        up_port: int, core: str, code: Path | None = None
                        ) -> tuple[int, subprocess.Popen]:
    """``coral-hpc gateway`` pinned to ``core`` on a free port, routing its one model ``bench``
    (``output_tokens`` per request, which its metering expects) to the upstream on ``up_port``;
    (port, process) once it listens and has read its table. ``code``: a checkout whose
    ``coral_hpc`` the gateway runs instead of the one installed (put first on PYTHONPATH)."""
    work.mkdir(parents=True, exist_ok=True)
    env = None
    if code is not None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(code), str(code / "solver"), os.environ.get("PYTHONPATH", "")]))
    gw_port = free_port()
    models = work / "models.yaml"
    models.write_text(f"""
deployment: {deployment}
state_dir: {work}/state
db_path: {work}/db.sqlite
cluster: {{partitions: [{{name: gpu}}]}}
engine: {{kind: sim}}
gateway: {{listen: "127.0.0.1:{gw_port}", open_on_loopback: true}}   # a bench machine of its own
models:
  - {{name: bench, source: org/bench, architecture: qwen3-8b,
     mix: {{input_tokens: 3, output_tokens: {output_tokens}}}, demand: {{requests_per_s: 1}},
     slo: {{ttft_s: 1, tpot_s: 0.1}}}}
""")
    table = work / "table.json"
    write_routing_table(table, RoutingTable(version=1, models={
        "bench": (ReplicaRoute("up", f"http://127.0.0.1:{up_port}", 1.0),)}))
    coral = procs.start(["taskset", "-c", core,
                         str(Path(sys.executable).parent / "coral-hpc"), "gateway",
                         str(models), "--table", str(table), "--log-level", "warning"],
                        work / "coral.log", env=env)
    wait_port(gw_port)
    time.sleep(1.0)   # first table poll
    return gw_port, coral


def start_nginx_proxy(procs: Procs, work: Path, up_port: int, core: str
                      ) -> tuple[int, subprocess.Popen]:
    """nginx as a one-worker reverse proxy to the upstream on ``up_port`` (upstream keep-alive,
    no buffering), pinned to ``core``; (port, process) once it listens."""
    nx_port = free_port()
    nx_conf = nginx_conf(work, "proxy", nx_port,
                         'proxy_pass http://replica; proxy_http_version 1.1; '
                         'proxy_set_header Connection ""; proxy_buffering off;', up_port)
    nginx = procs.start(["taskset", "-c", core, "nginx", "-c", str(nx_conf),
                         "-g", "daemon off;"], work / "nginx.log")
    wait_port(nx_port)
    return nx_port, nginx


def start_vllm_router(procs: Procs, work: Path, router_bin: str, up_port: int, core: str,
                      settle_s: float = 0.0) -> tuple[int, subprocess.Popen]:
    """vLLM's router (round robin over the one upstream on ``up_port``) pinned to ``core``, its
    log in ``work/vllm-router.log``; (port, process) once it listens and ``settle_s`` passed.
    RuntimeError, the router stopped, when it does not listen within 60 s."""
    vr_port = free_port()
    router = procs.start(["taskset", "-c", core, router_bin,
                          "--host", "127.0.0.1", "--port", str(vr_port),
                          "--worker-urls", f"http://127.0.0.1:{up_port}",
                          "--policy", "round_robin", "--log-level", "warning",
                          "--prometheus-port", str(free_port())],
                         work / "vllm-router.log")
    try:
        wait_port(vr_port, 60)
    except RuntimeError:
        procs.stop(router)
        raise
    time.sleep(settle_s)
    return vr_port, router


def nginx_conf(work: Path, name: str, port: int, body: str, upstream_port: int) -> Path:
    """A one-worker nginx config; ``body`` is the server's ``location /`` block."""
    prefix = work / name
    for sub in ("logs", "tmp"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/tmp/body;
  proxy_temp_path {prefix}/tmp/proxy;
  fastcgi_temp_path {prefix}/tmp/fastcgi;
  uwsgi_temp_path {prefix}/tmp/uwsgi;
  scgi_temp_path {prefix}/tmp/scgi;
  keepalive_requests 1000000;
  upstream replica {{ server 127.0.0.1:{upstream_port}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port} reuseport;
    location / {{ {body} }}
  }}
}}
""")
    return conf


def run_wrk(port: int, concurrency: int, duration: float, core: str, work: Path) -> dict:
    script = work / "post.lua"
    script.write_text(WRK_LUA)
    argv = ["taskset", "-c", core, "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s",
            "-s", str(script), f"http://127.0.0.1:{port}/v1/completions"]
    out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=duration + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {out.stdout}\n{out.stderr}")
    result = json.loads(line[7:])
    result["rps"] = round(result["requests"] / (result["duration_us"] / 1e6), 1)
    if result["non2xx"] or result["socket_errors"]:
        result["warning"] = "some requests failed; see non2xx/socket_errors"
    return result


def measure(name: str, port: int, args, work: Path, pgid: int | None = None) -> dict:
    """Warm up, then concurrency 1 (latency) and concurrency 32 (throughput)."""
    run_wrk(port, 4, 1.0, args.load_cores, work)
    c1 = run_wrk(port, 1, args.duration, args.load_cores, work)
    from gateway_stream import runqueue_wait_s

    before = session_cpu_s(pgid) if pgid else 0.0
    wait_before = runqueue_wait_s(pgid) if pgid else 0.0
    load_before = Path("/proc/loadavg").read_text().split()[0]
    c32 = run_wrk(port, 32, args.duration, args.load_cores, work)
    c32["loadavg_1min_before"] = float(load_before)
    if pgid:
        c32["proxy_runqueue_wait_ms_per_s"] = round(
            (runqueue_wait_s(pgid) - wait_before) * 1e3 / args.duration, 1)
        cpu = session_cpu_s(pgid) - before
        c32["proxy_cpu_s"] = round(cpu, 3)
        c32["proxy_cpu_us_per_request"] = round(cpu * 1e6 / max(1, c32["requests"]), 1)
        c32["one_core_capacity_rps"] = round(c32["requests"] / cpu) if cpu > 0 else None
    out = {"c1": c1, "c32": c32}
    if pgid and args.realtime:
        # latency once more with the proxy at real-time priority: other work on its core can
        # no longer delay it (c=1 is a fraction of a core, so this takes little from anyone)
        from gateway_stream import set_realtime

        set_realtime(pgid, True)
        try:
            cpu_before = session_cpu_s(pgid)
            rt = out["c1_realtime"] = run_wrk(port, 1, args.duration, args.load_cores, work)
            # one request at a time, never preempted: the proxy's CPU per request with no
            # batching and no other work's interference, the steadiest figure on a shared core
            rt["proxy_cpu_us_per_request"] = round(
                (session_cpu_s(pgid) - cpu_before) * 1e6 / max(1, rt["requests"]), 1)
        finally:
            set_realtime(pgid, False)
    print(f"{name:15s} c=1 p50 {c1['p50_us']:6d} us p99 {c1['p99_us']:6d} us | "
          f"c=32 {c32['rps']:9.0f} req/s (p50 {c32['p50_us']} us) "
          f"cpu/req {c32.get('proxy_cpu_us_per_request', '-')} us | real-time c=1 p50 "
          f"{out.get('c1_realtime', {}).get('p50_us', '-')} us", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=6, help="seconds per measurement")
    parser.add_argument("--proxy-core", default="0", help="the one core every proxy runs on")
    parser.add_argument("--load-cores", default=None,
                        help="cores for wrk and the upstream [default: all but the proxy core]")
    parser.add_argument("--install", action="store_true",
                        help="apt-get nginx/wrk and pip vllm-router when missing")
    parser.add_argument("--vllm-router-venv", type=Path, default=Path("/tmp/vr-venv"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--before", type=Path, default=None,
                        help="an earlier run's gateway.json to set beside this one")
    parser.add_argument("--before-code", type=Path, default=None,
                        help="a checkout of the code before a change: measured in this run too "
                             "(row coral-before), alternating with this checkout's gateway")
    parser.add_argument("--rounds", type=int, default=None,
                        help="coral-before/coral measurements, alternating [3 with "
                             "--before-code, else 1]; the round of median CPU/request (at "
                             "real-time c=1 when run) is the row, every round is in the JSON")
    parser.add_argument("--no-realtime", dest="realtime", action="store_false",
                        help="skip the c=1 run with each proxy at real-time priority (needs root)")
    args = parser.parse_args()
    ncpu = os.cpu_count() or 1
    if args.load_cores is None:
        others = [str(c) for c in range(ncpu) if str(c) != args.proxy_core]
        args.load_cores = ",".join(others) or args.proxy_core
    ensure_tools(args.install)
    router_bin, router_version = ensure_vllm_router(args.vllm_router_venv, args.install)
    args.load_start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rounds: dict[str, list[dict]] = {}

    procs = Procs()
    work = Path(tempfile.mkdtemp(prefix="coral-bench-gw-"))
    results: dict = {}
    notes: dict = {}
    try:
        # the fixed, fast upstream: nginx returning a canned completion for every path
        up_port = free_port()
        canned = CANNED.replace("'", "\\'")
        up_conf = nginx_conf(work, "upstream", up_port,
                             f"default_type application/json; return 200 '{canned}';", up_port)
        procs.start(["taskset", "-c", args.load_cores, "nginx", "-c", str(up_conf),
                     "-g", "daemon off;"], work / "upstream.log")
        wait_port(up_port)
        results["direct"] = measure("direct", up_port, args, work)

        # (a) coral-hpc gateway (and the code before a change, alternating with it)
        results.update(measure_coral(procs, work, up_port, args, rounds))

        # (b) nginx reverse proxy
        nx_port, nginx = start_nginx_proxy(procs, work, up_port, args.proxy_core)
        results["nginx"] = measure("nginx", nx_port, args, work, nginx.pid)
        procs.stop(nginx)

        # (c) vLLM's Rust router
        if router_bin is None:
            notes["vllm-router"] = router_version
        else:
            router = None
            try:
                vr_port, router = start_vllm_router(procs, work, router_bin, up_port,
                                                    args.proxy_core)
                results["vllm-router"] = measure("vllm-router", vr_port, args, work, router.pid)
            except RuntimeError as exc:
                notes["vllm-router"] = f"did not serve: {exc}; log: " + (
                    work / "vllm-router.log").read_text()[-500:]
            if router is not None:
                procs.stop(router)

        # (d) the floor of our stack: a minimal aiohttp forwarder
        mp_port = free_port()
        script = work / "minimal_proxy.py"
        script.write_text(MINIMAL_PROXY)
        minimal = procs.start(["taskset", "-c", args.proxy_core, sys.executable, str(script),
                               str(mp_port), f"http://127.0.0.1:{up_port}"],
                              work / "minimal.log")
        wait_port(mp_port)
        results["aiohttp-minimal"] = measure("aiohttp-minimal", mp_port, args, work, minimal.pid)
        procs.stop(minimal)
    finally:
        procs.stop_all()

    if args.before_code is not None:
        notes["coral-before"] = (f"the gateway of {args.before_code} (code "
                                 f"{code_version(args.before_code)}), measured in this run, "
                                 "alternating with coral; per round, before → after: "
                                 + "; ".join(round_line(b, a) for b, a in
                                             zip(rounds["coral-before"], rounds["coral"])))
    write_results(args, results, notes, router_version if router_bin else None, work, rounds)


def round_line(before: dict, after: dict) -> str:
    """One round of coral-before and coral: CPU per request, c=1 p50 (real-time p50)."""
    def figures(r: dict) -> str:
        rt = r.get("c1_realtime", {})
        return (f"{r['c32'].get('proxy_cpu_us_per_request')} µs CPU/req, c=1 p50 "
                f"{r['c1']['p50_us']} µs" + (
                    f" (real-time: p50 {rt['p50_us']} µs, {rt.get('proxy_cpu_us_per_request')} "
                    "µs CPU/req)" if rt else ""))
    return f"{figures(before)} → {figures(after)}"


def measure_coral(procs: Procs, work: Path, up_port: int, args,
                  rounds: dict[str, list[dict]]) -> dict[str, dict]:
    """This checkout's gateway (``coral``) and, with ``--before-code``, the one before a change
    (``coral-before``), alternating for ``--rounds``; each system's round of median CPU per
    request (every round lands in ``rounds``)."""
    variants: list[tuple[str, Path | None]] = [("coral", None)]
    if args.before_code is not None:
        variants.insert(0, ("coral-before", args.before_code.resolve()))
    n = args.rounds or (3 if args.before_code is not None else 1)
    for i in range(n):
        for name, code in variants:
            port, proc = start_coral_gateway(procs, work / f"{name}-{i}", "bench", 7, up_port,
                                             args.proxy_core, code)
            rounds.setdefault(name, []).append(measure(name, port, args, work, proc.pid))
            procs.stop(proc)
    return {name: sorted(rounds[name], key=_cpu_per_request)[(n - 1) // 2]
            for name, _ in variants}


def _cpu_per_request(res: dict) -> float:
    """The steadiest CPU figure of a measurement: at real-time c=1 when run, else at c=32."""
    return (res.get("c1_realtime", {}).get("proxy_cpu_us_per_request")
            or res["c32"].get("proxy_cpu_us_per_request") or 0.0)


def write_results(args, results: dict, notes: dict, router_version: str | None,
                  work: Path, rounds: dict | None = None) -> None:
    direct = results["direct"]["c1"]
    summary = {}
    for name, res in results.items():
        if name == "direct":
            continue
        summary[name] = {
            "added_p50_us": res["c1"]["p50_us"] - direct["p50_us"],
            "added_p99_us": res["c1"]["p99_us"] - direct["p99_us"],
            "rps_c32": res["c32"]["rps"],
            "cpu_us_per_request_c32": res["c32"].get("proxy_cpu_us_per_request"),
            "one_core_capacity_rps": res["c32"].get("one_core_capacity_rps"),
            "runqueue_wait_ms_per_s_c32": res["c32"].get("proxy_runqueue_wait_ms_per_s"),
            "loadavg_1min_c32": res["c32"].get("loadavg_1min_before"),
            "realtime_added_p50_us": (res["c1_realtime"]["p50_us"] - direct["p50_us"]
                                      if "c1_realtime" in res else None),
            "realtime_added_p99_us": (res["c1_realtime"]["p99_us"] - direct["p99_us"]
                                      if "c1_realtime" in res else None),
            "realtime_cpu_us_per_request_c1": res.get("c1_realtime", {}).get(
                "proxy_cpu_us_per_request"),
        }
    coral = summary.get("coral", {})
    ratios = {
        peer: {
            "coral_rps_over_peer": round(coral["rps_c32"] / s["rps_c32"], 3),
            "coral_added_p50_over_peer": (round(coral["added_p50_us"] / s["added_p50_us"], 2)
                                          if s["added_p50_us"] > 0 else None),
        }
        for peer, s in summary.items() if peer != "coral" and coral
    }
    nginx_version = subprocess.run(["nginx", "-v"], check=False, capture_output=True, text=True).stderr.strip()
    wrk_version = subprocess.run(["wrk", "-v"], check=False, capture_output=True, text=True).stdout.split(
        "\n")[0].strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), platform.processor())
    doc = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu, "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                    "python": platform.python_version()},
        "setup": {
            "proxy_core": args.proxy_core, "load_and_upstream_cores": args.load_cores,
            "duration_s": args.duration, "load_generator": wrk_version + " (-t1, keep-alive, Lua "
            "POST script, wrk's own latency percentiles)",
            "upstream": "nginx returning a canned completion (return 200), on the load cores",
            "request": BODY, "nginx": nginx_version, "vllm_router": router_version,
            "code": code_version(), "niceness": os.nice(0),
        },
        "goals": {"added_p50_us_at_most": GOAL_ADDED_P50_US,
                  "rps_one_core_at_least": GOAL_RPS_ONE_CORE},
        "goals_met": ({"added_p50": coral["added_p50_us"] <= GOAL_ADDED_P50_US,
                       "added_p50_realtime": (coral["realtime_added_p50_us"] <= GOAL_ADDED_P50_US
                                              if coral["realtime_added_p50_us"] is not None
                                              else None),
                       "rps": coral["rps_c32"] >= GOAL_RPS_ONE_CORE,
                       "rps_cpu_normalised": (coral["one_core_capacity_rps"] or 0)
                       >= GOAL_RPS_ONE_CORE} if coral else None),
        "summary": summary, "ratios": ratios, "raw": results, "notes": notes,
        "coral_rounds": rounds or {},
    }
    before = json.loads(args.before.read_text()) if args.before else None
    if before is not None:
        doc["before_after"] = before_after(before, doc)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "gateway.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# Gateway overhead vs peers",
        "",
        (f"Generated {doc['generated_at']} by `bench/gateway.py` on {cpu} ({os.cpu_count()} shared "
        f"CPUs; load average at the start {args.load_start}, at the end "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; each row's 1-minute load at its "
        "c=32 run is in the row: other engineers' work shares the machine)."),
        (f"Each proxy pinned to core {args.proxy_core}; upstream (nginx, canned completion) and "
        f"load generator ({wrk_version}, one thread) on core(s) {args.load_cores}; "
        f"{args.duration:g} s per measurement after a 1 s warm-up. Run-queue wait: how long per "
        "second the proxy's threads were runnable but waited for a CPU (/proc/…/schedstat)."
        + (" Real-time: the c=1 run once more with the proxy at SCHED_FIFO (`chrt`), so other "
           "work on its core cannot delay it; its CPU per request, one request at a time and "
           "never preempted, is the steadiest figure of the gateway's own work." if args.realtime else "")),
        "",
        ("| system | c=1 p50 | c=1 p99 | added p50 | added p99 | req/s at c=32 | proxy CPU/req "
        "| one-core capacity (req/s of CPU) | proxy run-queue wait at c=32 | load (1 min) "
        "| real-time added p50 / p99 | real-time CPU/req at c=1 |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        (f"| direct (no proxy) | {direct['p50_us']} µs | {direct['p99_us']} µs | – | – | "
        f"{results['direct']['c32']['rps']:.0f} | – | – | – | "
        f"{results['direct']['c32']['loadavg_1min_before']} | – | – |"),
    ]
    for name, s in summary.items():
        res = results[name]
        lines.append(f"| {name} | {res['c1']['p50_us']} µs | {res['c1']['p99_us']} µs | "
                     f"{s['added_p50_us']} µs | {s['added_p99_us']} µs | {s['rps_c32']:.0f} | "
                     f"{s['cpu_us_per_request_c32']} µs | {s['one_core_capacity_rps']} | "
                     f"{s['runqueue_wait_ms_per_s_c32']} ms/s | {s['loadavg_1min_c32']} | "
                     + ("–" if s["realtime_added_p50_us"] is None else
                        f"{s['realtime_added_p50_us']} / {s['realtime_added_p99_us']} µs") + " | "
                     + ("–" if s["realtime_cpu_us_per_request_c1"] is None else
                        f"{s['realtime_cpu_us_per_request_c1']} µs") + " |")
    lines += ["", "Ratios (coral vs peer): " + (json.dumps(ratios) if ratios else "none"), ""]
    if coral:
        lines.append(
            f"Goals: added p50 ≤ {GOAL_ADDED_P50_US} µs → "
            f"{'met' if doc['goals_met']['added_p50'] else 'MISSED'} ({coral['added_p50_us']} µs"
            + ("" if coral["realtime_added_p50_us"] is None else
               f" on the shared core; {'met' if doc['goals_met']['added_p50_realtime'] else 'MISSED'}"
               f" at real-time priority, {coral['realtime_added_p50_us']} µs")
            + "); "
            f"≥ {GOAL_RPS_ONE_CORE} req/s on one core → wall "
            f"{'met' if doc['goals_met']['rps'] else 'MISSED'} ({coral['rps_c32']:.0f} req/s at "
            f"c=32 on a shared core), CPU-normalised "
            f"{'met' if (coral['one_core_capacity_rps'] or 0) >= GOAL_RPS_ONE_CORE else 'MISSED'}"
            f" ({coral['one_core_capacity_rps']} req/s per CPU-second).")
    for name, note in notes.items():
        lines.append(f"- {name}: {note}")
    if before is not None:
        lines += before_after_lines(doc["before_after"])
    lines += ["", LIMITS]
    (args.results / "gateway.md").write_text("\n".join(lines) + "\n")
    print((args.results / "gateway.md").read_text())


def code_version(repo: Path = REPO) -> str:
    """The checkout's commit, and whether it had uncommitted changes, for the report."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *argv], check=False, capture_output=True,
                              text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown (no git checkout)"
    return commit + (" + uncommitted changes" if git("status", "--porcelain", "--", "coral_hpc")
                     else "")


#: the figures set side by side, (json key, label, unit)
COMPARED = (("added_p50_us", "added p50", "µs"), ("added_p99_us", "added p99", "µs"),
            ("rps_c32", "req/s at c=32", ""), ("cpu_us_per_request_c32", "CPU/req", "µs"),
            ("one_core_capacity_rps", "one-core capacity", "req/s"),
            ("runqueue_wait_ms_per_s_c32", "run-queue wait at c=32", "ms/s"),
            ("loadavg_1min_c32", "load (1 min)", ""),
            ("realtime_added_p50_us", "real-time added p50", "µs"),
            ("realtime_cpu_us_per_request_c1", "real-time CPU/req at c=1", "µs"))


def before_after(before: dict, after: dict) -> dict:
    """Each system's summary in both runs and the relative change of every figure."""
    def conditions(doc: dict) -> dict:
        setup = doc.get("setup", {})
        return {"generated_at": doc.get("generated_at"), "code": setup.get("code", "not recorded"),
                "niceness": setup.get("niceness", "not recorded"),
                "loadavg_at_end": doc.get("machine", {}).get("loadavg_at_end")}

    systems = {}
    for name, now in after["summary"].items():
        old = before.get("summary", {}).get(name)
        if old is None:
            continue
        change = {}
        for key, _, _ in COMPARED:
            if isinstance(old.get(key), (int, float)) and isinstance(now.get(key), (int, float)) \
                    and old[key]:
                change[key] = round(now[key] / old[key] - 1, 3)
        systems[name] = {"before": {k: old.get(k) for k, _, _ in COMPARED},
                         "after": {k: now.get(k) for k, _, _ in COMPARED}, "change": change}
    return {"before": conditions(before), "after": conditions(after), "systems": systems}


def before_after_lines(cmp: dict) -> list[str]:
    """The markdown section for :func:`before_after`."""
    def load(run: dict) -> str:
        return ", ".join(f"{x:.2f}" for x in run["loadavg_at_end"] or ())

    def figure(value: float | None, unit: str) -> str:
        if value is None:
            return "–"
        return (f"{value:.0f}" if abs(value) >= 100 else f"{value:g}") + (f" {unit}" if unit else "")

    b, a = cmp["before"], cmp["after"]
    lines = ["", "## Before and after", "",
             f"Before: code {b['code']}, run {b['generated_at']}, niceness {b['niceness']}, load at "
             f"the end {load(b)}. After: code {a['code']}, run {a['generated_at']}, "
             f"niceness {a['niceness']}, load at the end {load(a)}. Same machine, "
             "setup and duration. The peers' code did not change between the runs, so their "
             "change is the noise a run on this shared machine carries.", "",
             "| system | run | " + " | ".join(label for _, label, _ in COMPARED) + " |",
             "|---|---|" + "---|" * len(COMPARED)]
    for name, row in cmp["systems"].items():
        for run in ("before", "after"):
            lines.append(f"| {name} | {run} | " + " | ".join(
                figure(row[run].get(k), unit) for k, _, unit in COMPARED) + " |")
        lines.append(f"| {name} | change | " + " | ".join(
            f"{row['change'][k]:+.1%}" if k in row["change"] else "–" for k, _, _ in COMPARED)
            + " |")
    return lines


if __name__ == "__main__":
    main()
