"""The reconcile loop on the real local cluster with the sim engine: every replica is a real Slurm
job running the replica entrypoint and a sim engine, observed through the real Slurm client and
recorded in a real SQLite store. Plans come from a small rule-based planner
(tests/support/serve_harness.py) so each scenario controls where replicas should be.

Scenarios: a scancelled replica is replaced; a drained partition's replica moves elsewhere with no
gap in READY replicas; kill -9 of the daemon and a restart adopt the running job (no duplicate, no
orphan); a replica pending past pending_timeout is cancelled and re-planned elsewhere; a short
time limit rotates the replica before walltime with no gap; a template that fails at start is
kept out of plans for a while. Short intervals (seconds) throughout; waits poll with deadlines."""

from __future__ import annotations

import threading
import time

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.store import open_store
from tests.conftest import wait_until
from tests.support.serve_harness import (
    ARCH,
    MODEL,
    ON_A100,
    HeadlessDaemon,
    PreferencePlanner,
    ServeProcess,
    events,
    one_model_yaml,
    ready,
    replicas,
    serve_deployment,
    slot,
    tagged_jobs,
    wait_cycles,
)

pytestmark = pytest.mark.slurm

ON_V100 = slot(MODEL, ARCH, "v100", "v100", tp=2)  # 8B weights need two 16 GB V100s
CRASHES = slot(MODEL, ARCH, "v100", "v100", tp=1)  # ... so one V100 fails at start, like an OOM


class ReadyWatch:
    """Samples the number of READY replicas in the background (gap detection)."""

    def __init__(self, deployment):
        self.deployment = deployment
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.25):
            self.samples.append((time.time(), len(ready(self.deployment))))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


# --------------------------------------------------------------------------- scenarios


def test_a_scancelled_replica_is_replaced(tmp_path, env, slurm, cleanup):
    run = HeadlessDaemon(one_model_yaml(tmp_path), PreferencePlanner([ON_A100]), env)
    cleanup(run.deployment)
    try:
        (first,) = wait_until(lambda: ready(run.deployment), 90, "a READY replica")
        began = time.monotonic()
        slurm.run("scancel", first["job_id"])
        second = wait_until(
            lambda: [r for r in ready(run.deployment) if r["job_id"] != first["job_id"]],
            90, "a READY replacement after scancel")
        reaction = time.monotonic() - began
        states = {r["id"]: r["state"] for r in replicas(run.deployment)}
        assert first["id"] not in states  # ended: no longer live
        assert [e for e in events(run.deployment, "failed") if e.replica_id == first["id"]]
        jobs = tagged_jobs(env, run.deployment)
        assert [j.job_id for j in jobs] == [second[0]["job_id"]]
        assert reaction < 90
    finally:
        run.stop()


def test_a_drained_partition_moves_its_replica_with_no_gap(tmp_path, env, node_restorer, cleanup):
    run = HeadlessDaemon(one_model_yaml(tmp_path), PreferencePlanner([ON_A100, ON_V100]), env)
    cleanup(run.deployment)
    try:
        (first,) = wait_until(lambda: ready(run.deployment), 90, "a READY replica on a100")
        assert first["partition"] == "a100"
        watch = ReadyWatch(run.deployment)
        node_restorer.set_partition("a100", "DRAIN")
        moved = wait_until(
            lambda: [r for r in ready(run.deployment) if r["partition"] == "v100"],
            120, "a READY replica on v100 after draining a100")
        wait_until(lambda: not [r for r in replicas(run.deployment) if r["id"] == first["id"]],
                   90, "the a100 replica drained and cancelled")
        samples = watch.stop()
        assert samples and min(n for _, n in samples) >= 1, "READY replicas dropped to zero"
        jobs = tagged_jobs(env, run.deployment)
        assert [j.job_id for j in jobs] == [moved[0]["job_id"]]
        assert events(run.deployment, "drain")
    finally:
        run.stop()


def test_kill_9_and_restart_adopts_without_duplicates(tmp_path, env, cleanup):
    config = one_model_yaml(tmp_path)
    deployment = load_deployment(config)
    cleanup(deployment)
    daemon = ServeProcess.planned(tmp_path, config, [ON_A100], env, headless=True)
    try:
        (first,) = wait_until(lambda: ready(deployment), 90, "a READY replica")
        daemon.kill(10)
        daemon = ServeProcess.planned(tmp_path, config, [ON_A100], env, headless=True)
        # let the restarted daemon observe, plan and decide several times
        wait_until(lambda: len(events(deployment, "plan")) >= 2, 60, "a plan after the restart")
        wait_cycles([deployment], 5)  # counted, not slept: a slow host fits fewer into 5 s
        jobs = tagged_jobs(env, deployment)
        assert [j.job_id for j in jobs] == [first["job_id"]], "duplicate or lost job"
        assert [r["job_id"] for r in ready(deployment)] == [first["job_id"]]
        assert len(events(deployment, "submit")) == 1
    finally:
        daemon.stop(30)
    # SIGTERM stops the daemon and leaves the replica running
    assert [j.job_id for j in tagged_jobs(env, deployment)] == [first["job_id"]]


def test_a_replica_pending_past_the_timeout_is_replanned_elsewhere(tmp_path, env, slurm, cleanup):
    # fill both a100 nodes so the planned a100 replica cannot start
    for node in ("a100-01", "a100-02"):
        slurm.sbatch("-p", "a100", "-w", node, "--gres=gpu:a100:4", "-c", "1", "--mem=1G",
                     "-t", "10", "--wrap", "sleep 600")
    wait_until(lambda: all(
        slurm.run("squeue", "-h", "-j", j, "-o", "%T").stdout.strip() == "RUNNING"
        for j in slurm.job_ids), 30, "the a100 nodes filled")
    # the fillers run 10 min: past a 60 s horizon, so Slurm's start estimate for the a100 replica
    # gives it no reason to keep its place (a start within the horizon would, on purpose)
    run = HeadlessDaemon(one_model_yaml(tmp_path, pending_timeout_s=8, max_queue_wait_s=60),
                  PreferencePlanner([ON_A100, ON_V100]), env)
    cleanup(run.deployment)
    try:
        moved = wait_until(
            lambda: [r for r in ready(run.deployment) if r["partition"] == "v100"],
            120, "a READY replica on v100 after the a100 one timed out pending")
        timeouts = events(run.deployment, "pending_timeout")
        assert timeouts and "pending" in timeouts[0].message
        jobs = tagged_jobs(env, run.deployment)
        assert [j.job_id for j in jobs] == [moved[0]["job_id"]]
    finally:
        run.stop()


def test_short_time_limit_rotates_before_walltime_with_no_gap(tmp_path, env, cleanup):
    # 3 min limit; Slurm warns (USR2) 90 s before it and the replica then drains, so it serves
    # until ~90 s; lead 40 s: the successor is submitted at ~50 s and READY well before 90 s
    run = HeadlessDaemon(one_model_yaml(tmp_path, time_limit="00:03:00", walltime_lead_s=40),
                  PreferencePlanner([ON_A100]), env)
    cleanup(run.deployment)
    try:
        (first,) = wait_until(lambda: ready(run.deployment), 90, "a READY replica")
        watch = ReadyWatch(run.deployment)
        wait_until(lambda: [r for r in ready(run.deployment) if r["id"] != first["id"]],
                   150, "a READY successor before walltime")
        wait_until(lambda: not [r for r in replicas(run.deployment) if r["id"] == first["id"]],
                   90, "the first replica drained and cancelled")
        samples = watch.stop()
        assert min(n for _, n in samples) >= 1, "READY replicas dropped to zero"
        store = open_store(run.deployment.db_path, readonly=True)
        try:
            ended = store.replica(first["id"])
        finally:
            store.close()
        # ended because the daemon retired it, not by Slurm's warning or limit
        assert ended.end_state not in ("TIMEOUT", "COMPLETED") or ended.cancelled_at is not None
        assert ended.cancelled_at is not None
        assert ended.cancelled_at - ended.started_at < 90
    finally:
        run.stop()


def test_a_template_that_fails_at_start_backs_off_with_its_reason(tmp_path, env, cleanup):
    """The first failed start keeps the template out of plans (start_backoff_s, 60 s here), with
    the error its logs name; the model is re-planned onto the next template meanwhile."""
    run = HeadlessDaemon(one_model_yaml(tmp_path), PreferencePlanner([CRASHES, ON_A100]), env)
    cleanup(run.deployment)
    try:
        backoff = wait_until(lambda: events(run.deployment, "start_failed"), 120,
                             "a start back-off event")
        message = backoff[0].message
        assert CRASHES.template_id in message and "failed to start" in message, message
        assert "kept out of plans for 60s" in message, message
        assert "its logs name no error" not in message, message  # the job's own error is named
        # re-planned without it: the model is served by the other template
        wait_until(lambda: [r for r in ready(run.deployment) if r["partition"] == "a100"],
                   90, "a READY replica of the next template")
        submitted = [e for e in events(run.deployment, "submit") if CRASHES.template_id in e.message]
        wait_cycles([run.deployment], 3)  # cycles while backing off, counted, not slept
        again = [e for e in events(run.deployment, "submit") if CRASHES.template_id in e.message]
        assert len(again) == len(submitted) == 1  # none while backing off
    finally:
        run.stop()


def test_serve_runs_the_gateway_publishes_ready_replicas_and_meters_demand(tmp_path, env,
                                                                             cleanup):
    """serve(): gateway child process, routing table, a request answered end to end, demand
    counters scraped into SQLite, the daemon's own metrics; stopping leaves the replica running."""
    import json
    import urllib.request

    from coral_hpc.daemon.process import info_path, read_info

    config = one_model_yaml(tmp_path)
    deployment = load_deployment(config)
    cleanup(deployment)
    with serve_deployment(config, PreferencePlanner([ON_A100])) as served:
        (replica,) = wait_until(lambda: ready(deployment), 90, "a READY replica")
        info = wait_until(lambda: read_info(info_path(deployment)), 10, "the daemon's info file")
        body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 8}).encode()
        request = urllib.request.Request(f"http://{info['gateway']}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})

        def answered():
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    return json.loads(resp.read())
            except OSError:
                return None  # the gateway may not have loaded the table yet

        answer = wait_until(answered, 30, "a completion through the gateway")
        assert answer["choices"][0]["text"]
        def answered_demand():
            store = open_store(deployment.db_path, readonly=True)
            try:
                return [d for d in store.demand_since(0)
                        if d.model == MODEL and d.generated_tokens > 0]
            finally:
                store.close()

        metered = wait_until(answered_demand, 30, "metered demand in SQLite")
        assert metered[0].requests >= 1 and metered[0].end - metered[0].start >= 0.5
        with urllib.request.urlopen(f"http://{info['metrics']}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert f'coral_replicas{{model="{MODEL}",state="READY"}} 1.0' in text
        assert "coral_plan_cost_per_hour" in text
    assert not served.thread.is_alive()
    assert read_info(info_path(deployment)) is None
    assert [j.job_id for j in tagged_jobs(env, deployment)] == [replica["job_id"]]
