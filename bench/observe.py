"""Observe-cycle bench: the whole ``SlurmClient.snapshot`` cycle, Slurm commands included, with
10,000 real held jobs of this deployment in the local cluster's queue and node output for 1,000
nodes (derived by replicating the real recorded ``scontrol show node -o`` / ``show partition -o``
output of the dev cluster, renamed; the real commands still run, their answer is swapped for the
1,000-node text).

Reports, per cycle: Slurm's answer time (seconds spent in subprocesses), our own time (parse and
build, i.e. wall time minus Slurm's), and the number of Slurm calls per command kind.
Goals (issue 3): our own time ≤ 200 ms per cycle; one call per command kind per cycle.

    .venv/bin/python bench/observe.py [--jobs 10000] [--nodes 1000] [--cycles 5]

It loads the shared cluster: submits the held jobs in parallel, measures, and cancels every job
it submitted (also on error or Ctrl-C). Results: bench/results/observe.json and observe.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coral_hpc.slurm import CliSlurmClient, CommandRunner
from coral_hpc.slurm.parse_nodes import split_key_values
from coral_hpc.slurm.runner import CommandResult, command_kind
from coral_hpc.types import JobTag

DEPLOYMENT = "obsbench"
REC = REPO / "tests" / "data" / "slurm" / "22.05"
RESULTS = REPO / "bench" / "results"
DEV_CONF = "/var/tmp/coral-dev-cluster/etc/slurm.conf"


def synthetic_cluster(n_nodes: int) -> tuple[str, str]:
    """``scontrol show node -o`` and ``show partition -o`` text for ``n_nodes`` nodes, made by
    replicating the recorded real lines (each recorded node becomes a family of renamed copies;
    states, GRES, allocations and reasons are kept) and one partition per family plus ``gpu``."""
    lines = [ln for ln in (REC / "scontrol_show_node.txt").read_text().splitlines() if ln.strip()]
    families = []
    for line in lines:
        name = split_key_values(line)["NodeName"]
        families.append((name, line))
    node_lines: list[str] = []
    members: dict[str, list[str]] = {name: [] for name, _ in families}
    for index in range(n_nodes):
        base, line = families[index % len(families)]
        new = f"{base}-x{index:05d}"
        members[base].append(new)
        node_lines.append(line.replace(f"NodeName={base} ", f"NodeName={new} ", 1).replace(
            "Partitions=", f"Partitions=p-{base},", 1).replace(",a100,gpu", ",gpu").replace(
            ",v100,gpu", ",gpu").replace(",a100-80g,gpu", ",gpu"))
    template = next(ln for ln in (REC / "scontrol_show_partition.txt").read_text().splitlines()
                    if ln.startswith("PartitionName=gpu "))
    part_lines = []
    for base, names in members.items():
        line = template.replace("PartitionName=gpu ", f"PartitionName=p-{base} ").replace("Default=YES", "Default=NO")
        fields = split_key_values(template)
        part_lines.append(line.replace(f"Nodes={fields['Nodes']} ", f"Nodes={','.join(names)} "))
    all_names = [n for names in members.values() for n in names]
    fields = split_key_values(template)
    part_lines.append(template.replace(f"Nodes={fields['Nodes']} ", f"Nodes={','.join(all_names)} "))
    return "\n".join(node_lines) + "\n", "\n".join(part_lines) + "\n"


class SubstitutingRunner(CommandRunner):
    """Runs every command for real (so Slurm's answer time is real), then hands the parsers the
    1,000-node text instead of the 5-node answer for node and partition reads."""

    def __init__(self, nodes_text: str, partitions_text: str, **kw):
        super().__init__(**kw)
        self.substitute = {"scontrol show node": nodes_text, "scontrol show partition": partitions_text}

    def _run_once(self, argv, timeout_s, extra_env, ok_returncodes):
        result = super()._run_once(argv, timeout_s, extra_env, ok_returncodes)
        text = self.substitute.get(command_kind(argv))
        return result if text is None else CommandResult(result.argv, text, result.stderr, result.seconds)


def submit_held_jobs(runner: CommandRunner, count: int, workers: int = 6) -> list[str]:
    """``count`` real held jobs tagged as this deployment's replicas; returns their ids."""

    def submit(index: int) -> str:
        tag = JobTag(DEPLOYMENT, f"m{index % 7}", f"r{index}", "v100x1")
        out = runner.run(
            ["sbatch", "--parsable", "--hold", "--output=/dev/null", "-p", "v100", "--gres=gpu:v100:1",
             "-t", "10", "-J", tag.job_name(), f"--comment={tag.comment()}", "--wrap=true"],
            retry=False,
        )
        return out.stdout.strip().split(";")[0]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(submit, range(count)))


def cancel_all(runner: CommandRunner, ids: list[str]) -> None:
    for start in range(0, len(ids), 2000):
        runner.run(["scancel", *ids[start:start + 2000]], ok_returncodes=(0, 1))


def one_cycle(client: CliSlurmClient) -> dict:
    client.runner.reset_counters()
    started = time.perf_counter()
    snapshot = client.snapshot(DEPLOYMENT)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "slurm_s": client.runner.slurm_seconds,
        "ours_s": wall - client.runner.slurm_seconds,
        "calls": dict(client.runner.calls),
        "nodes": len(snapshot.nodes),
        "own_jobs": len(snapshot.jobs),
    }


def measure(client: CliSlurmClient, cycles: int) -> tuple[dict, list[dict]]:
    """The first cycle of a fresh client (cold: version, limits, every squeue line parsed), then
    ``cycles`` steady-state cycles as the daemon runs them every poll interval."""
    cold = one_cycle(client)
    return cold, [one_cycle(client) for _ in range(cycles)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ)
    if "SLURM_CONF" not in env and Path(DEV_CONF).exists():
        env["SLURM_CONF"] = DEV_CONF
    plain = CommandRunner(env=env, timeout_s=120)
    nodes_text, parts_text = synthetic_cluster(args.nodes)
    client = CliSlurmClient(SubstitutingRunner(nodes_text, parts_text, env=env, timeout_s=120))
    ids: list[str] = []
    try:
        started = time.perf_counter()
        ids = submit_held_jobs(plain, args.jobs)
        submit_s = time.perf_counter() - started
        cold, runs = measure(client, args.cycles)
    finally:
        cancel_all(plain, ids)
    ours = [r["ours_s"] for r in runs]
    slurm = [r["slurm_s"] for r in runs]
    calls = runs[-1]["calls"]
    result = {
        "bench": "observe",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "slurm_version": client.version(),
        "held_jobs_in_queue": len(ids),
        "nodes_in_node_output": runs[-1]["nodes"],
        "own_jobs_seen_per_cycle": runs[-1]["own_jobs"],
        "cycles": len(runs),
        "cold_cycle": cold,
        "ours_ms": {"median": 1000 * statistics.median(ours), "max": 1000 * max(ours)},
        "slurm_answer_ms": {"median": 1000 * statistics.median(slurm), "max": 1000 * max(slurm)},
        "calls_per_cycle": calls,
        "goal_ours_ms": 200,
        "goal_calls_per_kind": 1,
        "meets_time_goal": max(ours) <= 0.2,
        "meets_calls_goal": all(v == 1 for v in calls.values()),
        "submit_s": submit_s,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "observe.json").write_text(json.dumps(result, indent=2) + "\n")
    intro = (
        f"{len(ids)} real held jobs of deployment `{DEPLOYMENT}` in the queue; node output for "
        f"{result['nodes_in_node_output']} nodes (recorded dev-cluster lines replicated); "
        f"{len(runs)} steady-state cycles after the cold first cycle of a fresh client."
    )
    lines = [
        "# Observe cycle bench",
        "",
        f"{result['when']} on {result['machine']}; Slurm {result['slurm_version']}.",
        intro,
        "",
        "| per cycle | median | max | goal |",
        "|---|---|---|---|",
        (f"| our own work (parse + build), steady state | {result['ours_ms']['median']:.0f} ms | "
        f"{result['ours_ms']['max']:.0f} ms | ≤ 200 ms |"),
        (f"| Slurm's answer time, steady state | {result['slurm_answer_ms']['median']:.0f} ms | "
        f"{result['slurm_answer_ms']['max']:.0f} ms | — |"),
        (f"| our own work, cold first cycle (all {result['own_jobs_seen_per_cycle']} jobs parsed) | "
        f"{1000 * cold['ours_s']:.0f} ms | | — |"),
        "",
        "Slurm calls per steady-state cycle: " + ", ".join(f"`{k}` × {v}" for k, v in sorted(calls.items()))
        + " (goal: 1 per kind). The cold cycle also runs "
        + ", ".join(f"`{k}` × {v}" for k, v in sorted(cold["calls"].items()) if k not in calls)
        + " (cached afterwards: the version for the client's life, sacctmgr limits for 5 minutes).",
        "",
        (f"Own jobs seen per cycle: {result['own_jobs_seen_per_cycle']}. Submitting the held jobs "
        f"took {submit_s:.0f} s. The machine is shared with other sessions' tests, so figures are noisy."),
    ]
    (RESULTS / "observe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if result["meets_time_goal"] and result["meets_calls_goal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
