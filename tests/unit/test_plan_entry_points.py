"""`coral-hpc serve` and `coral-hpc plan` plan through one planner: on the same recorded cluster,
with one of our replicas already running, the daemon's planning step (observe → adopt → plan on
a fake Slurm) and the CLI (`coral-hpc plan --snapshot --json`) make the same plan, down to each
replica's layout."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from coral_hpc.config import load_deployment
from coral_hpc.daemon.core import Daemon
from coral_hpc.launch.spec import replica_spec
from coral_hpc.plan.planner import Planner
from coral_hpc.reconcile.act import Actor
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_hpc.store import open_store
from coral_hpc.types import JobTag, ReplicaLayout, StageLayout
from tests.conftest import REPO
from tests.fakes.slurm import FakeSlurm, recorded_snapshot

MODELS = REPO / "examples" / "models.yaml"
NOW = 10_000.0
RUNNING_TEMPLATE = "qwen3-8b.tp2.v100-36"  # a template the plan would not pick on an idle cluster


def with_our_running_replica(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The recorded cluster with one replica of ours running on 2 GPUs of v100-01."""
    nodes = tuple(replace(n, state="mixed", gpus_alloc=2, gpus_free=n.gpus_total - 2,
                          cpus_alloc=8, mem_alloc_gb=64.0) if n.name == "v100-01" else n
                  for n in snapshot.nodes)
    tag = JobTag("demo", "qwen3-8b", "r0adopt", RUNNING_TEMPLATE)
    data = replace(snapshot, nodes=nodes, observed_at=NOW).to_dict()
    data["jobs"] = [{
        "job_id": "77", "tag": tag.__dict__, "name": tag.job_name(), "state": "RUNNING",
        "reason": None, "partition": "v100", "nodes": ["v100-01"], "num_nodes": 1,
        "submit_time": NOW - 200, "start_time": NOW - 100, "end_time": None,
        "time_limit_s": 7200, "time_left_s": 7100, "expected_start": None, "restarts": 0,
        "gpus": 2, "gpu_type": "v100",
    }]
    return ClusterSnapshot.from_dict(data)


class Recording(Planner):
    """The real planner, keeping what the daemon asked and got."""

    def __call__(self, request):
        self.request = request
        self.outcome = super().__call__(request)
        return self.outcome


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


def test_serve_and_plan_make_the_same_plan(tmp_path, cache):
    snapshot = with_our_running_replica(recorded_snapshot())
    snapshot_file = tmp_path / "snapshot.json"
    snapshot_file.write_text(json.dumps(snapshot.to_dict()))

    # `coral-hpc plan`
    run = CliRunner().invoke(plan_command, [str(MODELS), "--snapshot", str(snapshot_file),
                                            "--json", "--cache-dir", str(cache)])
    assert run.exit_code == 0, run.output
    cli = json.loads(run.stdout)

    # `serve`: the daemon adopts the running job, then plans
    deployment = load_deployment(MODELS).model_copy(update={"state_dir": tmp_path / "shared"})
    # the running job's spec.json, as its submission wrote it: a job without one is left alone
    replica_spec(deployment, "qwen3-8b", "r0adopt", RUNNING_TEMPLATE,
                 ReplicaLayout(2, (StageLayout("v100", "v100", 36),), "half"),
                 api_key_file=None).write()
    store = open_store(tmp_path / "daemon.db")
    slurm = FakeSlurm(snapshot, clock=lambda: NOW)
    planner = Recording(cache_dir=cache)
    settings = ReconcileSettings.from_policy(deployment.policy)
    actor = Actor(deployment, store, slurm, settings, lambda: NOW, None, submit=slurm.submit_spec)
    daemon = Daemon(deployment, store, slurm, planner, api_key_file=None,
                    table_path=tmp_path / "routes.json", clock=lambda: NOW, actor=actor)
    daemon.reconcile_once()
    adopted = store.replica_by_job("77")  # adopted, not resubmitted
    assert adopted is not None and adopted.reason == "adopted"
    assert planner.request.running == ((RUNNING_TEMPLATE, ("v100",)),)

    served = sorted((s.template_id, s.partitions, s.count) for s in daemon.plan.slots)
    planned = sorted((r["template"], tuple(st["partition"] for st in r["stages"]), r["count"])
                     for r in cli["replicas"])
    assert served == planned
    # whether the running replica is kept is the plan's cost choice (start-up penalty against
    # cheaper layouts): both paths make it alike
    assert planner.outcome.cost_per_hour == pytest.approx(cli["cost_per_hour"])
    assert planner.outcome.problems == () and cli["checker_problems"] == []
    layouts = {(s.template_id, s.partitions): s.layout for s in daemon.plan.slots}
    for row in cli["replicas"]:
        layout = layouts[(row["template"], tuple(st["partition"] for st in row["stages"]))]
        assert (layout.tp, layout.pp, layout.dtype, layout.role, layout.layer_partition) == (
            row["tp"], row["pp"], row["dtype"], row["role"], row["layer_partition"])
    store.close()
