"""Reaction bench: how fast the daemon replaces a replica when the cluster moves under it, and
what that watching costs in Slurm calls.

A real daemon (``coral_hpc.daemon.core.Daemon`` with the real solver planner and the real CLI
Slurm client) serves one model (qwen3-8b, sim engine) on the local cluster's ``a100`` and
``v100`` partitions at the **default** polling and re-plan intervals (``policy`` left out of the
config). Measured, each repeated ``--reps`` times:

- **drain**: ``scontrol update PartitionName=<the replica's partition> State=DRAIN`` → the
  replacement job submitted (its ``submitted_at``) and READY (``ready_at``); the partition is
  resumed afterwards;
- **scancel**: ``scancel <the READY replica's job>`` → replacement submitted and READY.

Slurm calls are counted where they are made: every command the daemon's Slurm client runs
(``CommandRunner.calls``) plus one ``sbatch`` per submitit submission (submitit runs sbatch
itself). Reported per minute over a quiet steady-state window and over the whole run.
Goals (issue 6): ≤ 10 s from drain/scancel to the replacement submitted, ≤ 30 Slurm calls/min.

    .venv/bin/python bench/reaction.py [--reps 3] [--steady-s 60]

It uses the shared cluster: every job it submitted is cancelled and every partition it drained
is resumed in ``finally`` blocks (also on error or Ctrl-C).
Results: bench/results/reaction.json and reaction.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coral_hpc.config import load_deployment
from coral_hpc.plan.planner import Planner
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.slurm import make_client
from coral_hpc.store import open_store
from harness.daemon_setup import (
    SimModel,
    headless_daemon,
    write_models_yaml,
)
from harness.slurm_jobs import cancel_deployment
from harness.wait import wait_until

RESULTS = REPO / "bench" / "results"
DEV_SLURM_CONF = "/var/tmp/coral-dev-cluster/etc/slurm.conf"
GOAL_RESUBMIT_S = 10.0
GOAL_CALLS_PER_MIN = 30.0


def write_config(folder: Path) -> Path:
    """One model on the a100 and v100 partitions; no ``policy``: the default intervals."""
    return write_models_yaml(folder, f"bench{secrets.token_hex(3)}", time_limit="01:00:00",
                             partitions=("a100", "v100"),
                             models=(SimModel("qwen3-8b", (512, 128), 2),))


def slurm(env: dict, *argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=60, env=env)


class Bench:
    """The daemon under test, running its loops in threads, and what it submitted."""

    def __init__(self, config: Path, env: dict):
        self.env = env
        self.deployment = load_deployment(config)
        self.client = make_client("cli", env=env)
        self.daemon = headless_daemon(
            self.deployment, self.client,
            Planner(cache_dir=Path(tempfile.gettempdir()) / "coral-bench-templates"))
        self.store = self.daemon.store
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        # a connection of our own: reading never holds up the daemon's cycle
        self.reader = open_store(self.deployment.db_path, readonly=True)

    def start(self) -> None:
        self.threads = [loop.start() for loop in self.daemon.loops(self.stop)]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        self.daemon.observer.close()

    # ------------------------------------------------------------------ reading the store

    def replicas(self, live_only: bool = True):
        return self.reader.replicas(live_only=live_only)

    def ready(self):
        return [r for r in self.replicas() if r.ready_at is not None and r.cancelled_at is None
                and r.drain_requested_at is None and r.ended_at is None]

    def calls(self) -> int:
        """Slurm calls so far: client commands + one sbatch per submitit submission."""
        submitted = self.reader.replicas(live_only=False)
        submitit = sum(1 for r in submitted if r.submitted_at is not None
                       and len(set(r.partitions)) == 1)
        return sum(self.client.runner.calls.values()) + submitit


def one_ready(bench: Bench):
    ready = bench.ready()
    return ready[0] if len(ready) == 1 and len(bench.replicas()) == 1 else None


def replacement(bench: Bench, old_ids: set[str], since: float):
    for r in bench.replicas(live_only=False):
        if r.id not in old_ids and r.submitted_at is not None and r.created_at >= since - 1:
            return r
    return None


def measure(bench: Bench, kind: str, drained: set[str]) -> dict:
    """One disruption of the single READY replica; times to replacement submitted and READY."""
    first = wait_until(lambda: one_ready(bench), 180, "one READY replica and nothing else live")
    old_ids = {r.id for r in bench.replicas(live_only=False)}
    began = time.time()
    if kind == "drain":
        partition = first.partitions[0]
        drained.add(partition)
        slurm(bench.env, "scontrol", "update", f"PartitionName={partition}", "State=DRAIN")
    else:
        partition = first.partitions[0]
        slurm(bench.env, "scancel", str(first.job_id))
    new = wait_until(lambda: replacement(bench, old_ids, began), 120, "a replacement submitted")
    ready = wait_until(lambda: (r := next((x for x in bench.replicas(live_only=False)
                                          if x.id == new.id), None)) and r.ready_at and r,
                       180, "the replacement READY")
    # the old replica gone (drained + cancelled, or ended) before the next round
    wait_until(lambda: all(r.id != first.id for r in bench.replicas()), 180,
               "the old replica gone")
    if kind == "drain":
        slurm(bench.env, "scontrol", "update", f"PartitionName={partition}", "State=UP")
        drained.discard(partition)
    return {
        "kind": kind,
        "from_partition": partition,
        "to_partition": ",".join(ready.partitions),
        "to_submitted_s": round(new.submitted_at - began, 2),
        "to_ready_s": round(ready.ready_at - began, 2),
    }


def summary(rows: list[dict], key: str) -> dict:
    values = [r[key] for r in rows]
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2),
            "runs": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steady-s", type=float, default=60.0)
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("SLURM_CONF", DEV_SLURM_CONF)
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]  # submitit runs sbatch with this environment
    folder = Path(tempfile.mkdtemp(prefix="coral-reaction-"))
    bench = Bench(write_config(folder), env)
    settings = ReconcileSettings.from_policy(bench.deployment.policy)
    drained: set[str] = set()
    rows: list[dict] = []
    try:
        started = time.monotonic()
        calls_at_start = bench.calls()
        bench.start()
        wait_until(lambda: one_ready(bench), 180, "the first READY replica")
        # steady state: nothing changes; what does watching cost?
        before, t0 = bench.calls(), time.monotonic()
        time.sleep(args.steady_s)
        steady = (bench.calls() - before) / ((time.monotonic() - t0) / 60.0)
        for _ in range(args.reps):
            rows.append(measure(bench, "drain", drained))
            print(rows[-1], flush=True)
            rows.append(measure(bench, "scancel", drained))
            print(rows[-1], flush=True)
        total_min = (time.monotonic() - started) / 60.0
        overall = (bench.calls() - calls_at_start) / total_min
        by_kind = dict(bench.client.runner.calls)
    finally:
        for partition in drained:
            subprocess.run(["scontrol", "update", f"PartitionName={partition}", "State=UP"],
                           check=False, capture_output=True, env=env)
        bench.close()
        cancel_deployment(env, bench.deployment)
        bench.reader.close()
        bench.store.close()
    drains = [r for r in rows if r["kind"] == "drain"]
    cancels = [r for r in rows if r["kind"] == "scancel"]
    result = {
        "bench": "reaction",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "poll_interval_s": settings.poll_interval_s,
        "replan_interval_s": settings.replan_interval_s,
        "drain": {"to_submitted_s": summary(drains, "to_submitted_s"),
                  "to_ready_s": summary(drains, "to_ready_s")},
        "scancel": {"to_submitted_s": summary(cancels, "to_submitted_s"),
                    "to_ready_s": summary(cancels, "to_ready_s")},
        "slurm_calls_per_min": {"steady": round(steady, 1), "whole_run": round(overall, 1),
                                "client_calls_by_kind": by_kind},
        "goals": {"to_submitted_s": GOAL_RESUBMIT_S, "slurm_calls_per_min": GOAL_CALLS_PER_MIN},
        "runs": rows,
    }
    worst = max(r["to_submitted_s"] for r in rows)
    result["goals_met"] = {"to_submitted_s": worst <= GOAL_RESUBMIT_S,
                           "slurm_calls_per_min": steady <= GOAL_CALLS_PER_MIN
                           and overall <= GOAL_CALLS_PER_MIN}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reaction.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "reaction.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    def line(name, block):
        return (f"| {name} | {block['to_submitted_s']['median']} | {block['to_submitted_s']['max']}"
                f" | {block['to_ready_s']['median']} | {block['to_ready_s']['max']} |")
    calls = r["slurm_calls_per_min"]
    met = r["goals_met"]
    return "\n".join([
        "# Reaction bench",
        "",
        (f"{r['when']}, local dev cluster, {r['host']['cpus']} CPUs. One model (qwen3-8b, sim "
         f"engine), real solver planner, default intervals: poll {r['poll_interval_s']:g} s, "
         f"re-plan {r['replan_interval_s']:g} s. {r['drain']['to_submitted_s']['runs']} runs "
         "each."),
        "",
        "| disruption | → submitted, median s | max s | → READY, median s | max s |",
        "|---|---|---|---|---|",
        line("partition drain", r["drain"]),
        line("scancel", r["scancel"]),
        "",
        (f"Slurm calls per minute: **{calls['steady']}** in steady state, "
         f"**{calls['whole_run']}** over the whole run (client commands by kind: "
         f"{', '.join(f'{k} {v}' for k, v in sorted(calls['client_calls_by_kind'].items()))}; "
         "plus one sbatch per submitit submission)."),
        "",
        (f"Goals: ≤ {r['goals']['to_submitted_s']:g} s to resubmission — "
         f"{'met' if met['to_submitted_s'] else 'NOT met'}; "
         f"≤ {r['goals']['slurm_calls_per_min']:g} Slurm calls/min — "
         f"{'met' if met['slurm_calls_per_min'] else 'NOT met'}."),
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
