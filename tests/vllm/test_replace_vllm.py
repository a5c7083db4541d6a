"""Replacement on the REAL engine: ``coral-hpc serve`` (the real planner, daemon and gateway) of
one generated model with two single-node vLLM replicas (CPU build) on the local cluster, and in
that one session, one after the other:

1. **node drain** (``scontrol update state=drain``) of a node a replica runs on: every replica
   there gets a successor elsewhere and keeps serving until that successor is READY, then drains
   and its job ends by itself, never requeued;
2. **scancel** of a READY replica: the daemon replaces it;
3. **walltime rotation**: the deployment's time limit is short (11 min), so a replica's successor
   is started ``walltime_lead_s`` (or the slowest start-up the daemon has seen) ahead of Slurm's
   warning, and the old one drains once it is READY — before the time limit, so its job ends
   COMPLETED, not TIMEOUT.

After them, the daemon's engine gauges (``coral_engine_*`` on its /metrics) show both replicas'
load, read from the real engine's /metrics names (coral_hpc.engine.vllm_metrics).

Throughout, the model keeps at least one READY replica, and a request sent through the gateway
every half second is answered by vLLM: never a 503 (no replica) at any point. A scancel of a
model's *only* replica cannot avoid a gap (nothing serves until a successor has started), which is
why the model has two replicas: ``min_replicas: 2``.

One session carries all three checks, so the lane pays for one set of engine start-ups (about
four engine processes at the peak). With a short time limit every replica rotates 5-6.5 min
into its life (11 min − 90 s − the lead), so the checks overlap in time; each is told apart
by its cause: a drained node's replica gets its successor *before* its walltime is due, and the
rotation is a replica on another node drained for its walltime.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.engine import vllm_metrics
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.startup import lead_startup_s
from coral_hpc.reconcile.status import walltime_lead
from coral_hpc.slurm import make_client
from tests.conftest import wait_until
from tests.support import serve_harness as harness
from tests.support.serve_harness import ServeProcess
from tests.vllm import example

#: part of `make test`; `make test-replacement` runs it alone
pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.replacement]

MODEL = "tiny-llama"
#: the deployment's time limit and the walltime lead. A replica's successor is due the lead
#: before Slurm's USR2 warning (90 s before the limit): 180 s, or the slowest recent start-up the
#: daemon learnt if longer, but at most half the 570 s a replica may serve (the daemon's cap),
#: so a start-up of up to 285 s is covered. Measured here: two engines loading at once took
#: 135 s beside other work; the CI run that failed had four loading at once, over 4 min each.
TIME_LIMIT, TIME_LIMIT_S, WALLTIME_LEAD_S = "00:11:00", 660, 180
SIGNAL_LEAD_S = 90  # coral_hpc.launch.submit: --signal=USR2@90
READY_S = 360  # one replacement, submit → READY, on a loaded 2-core machine
STARTUP_TIME_S = 90  # policy.startup_time_s: the guess until the daemon has learnt its own


def write_config(tmp_path: Path, venv: Path, models: Path) -> Path:
    """Two replicas of one tiny Llama on the v100 and a100 partitions, a short time limit."""
    return example.write_config(
        tmp_path, venv, "vllmrep", time_limit=TIME_LIMIT, partitions=("v100", "a100"),
        policy={"replan_interval_s": 120, "walltime_lead_s": WALLTIME_LEAD_S,
                "startup_time_s": STARTUP_TIME_S},
        models=[{"name": MODEL, "source": str(models / "coral-tiny-llama"),
                 "architecture": "coral-tiny-llama", "demand": {"requests_per_s": 0.5},
                 "min_replicas": 2, "max_replicas": 2}])


class Session:
    """Reads the daemon's store through the serve harness (what ``coral-hpc status --json``
    prints, and the rows and events behind it)."""

    def __init__(self, deployment):
        self.deployment = deployment

    def replicas(self) -> list[dict]:
        return harness.replicas(self.deployment)

    def ready(self) -> list[dict]:
        return harness.ready(self.deployment)

    def records(self) -> dict:
        """Every replica row, ended ones included, by id."""
        return harness.read_store(
            self.deployment, lambda s: {r.id: r for r in s.replicas(live_only=False)}, {})

    def startups(self) -> list:
        return harness.read_store(self.deployment, lambda s: s.startups(limit=50), [])

    def events(self, kind: str) -> list:
        return harness.events(self.deployment, kind, limit=1000)


class Watch(threading.Thread):
    """In the background: the model's READY count from the store, and one small request through
    the gateway every half second (status code, or the exception's name)."""

    def __init__(self, session: Session, gateway: str):
        super().__init__(daemon=True)
        self.session, self.gateway = session, gateway
        self.ready: list[tuple[float, int]] = []
        self.answers: list[tuple[float, int | str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop_event.wait(0.5):
                self.ready.append((time.time(), len(self.session.ready())))
                try:
                    resp = client.post(f"http://{self.gateway}/v1/completions", json={
                        "model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
                    self.answers.append((time.time(), resp.status_code))
                except httpx.HTTPError as exc:
                    self.answers.append((time.time(), type(exc).__name__))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(40)


def sacct_runs(env: dict, job_ids: list[str]) -> list[tuple[str, str]]:
    """(JobID, State) of every run of the jobs (``-D``: a requeued job shows once per run)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-D", "-o", "JobID,State", "-S", "now-1day",
                          "-j", ",".join(job_ids)], check=False, capture_output=True, text=True,
                         env=env, timeout=30).stdout
    return [tuple(line.split("|")) for line in out.strip().splitlines()]  # type: ignore[misc]


def ended(env: dict, job_ids: list[str]) -> list[tuple[str, str]] | None:
    runs = sacct_runs(env, job_ids)
    done = len(runs) >= len(job_ids) and not any(s in ("RUNNING", "PENDING") for _, s in runs)
    return runs if done else None


def test_drain_scancel_and_walltime_replace_with_no_ready_gap(
        tmp_path, vllm_env, vllm_venv, test_models, node_restorer):
    env = {**os.environ, **vllm_env}
    config = write_config(tmp_path, vllm_venv, test_models)
    deployment = load_deployment(config)
    session = Session(deployment)
    serve = ServeProcess.cli(env, config, tmp_path)
    client = make_client("cli", env=env)
    watch = None
    try:
        first = wait_until(lambda: (r := session.ready()) and len(r) == 2 and r, 2 * READY_S,
                           "two READY replicas (real vLLM)")
        gateway = read_info(info_path(deployment))["gateway"]
        watch = Watch(session, gateway)
        watch.start()

        # 1. node drain: every replica on the node moves, each serving until its successor is up
        node = first[0]["nodes"].split(",")[0]
        on_node = [r for r in first if node in r["nodes"].split(",")]
        on_node_ids = {r["id"] for r in on_node}
        drained_at = time.time()
        node_restorer.drain_node(node, reason="coral-vllm-test")
        wait_until(lambda: (r := session.ready()) and len(r) == 2
                   and not on_node_ids & {x["id"] for x in session.replicas()}
                   and r, len(on_node) * READY_S + 60,
                   f"the replicas on {node} replaced (two READY elsewhere, none left there)")
        records = session.records()
        # the walltime lead the daemon used at the drain: the slowest start-up it had seen
        lead = walltime_lead(records[next(iter(on_node_ids))], ReconcileSettings(
            walltime_lead_s=WALLTIME_LEAD_S, startup_s=lead_startup_s(
                [o for o in session.startups() if o.time <= drained_at], STARTUP_TIME_S)))
        for replica_id in on_node_ids:
            # the daemon reacted to the drain, not to the walltime that falls due later
            submitted = [e.time for e in session.events("submit")
                         if f"successor of {replica_id}" in e.message]
            due = records[replica_id].started_at + TIME_LIMIT_S - SIGNAL_LEAD_S - lead
            assert submitted and drained_at <= min(submitted) < min(due, drained_at + 30), (
                replica_id, drained_at, submitted, due)
        drained_jobs = [records[i].job_id for i in on_node_ids]
        runs = wait_until(lambda: ended(env, drained_jobs), 90, "the drained jobs ended")
        assert sorted(j for j, _ in runs) == sorted(drained_jobs), f"requeued or lost: {runs}"
        assert all(s == "COMPLETED" for _, s in runs), f"drained, each job ended by itself: {runs}"
        drains = {e.replica_id for e in session.events("drain")}
        assert on_node_ids <= drains, "each replica left by a drain, not killed"
        assert all(node not in r["nodes"].split(",") for r in session.replicas()
                   if r["nodes"]), "nothing new placed on the drained node"
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=True,
                       env=env, timeout=30)

        # 2. scancel of a READY replica: the other one serves while a successor starts
        victim = max(session.ready(), key=lambda r: r["time_left_s"] or 0)
        client.cancel([victim["job_id"]])
        wait_until(lambda: (r := session.ready()) and len(r) == 2
                   and victim["id"] not in {x["id"] for x in session.replicas()} and r,
                   READY_S + 30, "a READY successor of the scancelled replica")
        assert [e for e in session.events("failed") if e.replica_id == victim["id"]]

        # 3. walltime rotation: a replica not on the drained node drained for its walltime once
        #    its successor was READY, its job ending by itself before the time limit (COMPLETED,
        #    not TIMEOUT)
        def rotated() -> set[str] | None:
            done = {e.replica_id for e in session.events("drain")
                    if "walltime" in e.message and e.replica_id not in on_node_ids}
            return done or None

        rotated_ids = wait_until(rotated, TIME_LIMIT_S, "a replica drained for its walltime")
        wait_until(lambda: (r := session.ready()) and len(r) == 2
                   and not rotated_ids & {x["id"] for x in session.replicas()} and r,
                   READY_S, "the rotated replica gone and two READY")
        records = session.records()
        rotated_jobs = [records[i].job_id for i in rotated_ids]
        runs = wait_until(lambda: ended(env, rotated_jobs), 90, "the rotated jobs ended")
        assert sorted(j for j, _ in runs) == sorted(rotated_jobs), f"requeued or lost: {runs}"
        assert all(s == "COMPLETED" for _, s in runs), f"ended before its limit, drained: {runs}"
        # the names the daemon reads are the real engine's: each replica's /metrics parses, and
        # the daemon's own /metrics shows both replicas' load and the tokens they generated
        for replica in session.ready():
            load = vllm_metrics.parse_engine_metrics(
                vllm_metrics.fetch_metrics_text(replica["endpoint"]))
            assert load.kv_capacity_tokens and load.kv_capacity_tokens > 0
        daemon_metrics = f"http://{read_info(info_path(deployment))['metrics']}/metrics"

        def engine_gauges() -> dict | None:
            text = httpx.get(daemon_metrics, timeout=10).text
            values = {s.name: s.value for f in text_string_to_metric_families(text)
                      for s in f.samples if s.name.startswith("coral_engine_")
                      and s.labels.get("model") == MODEL}
            done = (values.get("coral_engine_replicas_scraped") == 2
                    and values.get("coral_engine_generation_tokens", 0) > 0)
            return values if done else None

        gauges = wait_until(engine_gauges, 60, "the daemon reading both engines' /metrics")
        assert gauges["coral_engine_replicas_unscraped"] == 0
        assert gauges["coral_engine_prompt_tokens"] > 0

        watch.stop()

        # throughout: never without a READY replica, and the gateway never without a replica
        assert watch.ready and min(n for _, n in watch.ready) >= 1, "READY replicas hit zero"
        codes = [c for _, c in watch.answers]
        assert len(codes) > 100 and 503 not in codes, f"the model had no replica: {codes}"
        failed = [(round(t - watch.answers[0][0]), c) for t, c in watch.answers if c != 200]
        assert not failed, f"requests failed during the replacements: {failed}"
    finally:
        if watch is not None and watch.is_alive():
            watch.stop()
        serve.close(down_grace=30)
