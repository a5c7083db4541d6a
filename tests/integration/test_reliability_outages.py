"""Issue 16, Why-4 and the controller outage, re-run on the local cluster: real Slurm, real
sim-engine replica jobs, the real daemon and gateway (:func:`coral_hpc.daemon.serve`), and
requests sent through the gateway the whole time, each one counted.

Measured before the fixes (``coral-hpc serve`` on the example): a maintenance drain of every node
failed 87 of 87 requests; walltime rotation at a 3-minute limit failed 193 of 960; one drained
node also drained a healthy replica on another node (22 failures).

The plans come from a rule-based planner that, like the optimiser on a cluster without room,
leaves a model out of the plan when no node of its partitions can take a job — the harshest plan
the daemon gets: the daemon alone must keep serving. One serve session (two models, one on an
a100 node and one on a v100 node) runs the node-drain, the maintenance-drain and the controller
outage scenarios in turn (module scope: one start-up for the three); the walltime rotation needs
its own 3-minute time limit. Every drain is resumed and the controller always started again, in
``finally`` blocks, whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.plan.desired import DesiredPlan
from coral_hpc.plan.planner import PlanOutcome, PlanRequest
from tests.conftest import REPO, SlurmRunner, wait_until
from tests.support.serve_harness import (
    PreferencePlanner,
    ServeThread,
    cancel_deployment,
    events,
    ready,
    replicas,
    serve_deployment,
    sim_models_yaml,
    slot,
    tagged_jobs,
    wait_cycles,
)

pytestmark = pytest.mark.slurm

ARCH = "qwen3-8b"
A, B = "rel-a", "rel-b"
#: model A prefers an a100 node, model B a v100 pair: each replica on a node of its own
CANDIDATES = [slot(A, ARCH, "a100", "a100", tp=1), slot(A, ARCH, "v100", "v100", tp=2),
              slot(B, ARCH, "v100", "v100", tp=2), slot(B, ARCH, "a100", "a100", tp=1)]
UNUSABLE = ("drain", "down", "fail", "maint")
POLL_S = 1


class RoomPlanner(PreferencePlanner):
    """Per model, the first candidate whose partition is up and has a node that can take a job
    (not draining or down); a model with none is left out of the plan."""

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        usable = {p for n in request.snapshot.nodes if not n.state.startswith(UNUSABLE)
                  for p in n.partitions}
        up = {p.name for p in request.snapshot.partitions if p.state == "up"} & usable
        chosen = {}
        for candidate in self.candidates:
            if candidate.model not in chosen and candidate.partitions[0] in up:
                chosen[candidate.model] = candidate
        slots = tuple(chosen.values())
        return PlanOutcome(DesiredPlan(0.0, slots), sum(s.count * s.cost_per_hour for s in slots),
                           0.0, "rule")


def write_config(tmp_path: Path, time_limit: str, models: tuple[str, ...], **policy) -> Path:
    settings = {"poll_interval_s": POLL_S, "replan_interval_s": 120, "pending_timeout_s": 120,
                "walltime_lead_s": 45, "startup_time_s": 5, **policy}
    return sim_models_yaml(tmp_path, "itrel", models, architecture=ARCH, mix=(64, 8),
                           time_limit=time_limit, policy=settings)


@dataclass
class Answer:
    at: float
    model: str
    status: int          # HTTP status; 0 = no answer at all (connection failed, timed out)
    detail: str = ""


class Traffic:
    """Requests to the gateway from two threads, alternating models, every answer recorded."""

    def __init__(self, address: str, models: tuple[str, ...]) -> None:
        self.url = f"http://{address}/v1/completions"
        self.models = models
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(2)]
        for thread in self._threads:
            thread.start()

    def _run(self, offset: int) -> None:
        i = offset
        while not self._stop.is_set():
            model = self.models[i % len(self.models)]
            i += 1
            body = json.dumps({"model": model, "prompt": f"q{i}", "max_tokens": 4}).encode()
            request = urllib.request.Request(self.url, data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    answer = Answer(time.time(), model, resp.status)
            except urllib.error.HTTPError as exc:
                answer = Answer(time.time(), model, exc.code,
                                exc.read()[:200].decode("utf-8", "replace"))
            except Exception as exc:  # noqa: BLE001 - every failure is a failed request
                answer = Answer(time.time(), model, 0, repr(exc))
            self.answers.append(answer)
            self._stop.wait(0.25)

    def since(self, t: float) -> list[Answer]:
        return [a for a in self.answers if a.at >= t]

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(35)


class Session:
    """A :class:`ServeThread` (serve() with the real gateway as its child process) with traffic
    on it from :meth:`wait_serving` until the ``with`` block ends."""

    def __init__(self, served: ServeThread, models: tuple[str, ...]) -> None:
        self.deployment = served.deployment
        self.models = models
        self.traffic: Traffic | None = None

    def wait_serving(self) -> Session:
        """Until every model has a READY replica and the gateway answered a first request."""
        from coral_hpc.daemon.process import info_path, read_info

        models = self.models
        wait_until(lambda: {r["model"] for r in ready(self.deployment)} >= set(models), 150,
                   "a READY replica of every model")
        info = wait_until(lambda: read_info(info_path(self.deployment)), 10, "the info file")
        self.traffic = Traffic(info["gateway"], models)
        # the gateway routes once it has read the table: from the first answered request on,
        # every request must be answered
        traffic = self.traffic
        wait_until(lambda: [a for a in traffic.answers if a.status == 200], 30,
                   "a first answer through the gateway")
        return self

    def wait_answers(self, count: int, since: float | None = None, timeout: float = 120) -> None:
        """Until ``count`` requests have been answered (any status) since ``since`` (default:
        now). Serving through a change is measured in requests, not in seconds that a slow host
        fills with fewer of them; ``timeout`` only bounds traffic that stopped."""
        traffic = self.traffic
        assert traffic is not None
        t = time.time() if since is None else since
        wait_until(lambda: len(traffic.since(t)) >= count, timeout,
                   f"{count} answers through the gateway")

    def failures_since(self, t: float) -> list[Answer]:
        assert self.traffic is not None
        return [a for a in self.traffic.since(t) if a.status != 200]

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.traffic is not None:
            self.traffic.stop()


def _replica(deployment, model: str) -> dict:
    (only,) = [r for r in ready(deployment) if r["model"] == model]
    return only


def _node_of(replica: dict) -> str:
    return replica["nodes"].split(",")[0]


def _set_nodes(runner: SlurmRunner, nodes, *state: str, check: bool = True) -> None:
    """One scontrol call for every node: they change state together, as in a maintenance
    (node by node, a plan made half-way through moves replicas for the nodes still draining)."""
    runner.run("scontrol", "update", f"NodeName={','.join(nodes)}", *state, check=check)


def _resume(runner: SlurmRunner, nodes) -> None:
    _set_nodes(runner, nodes, "State=RESUME", check=False)


@pytest.fixture(scope="module")
def session(slurm_cluster, tmp_path_factory):
    """One serve session of models A and B for the scenarios below; its jobs cancelled and
    every node resumed at the end, whatever happened."""
    os.environ["SLURM_CONF"] = slurm_cluster["SLURM_CONF"]   # submitit's sbatch reads it
    tmp = tmp_path_factory.mktemp("outages")
    config = write_config(tmp, "00:20:00", (A, B))
    deployment = load_deployment(config)
    try:
        with (serve_deployment(config, RoomPlanner(CANDIDATES)) as served,
              Session(served, (A, B)) as session):
            yield session.wait_serving()
    finally:
        cancel_deployment(slurm_cluster, deployment)


def test_one_node_drained_replaces_only_that_nodes_replica(session):
    runner = SlurmRunner()
    a, b = _replica(session.deployment, A), _replica(session.deployment, B)
    node = _node_of(a)
    assert node != _node_of(b)
    began = time.time()
    try:
        runner.run("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                   "Reason=coral-test-one-node")
        moved = wait_until(lambda: [r for r in ready(session.deployment)
                                    if r["model"] == A and r["id"] != a["id"]],
                           120, f"a READY successor of {A} off {node}")
        wait_until(lambda: a["id"] not in {r["id"] for r in replicas(session.deployment)}, 60,
                   f"{A}'s replica on {node} drained and cancelled")
        assert _node_of(moved[0]) != node
        session.wait_answers(10)  # serving after the move, counted, not 3 s slept
        failures = session.failures_since(began)
    finally:
        _resume(runner, [node])
    assert failures == [], failures
    print(f"one node drained: {len(session.traffic.since(began))} requests, 0 failed")
    # B's replica on another node was neither drained nor replaced
    assert _replica(session.deployment, B)["id"] == b["id"]
    drains = [e for e in events(session.deployment, "drain") if e.time >= began]
    assert [e.replica_id for e in drains] == [a["id"]], [e.message for e in drains]
    assert "draining or down" in drains[0].message
    submits = [e for e in events(session.deployment, "submit") if e.time >= began]
    assert len(submits) == 1 and submits[0].model == A     # one successor, no flapping


def test_a_maintenance_drain_of_every_node_keeps_every_replica_serving(session):
    """`state=drain` on every node: running jobs may finish. The plan finds no node for any
    model and leaves both out; each model's last READY replica keeps serving (87 of 87
    requests failed before)."""
    runner = SlurmRunner()
    before = {m: _replica(session.deployment, m) for m in (A, B)}
    nodes = sorted(set(runner.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()))
    began = time.time()
    try:
        _set_nodes(runner, nodes, "State=DRAIN", "Reason=coral-test-maintenance")
        # a re-plan on the drained cluster, then 20 reconcile cycles (20 s at POLL_S 1 on a
        # quick host, counted, not slept) and at least 40 requests served through it
        wait_until(lambda: [e for e in events(session.deployment, "plan")
                            if e.time >= began and "no replicas" in e.message], 30,
                   "a plan that places nothing")
        planned_nothing = time.time()
        wait_cycles([session.deployment], 20)
        session.wait_answers(40, since=planned_nothing)
        during = session.failures_since(began)
        still = {m: _replica(session.deployment, m)["id"] for m in (A, B)}
        drained = [e for e in events(session.deployment, "drain") if e.time >= began]
        cancelled = [e for e in events(session.deployment, "cancel") if e.time >= began]
        submitted = [e for e in events(session.deployment, "submit") if e.time >= began]
    finally:
        _resume(runner, nodes)
    assert during == [], during
    print(f"maintenance drain: {len(session.traffic.since(began))} requests, 0 failed")
    assert still == {m: r["id"] for m, r in before.items()}
    assert drained == [] and cancelled == [] and submitted == []
    # resumed: the next plans place both models where they are; nothing moves
    resumed = time.time()
    wait_until(lambda: [e for e in events(session.deployment, "plan")
                        if e.time >= resumed and "no replicas" not in e.message], 30,
               "a plan after the resume")
    wait_cycles([session.deployment], 5)  # nothing moves over 5 cycles, counted, not slept
    assert {m: _replica(session.deployment, m)["id"] for m in (A, B)} == still
    assert session.failures_since(began) == []
    assert not [e for e in events(session.deployment, "submit") if e.time >= began]


def test_a_controller_outage_fails_nothing_cancels_nothing_and_converges(session):
    """slurmctld stopped 25 s (`scripts/dev-cluster ctld-outage`, which starts it again keeping
    every job even if this test dies): the gateway keeps answering, the daemon cancels and
    submits nothing, and its facts are current again within a cycle of the controller's return.
    """
    from coral_hpc.store import open_store

    runner = SlurmRunner()
    jobs = sorted(j.job_id for j in tagged_jobs(runner.env, session.deployment))
    assert len(jobs) == 2
    began = time.time()
    outage = subprocess.Popen([str(REPO / "scripts" / "dev-cluster"), "ctld-outage", "25"],
                              env=runner.env, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: runner.run("scontrol", "ping", check=False).stdout.count("DOWN"),
                   20, "slurmctld down")
        outage.wait(90)
    finally:
        if outage.poll() is None:
            outage.wait(90)
        # whatever happened above, the shared controller is up when this test ends
        subprocess.run([str(REPO / "scripts" / "dev-cluster"), "ctld-start"], env=runner.env,
                       check=False, timeout=60)
    back = time.time()
    assert outage.returncode == 0, outage.stdout.read().decode() if outage.stdout else ""
    assert "UP" in runner.run("scontrol", "ping").stdout

    def observed_since_back() -> bool:
        store = open_store(session.deployment.db_path, readonly=True)
        try:
            live = store.replicas(live_only=True)
        finally:
            store.close()
        return bool(live) and all((r.last_seen_at or 0) >= back for r in live)

    wait_until(observed_since_back, 10, "every replica observed after the controller's return")
    converged_s = time.time() - back
    session.wait_answers(8)  # serving after convergence, counted, not 2 s slept
    assert session.failures_since(began) == []
    assert sorted(j.job_id for j in tagged_jobs(runner.env, session.deployment)) == jobs
    for kind in ("cancel", "drain", "submit"):
        assert not [e for e in events(session.deployment, kind) if e.time >= began], kind
    print(f"controller outage: {len(session.traffic.since(began))} requests, 0 failed; "
          f"converged {converged_s:.1f} s after its return")


def test_walltime_rotation_at_a_3_minute_limit_fails_no_request(slurm_cluster, tmp_path):
    """A 3-minute time limit: Slurm warns 90 s before it and the replica drains; the daemon
    starts its successor 45 s before that and retires it once the successor is READY. Before:
    193 of 960 requests failed during replacement rounds."""
    os.environ["SLURM_CONF"] = slurm_cluster["SLURM_CONF"]
    config = write_config(tmp_path, "00:03:00", (A,), walltime_lead_s=45)
    deployment = load_deployment(config)
    try:
        with (serve_deployment(config, RoomPlanner(CANDIDATES)) as served,
              Session(served, (A,)) as session):
            session.wait_serving()
            first = _replica(deployment, A)
            began = time.time()
            wait_until(lambda: first["id"] not in {r["id"] for r in replicas(deployment)}, 200,
                       "the first replica rotated out")
            session.wait_answers(10)  # serving after the rotation, counted, not 3 s slept
            assert session.traffic is not None
            answers = session.traffic.since(began)
            failures = session.failures_since(began)
            successor = _replica(deployment, A)
    finally:
        cancel_deployment(slurm_cluster, deployment)
    assert failures == [], failures
    assert len(answers) > 50 and successor["id"] != first["id"]
    print(f"walltime rotation: {len(answers)} requests, {len(failures)} failed")
