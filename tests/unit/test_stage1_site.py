"""A site's Stage 1 done elsewhere: `coral-hpc plan --export-stage1-spec` writes the work, the
sharded run (as an array job would) merges it into the cache folder, and the planner then plans
on that library without searching."""

from __future__ import annotations

import json

from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from coral_hpc.config import load_deployment
from coral_hpc.plan.figures import use_measured_profiles
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_solver import stage1
from coral_solver.templates import PerfThroughput, build_library
from tests.conftest import REPO
from tests.fakes.slurm import recorded_snapshot

MODELS = REPO / "examples" / "models.yaml"


class NoSearch(PerfThroughput):
    """The planner's throughput model, refusing to search (a Stage-1 cache hit never does;
    the checker still asks it, so it stands in for Stage 1 only)."""

    def throughput(self, *args, **kwargs):
        raise AssertionError("the planner searched a library the Stage-1 run had cached")

    phase_throughput = throughput


def test_exported_spec_run_and_merged_elsewhere_is_the_library_the_planner_uses(tmp_path):
    snapshot_file = tmp_path / "snapshot.json"
    snapshot_file.write_text(json.dumps(recorded_snapshot().to_dict()))
    spec_file = tmp_path / "spec.json"
    run = CliRunner().invoke(plan_command, [str(MODELS), "--snapshot", str(snapshot_file),
                                            "--export-stage1-spec", str(spec_file)])
    assert run.exit_code == 0, run.output
    spec = stage1.Spec.from_json(json.loads(spec_file.read_text()))
    deployment = load_deployment(MODELS)
    assert [m.name for m in spec.models] == [m.name for m in deployment.models]
    # the sharded run, two processes, then the merge into the planner's cache folder
    assert stage1.main(["run", "--spec", str(spec_file), "--work", str(tmp_path / "work"),
                        "--workers", "2"]) == 0
    cache = tmp_path / "cache"
    assert stage1.main(["merge", "--spec", str(spec_file), "--work", str(tmp_path / "work"),
                        "--cache-dir", str(cache)]) == 0
    request = PlanRequest.from_snapshot(deployment, recorded_snapshot())
    # Stage 1 as the planner asks it (the same inputs, so the same key) finds the merged library
    use_measured_profiles(deployment)
    models, cluster, policy = Planner().inputs(request)
    cached = build_library(models, cluster.gpu_types(), policy, NoSearch(), cache_dir=cache)
    assert cached == build_library(models, cluster.gpu_types(), policy, PerfThroughput(),
                                   use_cache=False)
    planned = Planner(cache_dir=cache).solve(request)
    assert planned.status == "optimal" and planned.problems == ()
