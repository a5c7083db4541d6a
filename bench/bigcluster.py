"""Big-cluster bench: the daemon on a live Slurm the size of a real site.

On the big local cluster (``scripts/dev-cluster up --big``: 256 emulated nodes of five GPU
types in overlapping partitions, >= 5,000 running and queued jobs of two other labs), measured
in one run:

- **observe cycle**: ``CliSlurmClient.snapshot`` with the real commands against that cluster —
  our own work (wall time minus Slurm's answer time) per steady-state cycle, and calls per kind;
- **Slurm calls per minute** of a real daemon (``coral_hpc.daemon.core.Daemon``, real solver
  planner with start-estimate probes, real CLI client charged to its one call budget
  ``cluster.slurm.calls_per_min``) in steady state: one model served on the free nodes and one
  queued on the full h100 partition, so every re-plan asks Slurm for start estimates. Counted
  where they are made: every command the daemon's client runs (probes included) plus one sbatch
  per submitit submission. Reported as the mean over the window and the busiest 60 s in it;
- **daemon RSS**: this process (the daemon, its planner, the bench's bookkeeping) — VmRSS at the
  end and its peak VmHWM, an upper bound on the daemon's own;
- **replacement after a drain**: ``scontrol update NodeName=<the READY replica's node>
  State=DRAIN`` → replacement submitted and READY (the node is resumed afterwards).

Goals (issue 15 item 4): own work <= 200 ms per cycle, <= 30 calls/min including probes,
RSS <= 300 MB, replacement <= 10 s.

    .venv/bin/python bench/bigcluster.py [--cycles 10] [--steady-s 180] [--reps 2]

It never touches the shared default cluster: it refuses a SLURM_CONF that is not the big one.
Every job it submitted is cancelled and every node it drained resumed (also on error or Ctrl-C).
Results: bench/results/bigcluster.json and bigcluster.md.
"""

from __future__ import annotations

import os
import sys

# bench/ itself must not be on the path: bench/queue.py would shadow the standard library's
# queue module (concurrent.futures imports it)
sys.path[:] = [p for p in sys.path
               if os.path.realpath(p or ".") != os.path.dirname(os.path.realpath(__file__))]

import argparse
import collections
import json
import platform
import secrets
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coral_hpc.config import load_deployment, slurm_calls_per_min
from coral_hpc.plan.planner import Planner
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.slurm import CliSlurmClient, CommandRunner, make_client
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.store import open_store
from harness.daemon_setup import (
    big_cluster_yaml,
    headless_daemon,
)
from harness.slurm_jobs import cancel_deployment
from harness.wait import wait_until

RESULTS = REPO / "bench" / "results"
BIG_CONF = "/var/tmp/coral-big-cluster/etc/slurm.conf"
GOALS = {"observe_ours_ms": 200.0, "calls_per_min": 30.0, "rss_mb": 300.0, "replaced_s": 10.0}


def slurm(env: dict, *argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=120,
                          env=env).stdout


def cluster_facts(env: dict) -> dict:
    """What the cluster holds: nodes, GPU types, partitions, other users' jobs by state/reason."""
    nodes = slurm(env, "sinfo", "-h", "-N", "-o", "%N %G").split("\n")
    gpu_types = sorted({line.split(":")[1] for line in nodes if ":" in line})
    partitions = slurm(env, "sinfo", "-h", "-o", "%R").split()
    jobs = slurm(env, "squeue", "-h", "-r", "-o", "%u|%T|%r").splitlines()
    me = slurm(env, "id", "-un").strip()
    others = [j.split("|") for j in jobs if j.split("|")[0] != me]
    states = collections.Counter(s for _, s, _ in others)
    reasons = collections.Counter(r for _, s, r in others if s == "PENDING")
    return {"nodes": len({line.split()[0] for line in nodes if line.strip()}),
            "gpu_types": gpu_types, "partitions": sorted(set(partitions)),
            "other_users": sorted({u for u, _, _ in others}),
            "other_jobs": len(others), "other_jobs_by_state": dict(states),
            "pending_reasons": dict(reasons.most_common(6))}


# --------------------------------------------------------------------------- observe cycle


def observe_cycles(env: dict, cycles: int) -> dict:
    client = CliSlurmClient(CommandRunner(env=env, timeout_s=120))
    runs = []
    for index in range(cycles + 1):
        client.runner.reset_counters()
        began = time.perf_counter()
        snap = client.snapshot("bigbench-observe")
        wall = time.perf_counter() - began
        runs.append({"cold": index == 0, "wall_s": wall, "slurm_s": client.runner.slurm_seconds,
                     "ours_s": wall - client.runner.slurm_seconds,
                     "calls": dict(client.runner.calls), "nodes": len(snap.nodes),
                     "partitions": len(snap.partitions)})
    steady = [r for r in runs if not r["cold"]]
    ours = [1000 * r["ours_s"] for r in steady]
    answer = [1000 * r["slurm_s"] for r in steady]
    return {"cold": runs[0], "cycles": len(steady),
            "ours_ms": {"median": statistics.median(ours), "max": max(ours)},
            "slurm_answer_ms": {"median": statistics.median(answer), "max": max(answer)},
            "calls_per_cycle": steady[-1]["calls"], "nodes": steady[-1]["nodes"],
            "partitions": steady[-1]["partitions"]}


# --------------------------------------------------------------------------- the daemon


class CallLog:
    """Samples a growing call count every 0.5 s, for the mean rate and the busiest minute."""

    def __init__(self, count):  # type: ignore[no-untyped-def]
        self.count = count
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.count()))
            self.stop.wait(0.5)

    def window(self, start: float, end: float) -> dict:
        inside = [s for s in self.samples if start <= s[0] <= end]
        mean = (inside[-1][1] - inside[0][1]) / ((inside[-1][0] - inside[0][0]) / 60.0)
        busiest = 0
        for t, n in inside:
            later = [m for u, m in inside if t <= u <= t + 60.0]
            if inside[-1][0] >= t + 59.5:
                busiest = max(busiest, later[-1] - n)
        return {"mean_per_min": round(mean, 1), "busiest_60s": busiest,
                "window_s": round(inside[-1][0] - inside[0][0], 1)}


def rss_mb() -> dict:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
            "peak_rss_mb": int(fields["VmHWM"].split()[0]) / 1024}


def run_daemon(env: dict, steady_s: float, reps: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="coral-bigbench-"))
    deployment = load_deployment(big_cluster_yaml(folder, f"bigbench{secrets.token_hex(3)}"))
    budget = CallBudget(slurm_calls_per_min(deployment),
                        probe_calls_per_min=deployment.cluster.slurm.probe_calls_per_min)
    client = make_client("cli", env=env, budget=budget, timeout_s=120)
    planner = Planner(cache_dir=Path(tempfile.gettempdir()) / "coral-bench-templates", probe=True)
    planner.use_client(client)
    daemon = headless_daemon(deployment, client, planner, budget=budget)
    reader = open_store(deployment.db_path, readonly=True)
    settings = ReconcileSettings.from_policy(deployment.policy)

    def submitit_calls() -> int:  # submitit runs sbatch itself: one per single-partition replica
        return sum(1 for r in reader.replicas(live_only=False)
                   if r.submitted_at is not None and len(set(r.partitions)) == 1)

    log = CallLog(lambda: budget.spent + submitit_calls())
    stop = threading.Event()
    drained: set[str] = set()
    rows: list[dict] = []
    threads: list[threading.Thread] = []

    def ready_chat():  # type: ignore[no-untyped-def]
        live = [r for r in reader.replicas() if r.model == "chat" and r.ended_at is None
                and r.cancelled_at is None and r.drain_requested_at is None]
        return live[0] if len(live) == 1 and live[0].ready_at is not None else None

    def queued_reasoner():  # type: ignore[no-untyped-def]
        return any(r.model == "reasoner" and r.job_id and r.slurm_state == "PENDING"
                   for r in reader.replicas())

    try:
        log.thread.start()
        threads = [loop.start() for loop in daemon.loops(stop)]
        started = time.monotonic()
        wait_until(lambda: ready_chat() and queued_reasoner(), 300,
                   "chat READY and reasoner queued on h100")
        settled = time.monotonic()
        time.sleep(steady_s)
        steady_end = time.monotonic()
        probes_steady = client.runner.calls.get("sbatch", 0)
        for _ in range(reps):
            first = wait_until(ready_chat, 180, "one READY chat replica")
            old = {r.id for r in reader.replicas(live_only=False)}
            node = (first.nodes or "").split(",")[0]
            began = time.time()
            drained.add(node)
            slurm(env, "scontrol", "update", f"NodeName={node}", "State=DRAIN",
                  "Reason=coral-bigbench")
            new = wait_until(lambda: next((r for r in reader.replicas(live_only=False)
                                           if r.id not in old and r.model == "chat"
                                           and r.submitted_at is not None), None), 120,
                             "a replacement submitted")
            ready = wait_until(lambda: next((r for r in reader.replicas(live_only=False)
                                             if r.id == new.id and r.ready_at), None), 180,
                               "the replacement READY")
            wait_until(lambda: all(r.id != first.id for r in reader.replicas()), 180,
                       "the old replica gone")
            slurm(env, "scontrol", "update", f"NodeName={node}", "State=RESUME")
            drained.discard(node)
            rows.append({"drained_node": node, "to_node": ready.nodes,
                         "to_submitted_s": round(new.submitted_at - began, 2),
                         "to_ready_s": round(ready.ready_at - began, 2)})
            print(rows[-1], flush=True)
        steady = log.window(settled, steady_end)
        whole = log.window(started, time.monotonic())
        memory = rss_mb()
        calls_by_kind = dict(client.runner.calls)
    finally:
        stop.set()
        log.stop.set()
        for thread in threads:
            thread.join(60)
        for node in drained:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           check=False, capture_output=True, env=env)
        daemon.observer.close()
        cancel_deployment(env, deployment)
        reader.close()
        daemon.store.close()
    return {"steady": steady, "whole_run": whole, "probes_in_steady_window": probes_steady,
            "calls_by_kind": calls_by_kind, "memory": memory, "drains": rows,
            "poll_interval_s": settings.poll_interval_s,
            "replan_interval_s": settings.replan_interval_s,
            "calls_per_min_budget": slurm_calls_per_min(deployment),
            "probe_calls_per_min": deployment.cluster.slurm.probe_calls_per_min}


# --------------------------------------------------------------------------- report


def markdown(r: dict) -> str:
    c, o, d = r["cluster"], r["observe"], r["daemon"]
    met = r["goals_met"]
    drains = d["drains"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    return "\n".join([
        "# Big-cluster bench",
        "",
        (f"{r['when']} on {r['machine']}; Slurm {r['slurm_version']}. The big local cluster "
         f"(`scripts/dev-cluster up --big`): {c['nodes']} nodes, GPU types "
         f"{', '.join(c['gpu_types'])}; partitions {', '.join(c['partitions'])} (overlapping); "
         f"{c['other_jobs']} jobs of other users ({', '.join(c['other_users'])}): "
         + ", ".join(f"{v} {k}" for k, v in sorted(c["other_jobs_by_state"].items()))
         + "; pending because " + ", ".join(f"{k} {v}" for k, v in c["pending_reasons"].items())
         + "."),
        "",
        "| measured | median | max / busiest | goal | |",
        "|---|---|---|---|---|",
        (f"| observe cycle, our own work (parse + build), {o['cycles']} steady cycles | "
         f"{o['ours_ms']['median']:.0f} ms | {o['ours_ms']['max']:.0f} ms | ≤ 200 ms | "
         f"{verdict(met['observe_ours_ms'])} |"),
        (f"| observe cycle, Slurm's answer time | {o['slurm_answer_ms']['median']:.0f} ms | "
         f"{o['slurm_answer_ms']['max']:.0f} ms | — | |"),
        (f"| daemon's Slurm calls per minute, steady state, probes included "
         f"({d['steady']['window_s']:.0f} s) | {d['steady']['mean_per_min']} | "
         f"{d['steady']['busiest_60s']} in the busiest 60 s | ≤ 30 | "
         f"{verdict(met['calls_per_min'])} |"),
        (f"| daemon RSS (this process: daemon + planner + bench) | {d['memory']['rss_mb']:.0f} MB"
         f" | {d['memory']['peak_rss_mb']:.0f} MB peak | ≤ 300 MB | {verdict(met['rss_mb'])} |"),
        (f"| node drain → replacement submitted ({len(drains)} runs) | "
         f"{statistics.median(x['to_submitted_s'] for x in drains):.1f} s | "
         f"{max(x['to_submitted_s'] for x in drains):.1f} s | ≤ 10 s | "
         f"{verdict(met['replaced_s'])} |"),
        (f"| node drain → replacement READY | "
         f"{statistics.median(x['to_ready_s'] for x in drains):.1f} s | "
         f"{max(x['to_ready_s'] for x in drains):.1f} s | — | |"),
        "",
        ("Observe calls per cycle: " + ", ".join(f"`{k}` × {v}" for k, v in
                                                  sorted(o["calls_per_cycle"].items())) + "."),
        (f"The daemon ran at the default intervals (poll {d['poll_interval_s']:g} s, re-plan "
         f"{d['replan_interval_s']:g} s) with one budget of {d['calls_per_min_budget']:g} Slurm "
         f"calls a minute, of which start estimates take at most "
         f"{d['probe_calls_per_min']:g} (`sbatch --test-only`: {d['probes_in_steady_window']} by"
         " the end of the steady window): at most that many calls in any 60 s, counted over a "
         "sliding window; the reconcile loop waits for room, so the poll interval stretches "
         "while probes run. Whole run, drains included: "
         f"{d['whole_run']['mean_per_min']} calls/min. Client commands by kind: "
         + ", ".join(f"{k} {v}" for k, v in sorted(d["calls_by_kind"].items()))
         + "; plus one sbatch per submitit submission."),
        "",
        ("Models: `chat` (qwen3-8b, sim engine) on a100/v100/l40s, where a few nodes are free; "
         "`reasoner` on h100 only, which the other labs fill, so it stays queued and every "
         "re-plan probes. The host is 2 cores shared with other sessions: figures are noisy."),
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--steady-s", type=float, default=180.0)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    env = dict(os.environ)
    env["SLURM_CONF"] = env.get("CORAL_BIG_SLURM_CONF", BIG_CONF)
    if "coral-dev-cluster" in env["SLURM_CONF"] or not Path(env["SLURM_CONF"]).exists():
        sys.exit(f"{env['SLURM_CONF']}: not the big cluster (scripts/dev-cluster up --big)")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]  # submitit runs sbatch with this environment
    facts = cluster_facts(env)
    if facts["nodes"] < 256 or facts["other_jobs"] < 5000:
        sys.exit(f"the big cluster is not full: {facts['nodes']} nodes, {facts['other_jobs']} "
                 "jobs of other users (scripts/dev-cluster up --big, or fill --big)")
    observe = observe_cycles(env, args.cycles)
    daemon = run_daemon(env, args.steady_s, args.reps)
    result = {
        "bench": "bigcluster",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
                   f"Python {platform.python_version()}",
        "slurm_version": CliSlurmClient(CommandRunner(env=env)).version(),
        "cluster": facts, "observe": observe, "daemon": daemon, "goals": GOALS,
    }
    result["goals_met"] = {
        "observe_ours_ms": observe["ours_ms"]["max"] <= GOALS["observe_ours_ms"],
        "calls_per_min": daemon["steady"]["mean_per_min"] <= GOALS["calls_per_min"],
        "rss_mb": daemon["memory"]["peak_rss_mb"] <= GOALS["rss_mb"],
        "replaced_s": max(x["to_submitted_s"] for x in daemon["drains"]) <= GOALS["replaced_s"],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bigcluster.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "bigcluster.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(result["goals_met"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
