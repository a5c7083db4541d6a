"""Busy cluster: how soon every model serves, coral-hpc vs one fixed sbatch per model.

On the local cluster (scripts/dev-cluster up; ``other-user`` adds the other lab), another lab
(Linux user ``coral-other``, its own account) keeps the GPUs busy with a stream of
time-limited jobs drawn from the Alibaba GPU trace's pod list
(../shared/data/traces/alibaba-gpu-v2023/openb_pod_list_default.csv: whole-GPU pods, their GPU
counts, arrival order and run times). The trace is time-scaled: run times ÷ ``--time-scale``
(capped at the phase length), and arrivals compressed so the stream offers
``--offered-load`` × the cluster's GPUs (the pod list is a sample for a packing simulator, not
a record of how full its cluster was: its own arrival rate keeps ~58 of 6,212 GPUs busy, see
the data README). Both phases replay the same stream from the same start.

1. **Fixed sbatch** (what labs do today): one job per model on its usual partition and shape
   — the one coral-hpc's own plan picks on an idle cluster — submitted at the start and
   resubmitted whenever it ends.
2. **coral-hpc serve** on examples/models.yaml (sim engine).

Per phase: seconds until every model has a running job (and, for coral-hpc, a READY replica),
and model-hours without a running replica within the phase ("replica-hours lost to queueing").
Run under the shared lock: ``flock /tmp/coral-slurm.lock .venv/bin/python bench/queue.py``.
Writes bench/results/queue.json and queue.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

# run as `python bench/queue.py`, this folder would shadow the standard library's `queue`
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coral_hpc.config import load_deployment
from coral_hpc.slurm import make_client
from harness import busy_cluster

TRACE = (
    REPO.parent / "shared" / "data" / "traces" / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
)
if not TRACE.exists():
    TRACE = Path("/work/shared/data/traces/alibaba-gpu-v2023/openb_pod_list_default.csv")
RESULTS = REPO / "bench" / "results"
CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]


@dataclass(frozen=True)
class Pod:
    arrival_s: float  # scaled, from the stream's start
    gpus: int
    run_s: float  # scaled


def load_stream(
    time_scale: float,
    offered_load: float,
    cluster_gpus: int,
    horizon_s: float,
    max_gpus: int,
    seed_offset: int,
) -> list[Pod]:
    """Whole-GPU pods of the trace in arrival order, run times ÷ ``time_scale`` (at least 10 s,
    at most ``horizon_s``): a first batch at once that covers the cluster's GPUs (each with a
    uniformly drawn remainder of its bounded run), then the
    rest with their arrivals compressed into ``horizon_s``, until Σ gpus × run = offered ×
    GPUs × ``horizon_s``."""
    rows = []
    with TRACE.open() as f:
        for r in csv.DictReader(f):
            gpus = int(r["num_gpu"])
            if gpus < 1 or (gpus == 1 and int(r["gpu_milli"] or 0) < 1000):
                continue  # GPU-sharing pods: Slurm GRES gives whole GPUs only
            if not r["scheduled_time"] or not r["deletion_time"]:
                continue
            run = int(r["deletion_time"]) - int(r["scheduled_time"])
            if run <= 0 or gpus > max_gpus:
                continue
            rows.append((int(r["creation_time"]), gpus, run))
    rows.sort()
    rows = rows[seed_offset:] + rows[:seed_offset]
    pods, t0 = [], rows[0][0]
    for created, gpus, run in rows:
        pods.append(Pod(float(created - t0), gpus, run / time_scale))

    def bounded(run_s: float) -> float:
        return min(max(run_s, 10.0), horizon_s)

    rng = random.Random(seed_offset)
    # the cluster is full when the stream begins: the first pods, until their GPUs cover the
    # cluster's, arrive at once (a lab that has kept it busy for a while), each with what is
    # left of its run: a job found running has done a uniformly drawn part of it (seeded by
    # --trace-offset). The trace's first pods run for months (the GPU-time-weighted median
    # pod of the whole list runs 50 days), so their scaled runs are capped at the warm-up +
    # phase first: the GPUs they hold come free at times spread over the run instead of
    # never, and the other lab's later pods compete for them with ours. The rest keep
    # coming, in the trace's order and with its gaps compressed over the whole warm-up and
    # phase, until everything offered reaches offered × GPUs × (warm-up + phase): the other
    # lab keeps offering that load until the phase ends (a stream that stopped early would
    # let the cluster drain, and every model start, whatever either side did)
    budget = offered_load * cluster_gpus * horizon_s
    fill, held, offered = [], 0, 0.0
    for pod in pods:
        if held >= cluster_gpus:
            break
        left = Pod(0.0, pod.gpus, bounded(bounded(pod.run_s) * rng.random()))
        fill.append(left)
        held += pod.gpus
        offered += pod.gpus * left.run_s
    rest = []
    for pod in pods[len(fill) :]:
        if offered >= budget:
            break
        rest.append(replace(pod, run_s=bounded(pod.run_s)))
        offered += pod.gpus * rest[-1].run_s
    if not rest:
        return fill
    first = rest[0].arrival_s
    span = max(rest[-1].arrival_s - first, 1.0)
    squeeze = horizon_s / span
    return fill + [Pod((p.arrival_s - first) * squeeze, p.gpus, p.run_s) for p in rest]


class OtherLab:
    """Submits the stream as coral-other, each pod when its arrival comes (partition gpu: any
    node, as a user who does not care which GPU runs a generic job)."""

    def __init__(self, pods: list[Pod]):
        self.pods = list(pods)
        self.next = 0
        self.submitted = 0

    def tick(self, elapsed: float) -> None:
        while self.next < len(self.pods) and self.pods[self.next].arrival_s <= elapsed:
            pod = self.pods[self.next]
            self.next += 1
            minutes = max(1, int(-(-pod.run_s // 60)))
            argv = [
                "runuser",
                "-u",
                busy_cluster.OTHER_USER,
                "--",
                "sbatch",
                "--parsable",
                "--chdir=/tmp",
                "-o",
                "/dev/null",
                "-e",
                "/dev/null",
                "-J",
                "other-lab",
                "-A",
                "other-lab",
                "-p",
                "gpu",
                f"--gres=gpu:{pod.gpus}",
                "-N",
                "1",
                "-n",
                "1",
                "--cpus-per-task=1",
                "--mem=1G",
                f"--time={minutes}",
                f"--wrap=sleep {int(pod.run_s)}",
            ]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            if out.returncode == 0:
                self.submitted += 1


def usual_shapes(config: Path, cache: Path) -> dict[str, dict]:
    """The shape coral-hpc's plan gives each model on an idle cluster (its usual partition)."""
    snapshot = json.loads(
        subprocess.run(
            [*CLI, "cluster", "--json", "--config", str(config)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            cwd=REPO,
        ).stdout
    )
    for node in snapshot["nodes"]:
        node.update(
            state="idle", gpus_alloc=0, gpus_free=node["gpus_total"], cpus_alloc=0, mem_alloc_gb=0.0
        )
    snapshot["jobs"] = []
    idle = cache / "idle-snapshot.json"
    idle.write_text(json.dumps(snapshot))
    out = subprocess.run(
        [*CLI, "plan", str(config), "--snapshot", str(idle), "--json", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=REPO,
    )
    shapes = {}
    for row in json.loads(out.stdout)["replicas"]:
        if row["model"] in shapes:
            continue
        stages = row["stages"]
        shapes[row["model"]] = {
            "partition": stages[0]["partition"],
            "gpu_type": stages[0]["gpu_type"],
            "gpus": row["tp"],
            "nodes": row["pp"],
            "homogeneous": len({(s["partition"], s["gpu_type"]) for s in stages}) == 1,
        }
    return shapes


def job_rows(user: str, name_prefix: str) -> list[tuple[str, str, str]]:
    out = subprocess.run(
        ["squeue", "-h", "-u", user, "-o", "%i|%T|%j"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return [
        tuple(line.split("|"))
        for line in out.splitlines()
        if line.split("|")[-1].startswith(name_prefix)
    ]  # type: ignore[misc]


def warm_up(lab: OtherLab, warmup_s: float) -> None:
    """Let the other lab's stream fill the cluster before our models are asked for."""
    began = time.monotonic()
    while time.monotonic() - began < warmup_s:
        lab.tick(time.monotonic() - began)
        time.sleep(0.5)


def run_fixed(
    shapes: dict[str, dict],
    pods: list[Pod],
    phase_s: float,
    warmup_s: float,
    cpus_per_gpu: int,
    mem_per_gpu_gb: int,
) -> dict:
    """One fixed sbatch per model on its usual shape, resubmitted when it ends."""
    tag = f"fixed{secrets.token_hex(2)}-"
    jobs: dict[str, str] = {}
    first_run: dict[str, float] = {}
    serving_s = dict.fromkeys(shapes, 0.0)
    lab = OtherLab(pods)
    start = time.monotonic()
    last = start
    submitted = 0
    refused: dict[str, str] = {}

    def submit(model: str) -> None:
        nonlocal submitted
        s = shapes[model]
        argv = [
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-J",
            f"{tag}{model}",
            "-p",
            s["partition"],
            f"--gres=gpu:{s['gpu_type']}:{s['gpus']}",
            "-N",
            str(s["nodes"]),
            f"--cpus-per-task={cpus_per_gpu * s['gpus']}",
            f"--mem={mem_per_gpu_gb * s['gpus']}G",
            "--time=30",
            "--wrap=sleep 1800",
        ]
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        if out.returncode != 0:
            refused[model] = out.stderr.strip()[:200]  # as a person would, they give up
            jobs.pop(model, None)
            return
        jobs[model] = out.stdout.strip().split(";")[0]
        submitted += 1

    try:
        warm_up(lab, warmup_s)
        start = last = time.monotonic()
        for model in shapes:
            submit(model)
        while time.monotonic() - start < phase_s:
            now = time.monotonic()
            lab.tick(now - start + warmup_s)
            states = {j: s for j, s, _ in job_rows("root", tag)}
            for model, job in list(jobs.items()):
                state = states.get(job)
                if state == "RUNNING":
                    serving_s[model] += now - last
                    first_run.setdefault(model, now - start)
                elif state is None:  # ended: resubmit, as a person watching the queue would
                    submit(model)
            last = now
            time.sleep(1.0)
    finally:
        ids = [j for j, _, _ in job_rows("root", tag)]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
        busy_cluster.cancel_other()
    summary = _summary(shapes, first_run, serving_s, phase_s, submitted, lab)
    summary["refused"] = refused
    return summary


def run_coral(
    config: Path,
    models: list[str],
    pods: list[Pod],
    phase_s: float,
    warmup_s: float,
    cache: Path,
    tmp: Path,
) -> dict:
    deployment = load_deployment(config)
    client = make_client("cli")
    lab = OtherLab(pods)
    first_run: dict[str, float] = {}
    first_ready: dict[str, float] = {}
    serving_s = dict.fromkeys(models, 0.0)
    log = open(tmp / "serve.log", "ab")  # noqa: SIM115 - closed below
    warm_up(lab, warmup_s)
    start = time.monotonic()
    serve = subprocess.Popen(
        [*CLI, "serve", str(config), "--listen", "127.0.0.1:0", "--cache-dir", str(cache)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    last = start
    last_status = -math.inf
    seen_jobs: set[str] = set()
    try:
        while time.monotonic() - start < phase_s:
            now = time.monotonic()
            lab.tick(now - start + warmup_s)
            running = set()
            for job in client.snapshot(deployment.deployment).jobs:
                if job.tag is None or job.end_kind is not None:
                    continue
                seen_jobs.add(job.job_id)
                if job.state == "RUNNING":
                    running.add(job.tag.model)
            for model in running:
                serving_s[model] += now - last
                first_run.setdefault(model, now - start)
            if Path(deployment.db_path).exists() and now - last_status >= 5.0:
                last_status = now
                out = subprocess.run(
                    [*CLI, "status", str(config), "--json"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    cwd=REPO,
                    check=False,
                )
                if out.returncode == 0:
                    for m in json.loads(out.stdout)["models"]:
                        if m["ready_replicas"]:
                            first_ready.setdefault(m["name"], time.monotonic() - start)
            last = now
            time.sleep(1.0)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        log.close()
        left = [j.job_id for j in client.snapshot(deployment.deployment).jobs if j.end_kind is None]
        if left:
            client.cancel(left)
        busy_cluster.cancel_other()
        # cancelled replicas still write their logs into the state folder for a moment: wait
        # until Slurm holds none of them, so the folder can go
        for _ in range(30):
            if not any(j.end_kind is None for j in client.snapshot(deployment.deployment).jobs):
                break
            time.sleep(1)
    summary = _summary({m: {} for m in models}, first_run, serving_s, phase_s, len(seen_jobs), lab)
    summary["first_ready_s"] = {m: round(first_ready[m], 1) for m in sorted(first_ready)}
    summary["all_ready_s"] = (
        round(max(first_ready.values()), 1) if set(first_ready) >= set(models) else None
    )
    return summary


def _summary(
    shapes: dict, first_run: dict, serving_s: dict, phase_s: float, jobs: int, lab: OtherLab
) -> dict:
    every = max(first_run.values()) if set(first_run) >= set(shapes) else None
    lost_h = sum(max(0.0, phase_s - serving_s[m]) for m in shapes) / 3600.0
    return {
        "first_running_s": {m: round(first_run[m], 1) for m in sorted(first_run)},
        "all_running_s": None if every is None else round(every, 1),
        "models_never_running": sorted(set(shapes) - set(first_run)),
        "replica_hours_lost": round(lost_h, 4),
        "jobs_submitted": jobs,
        "other_lab_jobs": lab.submitted,
    }


def config_copy(tmp: Path) -> Path:
    text = (REPO / "examples" / "models.yaml").read_text()
    for pattern, value in {
        r"(?m)^deployment: .*$": f"deployment: qbench{secrets.token_hex(2)}",
        r"(?m)^state_dir: .*$": f"state_dir: {tmp / 'shared'}",
        r"(?m)^db_path: .*$": f"db_path: {tmp / 'daemon' / 'coral.db'}",
        r"(?m)^  poll_interval_s: .*$": "  poll_interval_s: 2",
        r"(?m)^  replan_interval_s: .*$": "  replan_interval_s: 15",
    }.items():
        text, n = re.subn(pattern, value, text)
        assert n == 1, pattern
    path = tmp / "models.yaml"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # two phases and the set-up fit the shared lock's 8 minutes; at ÷20 the trace's pods
    # mostly outlast a phase (its median pod runs over an hour) and neither side got every
    # model running (the first run's queue.md), so ÷200 lets the cluster turn over within a
    # phase
    parser.add_argument("--phase-s", type=float, default=150.0)
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=30.0,
        help="the other lab's stream runs this long before the models are asked for",
    )
    parser.add_argument("--time-scale", type=float, default=200.0)
    parser.add_argument("--offered-load", type=float, default=1.3)
    parser.add_argument("--trace-offset", type=int, default=0, help="start at this pod")
    args = parser.parse_args()
    os.environ.setdefault("SLURM_CONF", "/var/tmp/coral-dev-cluster/etc/slurm.conf")
    # stopped (SIGTERM, or SIGINT where a background shell ignores it), the phases' finally
    # blocks still cancel every job they and the other lab submitted
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    busy_cluster.ensure_other_user()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    nodes = busy_cluster.gpu_nodes()
    cluster_gpus = sum(n.gpus for n in nodes)
    pods = load_stream(
        args.time_scale,
        args.offered_load,
        cluster_gpus,
        args.phase_s + args.warmup_s,
        max(n.gpus for n in nodes),
        args.trace_offset,
    )
    # a replica's last log line may land after the wait above: never lose the figures to it
    with tempfile.TemporaryDirectory(
        prefix="coral-queue-bench-", ignore_cleanup_errors=True
    ) as folder:
        tmp = Path(folder)
        cache = tmp / "templates"
        cache.mkdir()
        config = config_copy(tmp)
        deployment = load_deployment(config)
        models = [m.name for m in deployment.models]
        shapes = usual_shapes(config, cache)
        fixed = run_fixed(
            shapes,
            pods,
            args.phase_s,
            args.warmup_s,
            deployment.cluster.cpus_per_gpu,
            deployment.cluster.mem_per_gpu_gb,
        )
        fixed["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        time.sleep(5)
        coral = run_coral(config, models, pods, args.phase_s, args.warmup_s, cache, tmp)
        coral["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_at_start": load_at_start,
        "host": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "cluster_gpus": cluster_gpus,
        "stream": {
            "pods": len(pods),
            "gpus": sorted({p.gpus for p in pods}),
            "median_run_s": sorted(p.run_s for p in pods)[len(pods) // 2],
            "time_scale": args.time_scale,
            "offered_load": args.offered_load,
            "source": str(TRACE.name),
        },
        "phase_s": args.phase_s,
        "warmup_s": args.warmup_s,
        "usual_shapes": shapes,
        "fixed_sbatch": fixed,
        "coral_hpc": coral,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "queue.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "queue.md").write_text(markdown(result))
    print(markdown(result))


def _ratio(coral: float | None, fixed: float | None) -> str:
    return f"{coral / fixed:.2f}×" if coral is not None and fixed else ""


def markdown(r: dict) -> str:
    f, c = r["fixed_sbatch"], r["coral_hpc"]

    def secs(v):
        return "never (within the phase)" if v is None else f"{v:.0f} s"

    shapes = ", ".join(
        f"{m}: {s['partition']} {s['gpus']}×{s['gpu_type']}"
        + (f" × {s['nodes']} nodes" if s["nodes"] > 1 else "")
        for m, s in r["usual_shapes"].items()
    )
    s = r["stream"]
    load = (
        f"Load average (1, 5, 15 min): {r['load_at_start']} at the start, "
        f"{f.get('load_at_end')} after the fixed-sbatch phase, {c.get('load_at_end')} after "
        "the coral-hpc phase."
    )
    intro = (
        f"{r['when']} on {r['host']}; the local cluster ({r['cluster_gpus']} GPUs) kept "
        f"busy by another lab's job stream: {s['pods']} whole-GPU pods ({s['gpus']} GPUs "
        f"each) of {s['source']} (Alibaba GPU trace v2023), run times ÷ "
        f"{s['time_scale']:g} (at least 10 s; median {s['median_run_s']:.0f} s), arrivals "
        f"compressed to offer {s['offered_load']:g}× the GPUs over the warm-up and the "
        f"phase. The stream runs {r['warmup_s']:.0f} s before the models are asked for; each "
        f"phase then lasts {r['phase_s']:.0f} s, the same stream from the same start in both."
    )
    rows = [
        f"| every model running after | {secs(f['all_running_s'])} "
        f"| {secs(c['all_running_s'])} | {_ratio(c['all_running_s'], f['all_running_s'])} |",
        f"| every model READY after (fixed: running) | {secs(f['all_running_s'])} "
        f"| {secs(c.get('all_ready_s'))} | {_ratio(c.get('all_ready_s'), f['all_running_s'])} |",
        f"| model-hours without a running replica | {f['replica_hours_lost']:.3f} | "
        f"{c['replica_hours_lost']:.3f} | "
        f"{_ratio(c['replica_hours_lost'], f['replica_hours_lost'])} |",
        f"| models never running | {', '.join(f['models_never_running']) or 'none'} | "
        f"{', '.join(c['models_never_running']) or 'none'} | |",
        f"| jobs submitted | {f['jobs_submitted']} | {c['jobs_submitted']} | |",
    ]
    how = (
        "Fixed sbatch: each model's usual shape, the one coral-hpc plans on an idle cluster "
        f"({shapes}), submitted at the start and resubmitted when it ends; a fixed job runs "
        '`sleep`, so its "running" is the earliest it could serve (an engine would still '
        "load). coral-hpc: `serve` on examples/models.yaml with the sim engine; READY is its "
        "health check passing, seen by `status` (polled every 5 s). Per model first running "
        f"(s): fixed {f['first_running_s']}, coral-hpc {c['first_running_s']}; coral-hpc "
        f"first READY {c.get('first_ready_s')}."
    )
    noise = (
        "The machine is shared with other sessions' tests, so figures are noisy; the other "
        "lab's stream is the same in both phases but Slurm's decisions depend on timing. One "
        "run: a ratio from it is one sample, not a distribution."
    )
    return "\n".join(
        [
            "# Busy cluster: time to serve every model",
            "",
            intro,
            "",
            "| | fixed sbatch per model | coral-hpc | coral ÷ fixed |",
            "|---|---|---|---|",
            *rows,
            "",
            how,
            "",
            load,
            "",
            noise,
            "",
        ]
    )


if __name__ == "__main__":
    main()
