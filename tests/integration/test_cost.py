"""`coral-hpc cost --json` on the real local cluster (slurmdbd) against hand-computed figures.

Jobs of known length, GPU count, type and partition are submitted with a coral JobTag (job name
and comment), in the job shape the deployment asks for (cpus_per_gpu, mem_per_gpu_gb): a
completed job, a job crossing the range start, a running job, a requeued job and a hetjob. The
expected GPU-seconds and cost are worked out here from the shapes and the start/end times Slurm
recorded, and compared with what the command prints — exactly, in whole seconds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.slurm import client_for_deployment
from coral_hpc.slurm.snapshot import AccountingRecord
from coral_hpc.types import JobTag
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

CPUS_PER_GPU, MEM_PER_GPU_GB = 4, 8
PRICES = {"v100": 1.0, "a100": 2.5}


def models_yaml(path: Path, deployment: str, billing: bool) -> Path:
    def price(gpu: str) -> str:
        return "billing" if billing else f"{{{gpu}: {PRICES[gpu]}}}"

    path.write_text(
        f"""
deployment: {deployment}
state_dir: {path.parent}/state
db_path: {path.parent}/no-daemon.db
engine: {{kind: sim}}
cluster:
  cpus_per_gpu: {CPUS_PER_GPU}
  mem_per_gpu_gb: {MEM_PER_GPU_GB}
  partitions:
    - {{name: v100, gpu_types: [v100], price: {price("v100")}}}
    - {{name: a100, gpu_types: [a100], price: {price("a100")}}}
models:
  - {{name: m1, source: x, architecture: x, mix: {{input_tokens: 1, output_tokens: 1}},
      demand: auto, slo: {{ttft_s: 1, tpot_s: 0.1}}}}
"""
    )
    return path


def shape(partition: str, gpus: int) -> list[str]:
    return ["-p", partition, f"--gres=gpu:{partition}:{gpus}", f"-c{CPUS_PER_GPU * gpus}",
            f"--mem={MEM_PER_GPU_GB * gpus}G", "-N1", "-t", "10"]


def tagged(deployment: str, model: str, replica: str) -> list[str]:
    tag = JobTag(deployment, model, replica, "tpl")
    return ["-J", tag.job_name(), f"--comment={tag.comment()}"]


def sacct_runs(slurm, job_ids: list[str]) -> list[dict[str, str]]:
    out = slurm.run("sacct", "-n", "-P", "-X", "--duplicates", "-S", "now-1hours", "-j",
                    ",".join(job_ids), "-o", "JobID,State,Start,End,AllocTRES,Partition")
    keys = ("JobID", "State", "Start", "End", "AllocTRES", "Partition")
    return [dict(zip(keys, line.split("|"))) for line in out.stdout.splitlines() if line.strip()]


def epoch(text: str) -> float | None:
    return None if text in ("Unknown", "None", "") else datetime.fromisoformat(text).timestamp()


def state(slurm, job_id: str) -> str:
    return slurm.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()


def partitions_up(slurm, names: tuple[str, ...]) -> bool:
    out = slurm.run("sinfo", "-h", "-o", "%R %a", check=False).stdout.split("\n")
    avail = dict(line.split() for line in out if len(line.split()) == 2)
    return all(avail.get(name) == "up" for name in names)


def booked(path: Path, since: float, job_ids: list[str], env: dict[str, str]) -> list[AccountingRecord]:
    """The runs of ``job_ids`` (hetjob components included) that the range query ``coral-hpc
    cost`` runs (its own client: sacct -S/-E) returns for ``path``'s deployment, up to now.

    ``sacct -j`` shows a finished job's End before slurmdbd has recorded the job's eligible
    time, and the range query selects on that time: for a moment (seen: ~2 s on 22.05, for a
    job that starts the second it is submitted) the books hold the job by id but not by range.
    A test waits on this, the event cost depends on, not on ``sacct -j``."""
    config = load_deployment(path)
    client = client_for_deployment(config, env=env)
    wanted = set(job_ids)
    records = client.accounting(config.deployment, since, math.floor(time.time()))
    return [r for r in records if r.job_id.split("+")[0] in wanted]


def run_cost(path: Path, since: float, until: float, env: dict[str, str]) -> dict:
    """`coral-hpc cost FILE --json` as a user runs it (a new process)."""
    out = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "cost", str(path),
         "--json", "--since", f"@{int(since)}", "--until", f"@{int(until)}"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_cost_json_matches_hand_computed_figures(slurm, tmp_path):
    deployment = f"costit-{uuid.uuid4().hex[:6]}"
    # other tests drain partitions for a moment: start once both are up
    wait_until(lambda: partitions_up(slurm, ("a100", "v100")), 120, "partitions a100, v100 UP")
    # the crossing job first: the range will start 2 s into it, before every other job starts
    cross = slurm.sbatch(*shape("a100", 2), *tagged(deployment, "cross", "r1"), "--wrap=sleep 8")
    wait_until(lambda: state(slurm, cross) == "RUNNING", 30, f"job {cross} RUNNING")
    time.sleep(3)
    done = slurm.sbatch(*shape("v100", 2), *tagged(deployment, "done", "r1"), "--wrap=sleep 3")
    running = slurm.sbatch(*shape("a100", 1), *tagged(deployment, "run", "r1"), "--wrap=sleep 600")
    # the first run lasts until it is requeued, however late that comes on a slow host; the
    # second (SLURM_RESTART_COUNT=1) is a `sleep 4`
    rq = slurm.sbatch(*shape("v100", 1), *tagged(deployment, "rq", "r1"),
                      '--wrap=if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 600; else sleep 4; fi')
    het_script = tmp_path / "het.sh"
    tag = JobTag(deployment, "het", "r1", "tpl")
    het_script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH {' '.join(shape('a100', 1))} -J {tag.job_name()}\n"
        f"#SBATCH --comment={tag.comment()}\n"
        "#SBATCH hetjob\n"
        f"#SBATCH {' '.join(shape('v100', 2))}\n"
        "sleep 3\n"
    )
    het = slurm.sbatch(str(het_script))

    wait_until(lambda: state(slurm, rq) == "RUNNING", 30, f"job {rq} RUNNING")
    first_node = slurm.run("squeue", "-h", "-j", rq, "-o", "%N").stdout.strip()
    time.sleep(2)  # a first run of at least 2 s
    slurm.run("scontrol", "requeue", rq)
    requeued_by = time.time()  # the first run ended before this
    # A requeued batch job is held back ~2 min (BeginTime): let it start again now, but not on
    # the node it just left — slurmd there still holds the revoked credential of the killed run
    # for a moment, and a relaunch within it fails at once ("Job credential revoked", exit 1).
    wait_until(lambda: state(slurm, rq) == "PENDING", 15, f"job {rq} PENDING after requeue")
    slurm.run("scontrol", "update", f"JobId={rq}", f"ExcNodeList={first_node}", "StartTime=now")
    finished = [done, cross, rq, het]
    wait_until(lambda: not any(state(slurm, j) for j in finished), 120, f"jobs {finished} to end")
    wait_until(lambda: state(slurm, running) == "RUNNING", 60, f"job {running} RUNNING")

    # wait for sacct to catch up: every finished run has an end, the requeued job has two runs
    def books_complete():
        runs = sacct_runs(slurm, [done, cross, running, rq, het])
        ended = [r for r in runs if r["JobID"].split("+")[0] in finished]
        complete = len(ended) == 6 and all(epoch(r["End"]) and r["Partition"] for r in ended)
        return runs if complete and len(runs) == 7 and all(r["Partition"] for r in runs) else None

    runs = wait_until(books_complete, 60, "sacct to record every run")
    cross_run = next(r for r in runs if r["JobID"] == cross)
    since = epoch(cross_run["Start"]) + 2  # the range starts inside the crossing job
    assert all(epoch(r["Start"]) > since for r in runs if r["JobID"] != cross)
    until = math.floor(time.time()) + 3600

    env = dict(slurm.env)
    gpu_file = models_yaml(tmp_path / "gpu.yaml", deployment, billing=False)
    all_ids = [done, cross, running, rq, het]

    def range_query_complete():
        records = booked(gpu_file, since, all_ids, env)
        return len(records) == 7 and len([r for r in records if r.end_time]) == 6

    wait_until(range_query_complete, 60, "cost's sacct range query to hold every run")
    data = run_cost(gpu_file, since, until, env)
    now = datetime.fromisoformat(data["now"]).timestamp()

    # ---- hand-computed from the shapes submitted and the times Slurm recorded
    gpus = {done: 2, cross: 2, running: 1, rq: 1, f"{het}+0": 1, f"{het}+1": 2}
    model = {done: "done", cross: "cross", running: "run", rq: "rq", f"{het}+0": "het",
             f"{het}+1": "het"}
    expected_s: dict[str, int] = {}
    expected_cost: dict[str, float] = {}
    for r in runs:
        start, end = epoch(r["Start"]), epoch(r["End"]) or now
        seconds = max(0, int(min(end, until, now) - max(start, since)))
        gpu_s = gpus[r["JobID"]] * seconds
        name = model[r["JobID"]]
        expected_s[name] = expected_s.get(name, 0) + gpu_s
        expected_cost[name] = expected_cost.get(name, 0.0) + gpu_s * PRICES[r["Partition"]] / 3600
    got = {m["model"]: m for m in data["models"]}
    assert {m: got[m]["gpu_seconds"] for m in got} == {m: s for m, s in expected_s.items() if s}
    for name, cost in expected_cost.items():
        if expected_s[name]:
            assert got[name]["cost"] == pytest.approx(cost)
    # known lengths, to sacct's one-second granularity
    assert 2 * 3 <= expected_s["done"] <= 2 * 4
    rq_runs = sorted((epoch(r["Start"]), epoch(r["End"]), r["State"]) for r in runs if r["JobID"] == rq)
    assert [state for *_, state in rq_runs] == ["REQUEUED", "COMPLETED"]
    first, second = (int(end - start) for start, end, _ in rq_runs)
    # requeued at least 2 s in and no later than the requeue command returned (measured here);
    # then the whole `sleep 4`
    assert 2 <= first <= requeued_by - rq_runs[0][0], (first, requeued_by, rq_runs)
    assert 4 <= second <= 5
    assert expected_s["rq"] == first + second
    assert expected_s["het"] in range(3 * 3, 3 * 4 + 1)
    assert expected_s["cross"] in range(2 * 6, 2 * 7 + 1)  # 8 s job, range starts 2 s in
    assert got["run"]["gpu_seconds"] == int(now - epoch(next(r for r in runs if r["JobID"] == running)["Start"]))
    assert next(j for j in data["jobs"] if j["model"] == "run")["running"] is True
    assert len([j for j in data["jobs"] if j["model"] == "rq"]) == 2
    assert {(r["model"], r["partition"]) for r in data["rows"] if r["model"] == "het"} == {
        ("het", "a100"), ("het", "v100")}

    # ---- billing: Slurm's billing TRES × hours, and it equals the partition formula (floored)
    billing_file = models_yaml(tmp_path / "billing.yaml", deployment, billing=True)
    billing_data = run_cost(billing_file, since, until, env)
    config = load_deployment(billing_file)
    snapshot = client_for_deployment(config, env=env).snapshot(deployment)
    expected_billing = 0.0
    booked_now = datetime.fromisoformat(billing_data["now"]).timestamp()
    for r in runs:
        part = snapshot.partition(r["Partition"])
        n = gpus[r["JobID"]]
        planned = math.floor(part.billing_for(n, r["Partition"], config.cluster.cpus_per_gpu * n,
                                              config.cluster.mem_per_gpu_gb * n))
        alloc = dict(item.split("=", 1) for item in r["AllocTRES"].split(","))
        assert float(alloc["billing"]) == planned, (r["JobID"], alloc, part.billing_weights)
        start, end = epoch(r["Start"]), epoch(r["End"]) or booked_now
        seconds = max(0, int(min(end, until, booked_now) - max(start, since)))
        expected_billing += planned * seconds / 3600
    assert billing_data["price_unit"] == "billing"
    assert billing_data["total"]["cost"] == pytest.approx(expected_billing)


def test_slurmdbd_unreachable_is_a_clear_error_not_zeros(slurm_cluster, tmp_path):
    """sacct pointed at a closed slurmdbd port: exit 3 with a message, no figures printed."""
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    source = Path(slurm_cluster.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    text = source.read_text()
    lines = [("AccountingStoragePort=1" if line.startswith("AccountingStoragePort=") else line)
             for line in text.splitlines()]
    (conf_dir / "slurm.conf").write_text("\n".join(lines) + "\n")
    for extra in ("gres.conf",):
        if (source.parent / extra).exists():
            (conf_dir / extra).write_text((source.parent / extra).read_text())
    env = {**slurm_cluster, "SLURM_CONF": str(conf_dir / "slurm.conf")}
    path = models_yaml(tmp_path / "gpu.yaml", "costit-down", billing=False)
    out = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "cost", str(path),
         "--json", "--since", "now-1h"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert "slurmdbd" in out.stderr and "Slurm accounting" in out.stderr


def test_plot_and_report_files_from_the_real_books(slurm, tmp_path):
    """`cost --json` counts a 2 s job, `cost --plot` writes a PNG and `report` a self-contained
    HTML page whose by-model table holds the job's model, all from sacct's books — once the range
    query cost runs holds the job (see :func:`booked`: ``sacct -j`` showing its end is not enough)."""
    deployment = f"costrep-{uuid.uuid4().hex[:6]}"
    wait_until(lambda: partitions_up(slurm, ("a100",)), 120, "partition a100 UP")
    since = math.floor(time.time()) - 1
    job = slurm.sbatch(*shape("a100", 1), *tagged(deployment, "plotted", "r1"), "--wrap=sleep 2")
    path = models_yaml(tmp_path / "gpu.yaml", deployment, billing=False)
    ended = wait_until(lambda: [r for r in booked(path, since, [job], slurm.env) if r.end_time], 60,
                       f"cost's sacct range query to hold job {job} with its end")
    gpu_seconds = int(ended[0].end_time - ended[0].start_time)  # one GPU
    assert 2 <= gpu_seconds <= 3, ended  # `sleep 2`, to sacct's one-second granularity
    png, html = tmp_path / "cost.png", tmp_path / "report.html"
    cli = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]
    until = math.floor(time.time()) + 60
    window = ["--since", f"@{since}", "--until", f"@{until}"]
    data = run_cost(path, since, until, slurm.env)
    assert {m["model"]: m["gpu_seconds"] for m in data["models"]} == {"plotted": gpu_seconds}
    plotted = subprocess.run([*cli, "cost", str(path), *window, "--plot", str(png)],
                             capture_output=True, text=True, env=slurm.env, timeout=120,
                             check=False)
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reported = subprocess.run([*cli, "report", str(path), *window, "-o", str(html)],
                              capture_output=True, text=True, env=slurm.env, timeout=120,
                              check=False)
    assert reported.returncode == 0, reported.stderr
    page = html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html")
    assert page.count("data:image/png;base64,") == 2  # cost and allocation figures embedded
    assert "<td>plotted</td>" in page, page[:2000]  # the job's model reached the by-model table
