#!/usr/bin/env python3
"""Python function calls per request of the gateway, before and after a change: a figure that,
unlike CPU time, other work on a shared machine cannot move.

Each build (this checkout, and ``--before-code DIR``, a checkout of the code before a change)
runs ``coral-hpc gateway`` under cProfile in front of a fixed upstream (nginx answering a canned
completion, as in ``bench/gateway.py``); one keep-alive client sends ``--requests`` completions
one after another; then the gateway stops on SIGINT and its profile is read. Start-up calls are
in both builds' totals alike; spread over thousands of requests they add a constant.

Writes bench/results/gateway_calls.json and gateway_calls.md.

Usage: .venv/bin/python bench/gateway_calls.py --before-code DIR [--requests 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import (  # noqa: I001 - the sibling bench script, found through sys.path
    BODY, CANNED, Procs, ReplicaRoute, RoutingTable, code_version, free_port, nginx_conf,
    wait_port, write_routing_table,
)

RESULTS = REPO / "bench" / "results"


def _models_yaml(work: Path, port: int) -> Path:
    path = work / "models.yaml"
    path.write_text(f"""
deployment: bench
state_dir: {work}/state
db_path: {work}/db.sqlite
cluster: {{partitions: [{{name: gpu}}]}}
engine: {{kind: sim}}
gateway: {{listen: "127.0.0.1:{port}", open_on_loopback: true}}
models:
  - {{name: bench, source: org/bench, architecture: qwen3-8b,
     mix: {{input_tokens: 3, output_tokens: 7}}, demand: {{requests_per_s: 1}},
     slo: {{ttft_s: 1, tpot_s: 0.1}}}}
""")
    return path


def _send(port: int, n: int) -> None:
    """``n`` completions, one at a time on one keep-alive connection; each must be a 200."""
    body = BODY.encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock, sock.makefile("rb") as answers:
        for _ in range(n):
            sock.sendall(head + body)
            status = answers.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"the gateway answered {status!r}")
            length = 0
            while (line := answers.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answers.read(length)


def count(code: Path, n: int, up_port: int, procs: Procs, work: Path) -> dict:
    """Calls per request of the gateway whose ``coral_hpc`` is in ``code``."""
    work.mkdir(parents=True)
    port = free_port()
    table = work / "table.json"
    write_routing_table(table, RoutingTable(version=1, models={
        "bench": (ReplicaRoute("up", f"http://127.0.0.1:{up_port}", 1.0),)}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(code / "solver")]))
    profile = work / "gateway.prof"
    # `python -m` puts the working directory first on sys.path, before PYTHONPATH: start the
    # gateway from its own folder so it runs ``code``, not whatever checkout we stand in
    os.chdir(work)
    proc = procs.start([sys.executable, "-m", "cProfile", "-o", str(profile),
                        str(Path(sys.executable).parent / "coral-hpc"), "gateway",
                        str(_models_yaml(work, port)), "--table", str(table),
                        "--log-level", "warning"], work / "gateway.log", env=env)
    wait_port(port)
    time.sleep(1.5)   # the first table poll
    _send(port, n)
    os.killpg(proc.pid, signal.SIGINT)   # the gateway stops cleanly; cProfile writes on exit
    proc.wait(30)
    stats = pstats.Stats(str(profile)).stats
    gateway = sum(v[1] for k, v in stats.items() if "coral_hpc/gateway/" in k[0])
    return {"code": code_version(code), "requests": n,
            "calls_per_request": round(sum(v[1] for v in stats.values()) / n, 1),
            "coral_hpc_gateway_calls_per_request": round(gateway / n, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-code", type=Path, required=True,
                        help="a checkout of the code before the change")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    procs = Procs()
    work = Path(tempfile.mkdtemp(prefix="coral-bench-calls-"))
    try:
        up_port = free_port()
        canned = CANNED.replace("'", "\\'")
        conf = nginx_conf(work, "upstream", up_port,
                          f"default_type application/json; return 200 '{canned}';", up_port)
        procs.start(["nginx", "-c", str(conf), "-g", "daemon off;"], work / "upstream.log")
        wait_port(up_port)
        before = count(args.before_code.resolve(), args.requests, up_port, procs, work / "before")
        after = count(REPO, args.requests, up_port, procs, work / "after")
    finally:
        procs.stop_all()
    doc = {"generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "request": BODY, "before": before, "after": after}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "gateway_calls.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Gateway: Python calls per request, before and after", "",
             f"Generated {doc['generated_at']} by `bench/gateway_calls.py`: `coral-hpc gateway` "
             f"under cProfile, {args.requests} completions (`{BODY}`) one after another on one "
             "keep-alive connection to a canned nginx upstream. Calls are counted, not timed, so "
             "other work on the machine does not move them.", "",
             "| build | code | calls per request | of them in coral_hpc/gateway |",
             "|---|---|---|---|"]
    for name, row in (("before", before), ("after", after)):
        lines.append(f"| {name} | {row['code']} | {row['calls_per_request']} | "
                     f"{row['coral_hpc_gateway_calls_per_request']} |")
    (args.results / "gateway_calls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
