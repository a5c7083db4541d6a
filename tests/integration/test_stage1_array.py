"""Stage 1 as a Slurm array job on the local cluster (sbatch_templates/stage1-array.sbatch):
three array tasks share the shards, a dependent job merges them into the planner's cache, and the
planner then reads that library instead of searching."""

from __future__ import annotations

import json
import sys
import time

import pytest

from coral_solver.templates import PerfThroughput, build_library
from tests.conftest import REPO
from tests.unit.test_stage1 import SPEC, _serial_reference

pytestmark = pytest.mark.slurm

TEMPLATE = REPO / "sbatch_templates" / "stage1-array.sbatch"


def _wait_gone(slurm, job_ids: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = slurm.run("squeue", "-h", "-o", "%i", "-j", ",".join(job_ids), check=False)
        if not out.stdout.strip():
            return
        time.sleep(1.0)
    raise AssertionError(f"jobs {job_ids} still queued or running after {timeout_s} s")


def test_the_array_job_computes_the_shards_and_the_merge_fills_the_planners_cache(slurm,
                                                                                   tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC.to_json()))
    work, cache = tmp_path / "work", tmp_path / "cache"
    common = f"ALL,SPEC={spec_file},WORK={work},CORAL_PYTHON={sys.executable}"
    array = slurm.sbatch("--array=0-2", "-p", "v100", "--cpus-per-task=2", "--time=10",
                         f"--export={common}", "--output", str(tmp_path / "s1-%A_%a.out"),
                         str(TEMPLATE))
    merge = slurm.sbatch(f"--dependency=afterok:{array}", "-p", "v100", "--time=10",
                         f"--export={common},MERGE=1,CACHE_DIR={cache}",
                         "--output", str(tmp_path / "merge-%j.out"), str(TEMPLATE))
    _wait_gone(slurm, [array, merge], 300)
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.out")}
    reports = [json.loads(text.strip().splitlines()[-1]) for name, text in logs.items()
               if name.startswith("s1-")]
    assert len(reports) == 3, logs
    total = reports[0]["shards"]
    # every task took its own share of the shards, and together they computed all of them
    assert all(r["assigned"] > 0 for r in reports)
    assert sum(r["assigned"] for r in reports) == sum(r["computed"] for r in reports) == total
    merged = json.loads(next(t for n, t in logs.items() if n.startswith("merge-"))
                        .strip().splitlines()[-1])
    assert merged["cache_files"] == 2

    class NoSearch(PerfThroughput):
        def throughput(self, *args, **kwargs):
            raise AssertionError("the planner searched a library the array job had cached")

        phase_throughput = throughput

    reference = _serial_reference(SPEC)
    for domain, gpus in SPEC.domains.items():
        assert build_library(SPEC.models, gpus, SPEC.policy, NoSearch(),
                             cache_dir=cache) == reference[domain]
