"""A real daemon (real Slurm, real sim-engine replica jobs, real SQLite) with a small rule-based
planner, for reconcile scenarios that must not depend on what the optimiser prefers.

The planner takes candidate slots in order of preference and picks, for each model, the first
whose partition is up and not excluded — enough to show the reconcile loop moving, replacing,
rotating and cooling down replicas. The solver's own plans are exercised by the serve test that
runs ``coral-hpc serve`` on the example.

Run as a script (``python -m tests.integration.serve_harness CONFIG CANDIDATES_JSON``) it is the
daemon process the kill -9 test kills and restarts.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path

from coral_hpc.config import Deployment, load_deployment
from coral_hpc.daemon import ensure_replica_key
from coral_hpc.daemon.core import Daemon
from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.plan.layout import layout_dtype
from coral_hpc.plan.planner import PlanOutcome, PlanRequest
from coral_hpc.slurm import make_client
from coral_hpc.store import open_store
from coral_hpc.types import ReplicaLayout, StageLayout
from coral_solver.catalog import model_arch


def slot(model: str, arch: str, partition: str, gpu: str, tp: int = 1, count: int = 1,
         throughput: float = 2.0) -> Slot:
    """A single-stage slot: ``count`` replicas of ``model`` on one ``gpu`` node of ``partition``."""
    layers = model_arch(arch).layers
    layout = ReplicaLayout(tp, (StageLayout(partition, gpu, layers),), layout_dtype(arch, [gpu]))
    return Slot(model=model, template_id=f"{model}.tp{tp}.{gpu}-{layers}", count=count,
                throughput=throughput, cost_per_hour=float(tp), layout=layout)


class PreferencePlanner:
    """Per model, the first candidate slot whose partition is up and not excluded."""

    def __init__(self, candidates: list[Slot]):
        self.candidates = candidates
        self.requests: list[PlanRequest] = []

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        self.requests.append(request)
        up = {p.name for p in request.snapshot.partitions if p.state == "up"}
        chosen: dict[str, Slot] = {}
        for candidate in self.candidates:
            if candidate.model in chosen or candidate.partitions[0] not in up:
                continue
            if candidate.template_id in request.excluded_templates:
                continue
            if (candidate.template_id, candidate.partitions) in request.excluded_shapes:
                continue
            chosen[candidate.model] = candidate
        slots = tuple(chosen.values())
        return PlanOutcome(DesiredPlan(0.0, slots), sum(s.count * s.cost_per_hour for s in slots),
                           0.0, "rule")


def build_daemon(deployment: Deployment, planner, env: dict[str, str] | None = None) -> Daemon:
    """A daemon with the real CLI Slurm client and a real store, no gateway."""
    from coral_hpc.gateway.table import default_replica_key_path, default_table_path

    store = open_store(deployment.db_path)
    key = ensure_replica_key(default_replica_key_path(deployment))
    client = make_client("cli", env=env, timeout_s=30)
    return Daemon(deployment, store, client, planner, api_key_file=key,
                  table_path=default_table_path(deployment))


def candidates_to_json(candidates: list[Slot]) -> str:
    return json.dumps([{"model": c.model, "template_id": c.template_id, "count": c.count,
                        "throughput": c.throughput, "cost_per_hour": c.cost_per_hour,
                        "layout": c.layout.to_dict()} for c in candidates])


def candidates_from_json(text: str) -> list[Slot]:
    return [Slot(model=c["model"], template_id=c["template_id"], count=c["count"],
                 throughput=c["throughput"], cost_per_hour=c["cost_per_hour"],
                 layout=ReplicaLayout.from_dict(c["layout"])) for c in json.loads(text)]


def main(argv: list[str]) -> int:
    """Run a harness daemon until SIGTERM (or until killed)."""
    import signal

    from coral_hpc.daemon.process import DaemonLock, lock_path

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    deployment = load_deployment(argv[0])
    planner = PreferencePlanner(candidates_from_json(Path(argv[1]).read_text()))
    lock = DaemonLock(lock_path(deployment))
    lock.acquire()
    daemon = build_daemon(deployment, planner)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [loop.start() for loop in daemon.loops(stop)]
    while not stop.wait(0.5):
        pass
    for thread in threads:
        thread.join(30)
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
