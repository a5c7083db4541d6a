"""``coral-hpc serve`` on the local cluster made busy by another lab: a second Linux user
(``coral-other``, account ``other-lab``; ``scripts/dev-cluster other-user``) holds every GPU
with time-limited jobs, and Slurm's backfill scheduler estimates when ours start.

- with no idle GPU, ``serve`` submits at once, and every model becomes READY as the other jobs
  end, without anyone acting;
- a queued replica is moved when another shape would start sooner (the other lab ends a job
  early: its GPUs are free now);
- MaxJobs on the account and a partition's MaxTime are honoured: one job only, with the
  partition's time limit instead of the longer configured one.

Real Slurm, real processes, the sim engine (no GPU here). Limits the tests set are reset after.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.slurm import make_client
from harness import busy_cluster
from tests.conftest import REPO, wait_until
from tests.support.serve_harness import (
    ServeProcess,
    cli,
    example_copy,
    tagged_jobs,
    wait_cycles,
)
from tests.support.serve_harness import status_if_any as status

pytestmark = pytest.mark.slurm


def config_copy(tmp_path: Path, models: str | None = None, **policy: object) -> Path:
    """examples/models.yaml with its own deployment, state folders, short intervals, and
    ``policy`` overrides; ``models`` keeps only the model of that name."""
    path = example_copy(tmp_path, REPO / "examples" / "models.yaml", "busy",
                        {r"(?m)^  replan_interval_s: .*$": "  replan_interval_s: 10"})
    text = path.read_text()
    if policy:
        extra = "".join(f"  {k}: {v}\n" for k, v in policy.items())
        text = text.replace("policy:\n", "policy:\n" + extra, 1)
    if models:
        head, _, body = text.partition("\nmodels:\n")
        entries = re.split(r"(?m)^(?=  - name: )", body)
        kept = [e for e in entries if e.startswith(f"  - name: {models}\n")]
        assert kept, f"no model {models} in examples/models.yaml"
        text = head + "\nmodels:\n" + "".join(kept)
    path.write_text(text)
    return path


def jobs_of_every_model(env: dict, deployment: str, models: set[str]):
    jobs = tagged_jobs(env, deployment)
    return jobs if {j.tag.model for j in jobs} >= models else None


def pending_with_reason(env: dict, config: Path) -> dict | None:
    data = status(env, config)
    if data and any(r["state"] == "PENDING" and r["slurm_reason"] for r in data["replicas"]):
        return data
    return None


def some_model_ready(env: dict, config: Path) -> bool:
    data = status(env, config)
    return bool(data and any(m["ready_replicas"] for m in data["models"]))


def replaced_and_running(env: dict, deployment: str, old_job: str):
    jobs = tagged_jobs(env, deployment)
    if jobs and all(j.job_id != old_job for j in jobs) and any(j.state == "RUNNING" for j in jobs):
        return jobs
    return None


@pytest.fixture
def env(env, other_lab):
    """The integration tests' environment over this process's own, the other lab ready."""
    return {**os.environ, **env}


def test_with_every_gpu_held_serve_submits_at_once_and_models_become_ready_as_jobs_end(
        tmp_path, env):
    # The other lab holds every GPU until this test has seen what must happen while they are
    # held, then ends its jobs: events, not a fixed 70 s hold that the daemon's first plan (the
    # real solver, minutes on a slow host) could outlast. The hold's time limit only bounds a
    # test that dies before it releases them (the env fixture cancels them as well).
    others = busy_cluster.fill_every_gpu(900)
    wait_until(lambda: busy_cluster.other_jobs_running(others.values()), 30,
               "the other lab's jobs running on every GPU node")
    config = config_copy(tmp_path)
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        models = {m.name for m in load_deployment(config).models}
        # submitted at once although nothing is idle: PENDING in Slurm while the others run
        # (the deadline bounds a first plan that never comes; `plan` is given 300 s elsewhere)
        pending = wait_until(lambda: jobs_of_every_model(env, serve.deployment, models),
                             300, "a job of every model submitted")
        assert busy_cluster.other_jobs_running(others.values()), (
            "submitted only after the GPUs freed")
        assert all(j.state == "PENDING" for j in pending), [(j.job_id, j.state) for j in pending]
        assert {j.job_id for j in pending}.isdisjoint(others.values())
        # status shows them PENDING with Slurm's reason
        data = wait_until(lambda: pending_with_reason(env, config), 30,
                          "status listing PENDING replicas with Slurm's reason")
        assert any(r["slurm_reason"] in ("Resources", "Priority") for r in data["replicas"]
                   if r["state"] == "PENDING")
        assert not [m for m in data["models"] if m["ready_replicas"]], data["models"]
        assert busy_cluster.other_jobs_running(others.values()), "the GPUs freed too early"
        # nobody acts: as the other jobs end, every model becomes READY
        make_client("cli", env=env).cancel(list(others.values()))

        def every_ready():
            current = status(env, config)
            ready = {m["name"] for m in (current or {}).get("models", []) if m["ready_replicas"]}
            return current if ready >= models else None

        wait_until(every_ready, 150, "a READY replica of every model")
    finally:
        serve.close()


def test_a_queued_replica_moves_when_another_shape_starts_sooner(tmp_path, env):
    # one model, a horizon shorter than any wait here: its replica is queued where Slurm
    # starts it first (a100, freed in ~4 min), not on v100 (~7 min)
    nodes = {n.name: n for n in busy_cluster.gpu_nodes()}
    hold = {"a100-01": 240, "a100-02": 240, "v100-01": 420, "v100-02": 420, "a100-80g-01": 420}
    others = busy_cluster.fill_every_gpu(hold, [nodes[n] for n in hold])
    # RUNNING, not just listed: a plan made while they are still PENDING sees every GPU free
    # and takes the cheapest shape (CI: the v100 pipeline, queued behind them for 7 min)
    jobs = wait_until(lambda: busy_cluster.other_jobs_running(others.values()), 30,
                      "the other lab's jobs running")
    config = config_copy(tmp_path, models="qwen3-8b", max_queue_wait_s=30)
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        (first,) = wait_until(lambda: tagged_jobs(env, serve.deployment), 40, "the queued replica")
        assert first.state == "PENDING" and first.partition.split(",")[0] in ("a100", "gpu"), (
            first.state, first.partition, jobs)
        # the other lab ends its v100 jobs early: v100 GPUs are free now, sooner than a100's
        make_client("cli", env=env).cancel([others["v100-01"], others["v100-02"]])
        moved = wait_until(lambda: replaced_and_running(env, serve.deployment, first.job_id),
                           90, "the queued replica replaced by one running on the freed GPUs")
        running = [j for j in moved if j.state == "RUNNING"]
        assert all(n.startswith("v100") for j in running for n in j.nodes), running
        wait_until(lambda: some_model_ready(env, config), 60, "the moved replica READY")
    finally:
        serve.close()


def test_max_jobs_and_partition_max_time_are_honoured(tmp_path, env):
    sam = ["sacctmgr", "-i", "modify", "user", "root", "where", "account=coral-busy", "set"]
    subprocess.run([*sam, "MaxJobs=1"], check=True, capture_output=True, env=env, timeout=60)
    try:
        config = config_copy(tmp_path)
        text = config.read_text()
        # two days asked, on partitions whose MaxTime is 1-2 days; charged to coral-busy
        text = text.replace('time_limit: "02:00:00"', 'time_limit: "3-00:00:00"')
        text = text.replace("cluster:\n", "cluster:\n  account: coral-busy\n", 1)
        config.write_text(text)
        # the Stage-1 cache serve reads (ServeProcess.cli: tmp_path/templates), so serve's first
        # plan does not build the same templates again before it submits
        out = cli(env, "plan", str(config), "--json", "--cache-dir", str(tmp_path / "templates"),
                  timeout=300)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert sum(r["count"] for r in doc["replicas"]) == 1
        assert any("MaxJobs=1" in b for b in doc["binding"]), doc["binding"]
        assert any("MaxTime" in w for w in doc["warnings"]), doc["warnings"]
        serve = ServeProcess.cli(env, config, tmp_path)
        try:
            wait_until(lambda: tagged_jobs(env, serve.deployment), 60, "one replica job")
            # a few more cycles (counted, not slept): still one job, however much demand is unmet
            wait_cycles([load_deployment(config)], 3)
            jobs = tagged_jobs(env, serve.deployment)
            assert len(jobs) == 1, [(j.job_id, j.state) for j in jobs]
            limits = {"v100": 172800, "a100": 172800, "a100-80g": 86400}
            assert jobs[0].time_limit_s == min(limits[p] for p in jobs[0].partition.split(","))
        finally:
            serve.close()
    finally:
        subprocess.run([*sam, "MaxJobs=-1"], check=False, capture_output=True, env=env, timeout=60)


def test_a_min_replicas_the_whole_cluster_could_never_hold_is_refused(tmp_path, env):
    """More replicas than the cluster has GPUs, busy or not (every GPU held by the other lab):
    ``plan`` (asking Slurm) and ``serve`` exit 2 naming the file, line and field, and nothing
    is submitted, instead of queueing replicas that could never all run."""
    others = busy_cluster.fill_every_gpu(90)
    wait_until(lambda: busy_cluster.other_jobs_running(others.values()), 30,
               "the other lab's jobs running on every GPU node")
    total = sum(n.gpus for n in busy_cluster.gpu_nodes())
    config = config_copy(tmp_path)
    head = "  - name: qwen3-8b\n"
    config.write_text(config.read_text().replace(head, f"{head}    min_replicas: {total + 1}\n"))
    line = config.read_text().splitlines().index(f"    min_replicas: {total + 1}") + 1
    # more replicas than GPUs: whatever its layouts, they could never all run
    field = (f"{config}:{line}: models[0].min_replicas: {total + 1} replica(s) of qwen3-8b: "
             "its layouts")
    deployment = load_deployment(config).deployment
    planned = cli(env, "plan", str(config), "--cache-dir", str(tmp_path / "templates"),
                  timeout=300)
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert field in planned.stderr and f"{total} GPU(s) in total, busy or not" in planned.stderr
    served = cli(env, "serve", str(config), "--listen", "127.0.0.1:0",
                 "--cache-dir", str(tmp_path / "templates"), timeout=300)
    assert served.returncode == 2, served.stdout + served.stderr
    assert field in served.stderr and "serve stops" in served.stderr
    # nothing of this deployment in Slurm, running or ended
    assert make_client("cli", env=env).snapshot(deployment).jobs == ()
