"""SLO check on the REAL engine: ``coral-hpc serve examples/vllm-cpu.yaml`` (vLLM's CPU build on
the local cluster), then open-loop Poisson load through the gateway at the demand the plan was
made for (from measured profiles), and at a multiple of it; the fraction of requests within each
model's TTFT and TPOT SLOs. Unlike bench/slo.py (the sim engine, whose latencies are the
planner's own model), nothing here is self-consistent by construction.

    flock /tmp/coral-slurm.lock flock /tmp/coral-bench.lock .venv/bin/python bench/slo_vllm.py \
        [--profile-here] [--demand-share 0.5] [--seconds 20] [--multipliers 1,3] [--each] \
        [--record-metrics FILE]

``--profile-here`` first measures the example's layouts on this host (``coral-hpc profile``, as
scripts/demo-vllm runs it, into the run's own folder) and plans from those: a profile holds for
the hardware it was measured on, and the CPU build's speed differs several-fold between hosts
(AVX-512 with bf16 against AVX2 alone). ``--demand-share F`` sets each model's demand to F times
the requests/s its layout served within the SLO when measured, in place of the file's: with
F = 0.5 the plan (20 % headroom) asks 0.6 of what a replica serves, and 3x asks 1.8 of it.

Writes bench/results/slo_vllm.{json,md} (``--out``: another name). Every node of the local
cluster is the same two cores: load each model alone (``--each``) to tell a layout's own figure
apart from the host being shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# python puts this script's folder first on the import path, where bench/queue.py would shadow
# the standard library's queue (anyio imports it once the load starts): the repo instead
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.loadtest.host import (
    Process,
    host_cpu,
    processes,
)
from coral_hpc.loadtest.phases import (
    GOAL,
    measured_capacity,
    phase_row,
    timings,
    with_demand,
)
from coral_hpc.profile import openloop
from coral_hpc.store import open_store

CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]
#: the goal, the phase length and the load generator are coral-hpc profile's own
#: (coral_hpc.profile.openloop): a capacity it measured is judged here as it was measured
MIN_REQUESTS = openloop.MIN_REQUESTS
phase_seconds = openloop.phase_seconds


async def load_every_model(url: str, loads: list[tuple[object, float]], seconds: float,
                           seed: int) -> dict[str, list[tuple[float, float] | None]]:
    """Every model's open-loop load at once (the plan is made for all of them sharing the
    cluster): ``loads`` is (model, rate) with the model's mix and SLO, each phase
    :func:`phase_seconds` of its rate."""
    runs = [openloop.open_loop_phase(
                url, m.name, rate, phase_seconds(rate, seconds), m.mix.input_tokens,
                m.mix.output_tokens,
                openloop.request_deadline(m.slo.ttft_s, m.slo.tpot_s, m.mix.output_tokens),
                random.Random(f"{seed}-{m.name}"))
            for m, rate in loads if rate > 0]
    names = [m.name for m, rate in loads if rate > 0]
    return {name: timings(phase) for name, phase in zip(names, await asyncio.gather(*runs))}


# ------------------------------------------------------- measuring on this host, demand from it

#: examples/vllm-cpu.yaml's layouts as scripts/demo-vllm profiles them (the example's comments
#: say why each): tiny-chat on one a100 node, tiny-llama's two-node v100 pipeline, tiny-qwen2's
#: v100+a100 hetjob with its uneven split
EXAMPLE_PROFILES = (("--model", "tiny-chat"), ("--model", "tiny-llama", "--pp", "2"),
                    ("--model", "tiny-qwen2", "--stages", "v100,a100"))


def profile_here(config: Path, env: dict | None = None,
                 commands: tuple[tuple[str, ...], ...] = EXAMPLE_PROFILES) -> list[Path]:
    """Run ``coral-hpc profile CONFIG ARGS --json`` for each of ``commands`` (one engine job at a
    time, on this host's cluster); the profile files written. Profiles already in the config's
    ``profiles_dir`` are reused, as the command does: point it at an empty folder to measure."""
    written: list[Path] = []
    for args in commands:
        out = subprocess.run([*CLI, "profile", str(config), *args, "--json"], cwd=REPO, env=env,
                             capture_output=True, text=True, check=False, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"coral-hpc profile {' '.join(args)} exited {out.returncode}:\n"
                               f"{out.stderr[-3000:]}")
        written += [Path(p) for p in json.loads(out.stdout)["profiles"]]
    return written


# ------------------------------------------------------- where a phase's time went (diagnostics)

# ---------------------------------------------------------------- the engine processes' footprint

def _tree(table: dict[int, Process], root_marker: str, exclude: int) -> list[int]:
    """Every process whose command line names ``root_marker`` (the replica jobs' state folder,
    which their batch scripts and submitit's loader name), and all their descendants: the
    replica entrypoints and every vLLM process they started — less ``exclude`` (``serve``) and
    its own descendants (the daemon and the gateway are not engine processes)."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.parent, []).append(pid)

    def descendants(pids: list[int]) -> set[int]:
        found, frontier = set(pids), list(pids)
        while frontier:
            for child in children.get(frontier.pop(), ()):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
        return found

    roots = [pid for pid, proc in table.items() if root_marker in proc.cmdline]
    return sorted(descendants(roots) - descendants([exclude]))


def footprint(root_marker: str, exclude: int) -> tuple[int, int, float, int]:
    """(RSS bytes, PSS bytes, CPU seconds so far, process count) of the replica jobs' process
    tree. RSS counts the pages processes share (torch's libraries) once per process; PSS splits
    them between the sharers, so the tree's PSS is what it takes of the machine."""
    rss = pss = ticks = 0
    table = processes()
    pids = _tree(table, root_marker, exclude)
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        ticks += table[pid].ticks
        rss += _kib(status, "VmRSS:")
        pss += _kib(rollup, "Pss:")
    return rss, pss, ticks / os.sysconf("SC_CLK_TCK"), len(pids)


def _kib(text: str, key: str) -> int:
    """Bytes of the ``key`` line (``VmRSS:  123 kB``) of a /proc file."""
    return next((int(line.split()[1]) * 1024 for line in text.splitlines()
                 if line.startswith(key)), 0)


class FootprintSampler(threading.Thread):
    """Samples the process tree's RSS and PSS every second; CPU use as the CPU seconds between
    start and stop over the wall time between them."""

    def __init__(self, root_marker: str, exclude: int) -> None:
        super().__init__(daemon=True)
        self.root_marker, self.exclude = root_marker, exclude
        self.rss: list[int] = []
        self.pss: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        self.began = time.monotonic()
        _, _, self.cpu0, self.processes = footprint(self.root_marker, self.exclude)
        self.cpu1 = self.cpu0
        while not self._stop_event.wait(1.0):
            rss, pss, self.cpu1, n = footprint(self.root_marker, self.exclude)
            self.rss.append(rss)
            self.pss.append(pss)
            self.processes = max(self.processes, n)
        self.ended = time.monotonic()

    def result(self) -> dict:
        self._stop_event.set()
        self.join()
        gib = 2**30
        return {"processes": self.processes,
                "peak_rss_gib": max(self.rss, default=0) / gib,
                "mean_rss_gib": sum(self.rss) / max(len(self.rss), 1) / gib,
                "peak_pss_gib": max(self.pss, default=0) / gib,
                "mean_pss_gib": sum(self.pss) / max(len(self.pss), 1) / gib,
                "cores": (self.cpu1 - self.cpu0) / max(self.ended - self.began, 1e-9)}


def plan_summary(plan) -> dict:
    """Per model: its replicas' layouts (layers per stage on partition), the capacity the plan
    counts on (the templates' req/s, from the measured profiles) and the demand it was made for."""
    out: dict = {}
    for row in plan.rows:
        info = out.setdefault(row["model"], {"layouts": [], "capacity_rps": 0.0,
                                             "demand_rps": plan.demand.get(row["model"], 0.0)})
        stages = " + ".join(f"{s['layers']} on {s['partition']}"
                            for s in row["layout"]["stages"])
        info["layouts"].append(f"{row['count']} x ({stages})")
        info["capacity_rps"] += row["count"] * row["throughput"]
    return out


def _profiles_line(profiles: dict) -> str:
    """Where the plan's figures were measured, for the results file."""
    host = profiles.get("host", "this host")
    if not profiles.get("measured_here"):
        return (f"Host: {host}. Planned from examples/vllm-cpu.profiles (measured earlier, on "
                "the host named there), with the file's demand.")
    capacity = ", ".join(f"{name} {rps:.2f}" for name, rps in profiles["capacity_rps"].items())
    demand = (f"; each model's demand {profiles['demand_share']:g} of that"
              if "demand_share" in profiles else "; the file's demand")
    return (f"Host: {host}. Profiled on this host first (`--profile-here`: `coral-hpc profile` "
            f"of the example's three layouts), req/s within the SLO: {capacity}{demand}.")


def write_results(results: dict, args: argparse.Namespace) -> None:
    """bench/results/OUT.{json,md} from what was measured so far (written after every phase, so
    a run stopped in its 3x phase still leaves its 1x figures)."""
    # per phase (1x, 3x, and with --each "1x alone", "3x alone"): None where not measured (yet)
    verdict = {name: {**{f"{label}_met": rows[label]["within_slo"] >= GOAL if label in rows
                         else None for label in ("1x", "1x alone")},
                      **{f"{label}_fails": rows[label]["within_slo"] < GOAL if label in rows
                         else None for label in ("3x", "3x alone")}}
               for name, rows in results["models"].items()}
    results["goal"], results["verdict"] = GOAL, verdict
    out_dir = REPO / "bench" / "results"
    (out_dir / f"{args.out}.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"# SLO check on the real engine (vLLM CPU build, {results['config']})", "",
             f"`bench/slo_vllm.py`, {results['date']}: `coral-hpc serve` of that file on the "
             "local cluster (every node is the same 2-core host; the load average says what "
             "else ran), every model's open-loop Poisson load at once through the gateway for "
             f"{args.seconds:g} s (longer where that gives fewer than {MIN_REQUESTS} requests), "
             "streaming, `ignore_eos`, at the demand the plan was made for (from the measured "
             f"profiles) and at a multiple. Goal: >= {GOAL:.0%} within TTFT and TPOT at 1x, "
             "below it at 3x. Every model READY after "
             f"{results['ready_after_s']} s."
             + (" Phases marked *alone* (`--each`) load one model at a time while the other "
                "replicas stay up and idle, as `coral-hpc profile` measured each layout alone."
                if args.each else ""), "",
             _profiles_line(results.get("profiles", {})), "",
             "The plan (`coral-hpc serve`'s first plan, from the measured profiles):", "",
             "| model | replicas (layers per stage on partition) | planned capacity req/s | "
             "planned demand req/s |", "|---|---|---|---|"]
    for name, info in results.get("plan", {}).items():
        lines.append(f"| {name} | {'; '.join(info['layouts'])} | {info['capacity_rps']:.2f} | "
                     f"{info['demand_rps']:.2f} |")
    lines += ["", "Load average (1 min) at each phase's start: " + ", ".join(
                 f"{k} {v:.1f}" for k, v in results.get("loadavg", {}).items()), "",
             "| model | load | req/s | requests | failed | within TTFT and TPOT | "
             "TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rows in results["models"].items():
        for mult, row in rows.items():
            lines.append(f"| {name} | {mult} | {row['rate']:.2f} | {row['requests']} | "
                         f"{row['failed']} | {row['within_slo']:.1%} | "
                         f"{'/'.join(map(str, row['ttft_ms']))} | "
                         f"{'/'.join(map(str, row['tpot_ms']))} |")
    lines += ["", "Engine processes (every replica job's process tree):", "",
              "| phase | processes | mean / peak RSS GiB | mean / peak PSS GiB | cores used |",
              "|---|---|---|---|---|"]
    for phase, f in results["footprint"].items():
        lines.append(f"| {phase} | {f['processes']} | {f['mean_rss_gib']:.1f} / "
                     f"{f['peak_rss_gib']:.1f} | {f['mean_pss_gib']:.1f} / "
                     f"{f['peak_pss_gib']:.1f} | {f['cores']:.2f} |")
    lines += ["", "RSS counts the pages the engine processes share once per process; PSS "
              "splits them between the sharers: the tree's PSS is what it takes of the machine. "
              "Cores: CPU seconds of the tree over the phase's wall time (the host has 2)."]
    (out_dir / f"{args.out}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "examples" / "vllm-cpu.yaml"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--multipliers", default="1,3")
    parser.add_argument("--idle-s", type=float, default=15.0,
                        help="seconds of idle footprint sampling once every model is READY")
    parser.add_argument("--out", default="slo_vllm",
                        help="results name: bench/results/OUT.{json,md}")
    parser.add_argument("--record-metrics", type=Path, default=None,
                        help="write one replica's /metrics (after the load) to this file")
    parser.add_argument("--each", action="store_true",
                        help="then every model's load alone, at each multiplier, the other "
                             "replicas up and idle")
    parser.add_argument("--profile-here", action="store_true",
                        help="measure the example's layouts on this host first and plan from "
                             "those (default: the example's profiles_dir)")
    parser.add_argument("--demand-share", type=float, default=None,
                        help="each model's demand = this share of its measured capacity "
                             "(default: the file's demand)")
    args = parser.parse_args()
    multipliers = [float(m) for m in args.multipliers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="coral-slo-vllm-"))
    profiles = tmp / "profiles" if args.profile_here else REPO / "examples" / "vllm-cpu.profiles"
    text = Path(args.config).read_text()
    text = re.sub(r"(?m)^deployment: .*$", f"deployment: slovllm{secrets.token_hex(2)}", text)
    text = re.sub(r"(?m)^state_dir: .*$", f"state_dir: {tmp / 'shared'}", text)
    text = re.sub(r"(?m)^db_path: .*$", f"db_path: {tmp / 'coral.db'}", text)
    text = re.sub(r"(?m)^profiles_dir: .*$", f"profiles_dir: {profiles}", text)
    config = tmp / "models.yaml"
    config.write_text(text)
    measured: dict = {"host": host_cpu(), "measured_here": args.profile_here}
    if args.demand_share is not None and not args.profile_here:
        parser.error("--demand-share needs --profile-here (the capacities measured here)")
    if args.profile_here:
        print("profiling the example's layouts on this host into", profiles, flush=True)
        capacity = measured_capacity(profile_here(config), load_deployment(config))
        measured["capacity_rps"] = capacity
        print("measured capacity (req/s within the SLO):", capacity, flush=True)
    if args.demand_share is not None:
        measured["demand_share"] = args.demand_share
        text = with_demand(text, {name: args.demand_share * rps for name, rps in capacity.items()})
        config.write_text(text)
    deployment = load_deployment(config)
    began = time.monotonic()
    serve = subprocess.Popen([*CLI, "serve", str(config), "--listen", "127.0.0.1:0"], cwd=REPO,
                             stdout=open(tmp / "serve.log", "wb"),  # noqa: SIM115 - lives with serve
                             stderr=subprocess.STDOUT)
    results: dict = {"config": str(Path(args.config).relative_to(REPO))
                     if Path(args.config).is_relative_to(REPO) else args.config,
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "seconds": args.seconds, "models": {}, "footprint": {},
                     "profiles": measured}
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            out = subprocess.run([*CLI, "status", str(config), "--json"], capture_output=True,
                                 text=True, check=False, cwd=REPO)
            if out.returncode == 0:
                data = json.loads(out.stdout)
                if all(m["ready_replicas"] >= 1 for m in data["models"]):
                    break
            time.sleep(3)
        else:
            raise SystemExit("not every model READY within 900 s")
        results["ready_after_s"] = round(time.monotonic() - began)
        results["replicas"] = [{k: r.get(k) for k in ("model", "id", "job_id", "state",
                                                       "endpoint")} for r in data["replicas"]]
        print("every model READY after", results["ready_after_s"], "s", flush=True)
        sampler = FootprintSampler(str(tmp / 'shared'), serve.pid)
        sampler.start()
        time.sleep(args.idle_s)
        results["footprint"]["idle"] = sampler.result()
        print("idle footprint", results["footprint"]["idle"], flush=True)
        store = open_store(deployment.db_path, readonly=True)
        plan = store.latest_plan()
        store.close()
        results["plan"] = plan_summary(plan)
        url = f"http://{read_info(info_path(deployment))['gateway']}"
        # every model's load at once (the plan serves them together); with --each, then every
        # model's alone while the other replicas idle: on this host all "nodes" are the same two
        # cores, so that tells the layout's own figure apart from the host being shared
        phases = [(f"{m:g}x", m, None) for m in multipliers]
        if args.each:
            phases += [(f"{m:g}x alone", m, model.name) for m in multipliers
                       for model in deployment.models]
        for label, multiplier, only in phases:
            loads = [(m, plan.demand[m.name] * multiplier) for m in deployment.models
                     if only is None or m.name == only]
            phase = label if only is None else f"{label} {only}"
            results.setdefault("loadavg", {})[phase] = os.getloadavg()[0]
            sampler = FootprintSampler(str(tmp / 'shared'), serve.pid)
            sampler.start()
            got = asyncio.run(load_every_model(url, loads, args.seconds, seed=7))
            results["footprint"][phase] = sampler.result()
            for model in deployment.models:
                if only is not None and model.name != only:
                    continue
                row = phase_row(model, plan.demand[model.name] * multiplier,
                                got.get(model.name, []))
                results["models"].setdefault(model.name, {})[label] = row
                print(model.name, label, row, flush=True)
            write_results(results, args)
            if args.record_metrics and label == "1x":
                endpoint = next(r["endpoint"] for r in results["replicas"] if r["endpoint"])
                with urllib.request.urlopen(f"{endpoint}/metrics", timeout=10) as r:
                    args.record_metrics.write_bytes(r.read())
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        subprocess.run([*CLI, "down", str(config), "--grace", "30"], check=False, cwd=REPO)
    write_results(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
