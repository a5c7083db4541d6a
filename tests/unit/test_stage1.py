"""Stage 1 in shards (coral_solver.stage1): parallel == serial == build_library, a partial or killed
run resumes from the shards it finished, the planner's cache is written, bad specs exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coral_solver import stage1
from coral_solver.templates import PerfThroughput, build_library
from coral_solver.types import ModelSpec, Policy

ROOT = Path(__file__).resolve().parents[2]

MODEL = ModelSpec("q8", "qwen3-8b", 1024, 256, 2.0, 0.08, disaggregation="auto")
SPEC = stage1.Spec((MODEL,), {"east": {"a100": (8, 80.0), "l4": (4, 24.0)},
                              "west": {"l40s": (4, 48.0)}}, Policy(n_max=3))


def _serial_reference(spec: stage1.Spec) -> dict:
    tm = PerfThroughput()
    return {d: build_library(spec.models, gpus, spec.policy, tm, use_cache=False)
            for d, gpus in spec.domains.items()}


def test_parallel_and_serial_shards_merge_to_the_serial_library(tmp_path):
    tm = PerfThroughput()
    shards = stage1.shard_plan(SPEC, tm)
    # 3 roles × TP 1/2/4/8 on east (8-GPU a100 nodes), TP 1/2/4 on west (4-GPU l40s nodes)
    assert len(shards) == 3 * 4 + 3 * 3
    serial = stage1.run(SPEC, tmp_path / "serial", tm, workers=1)
    parallel = stage1.run(SPEC, tmp_path / "parallel", tm, workers=2)
    assert (serial.computed, parallel.computed) == (len(shards), len(shards))
    one = stage1.merge(SPEC, tmp_path / "serial", tm)
    two = stage1.merge(SPEC, tmp_path / "parallel", tm)
    assert one == two == _serial_reference(SPEC)
    assert {t.role for t in one["east"]["q8"]} == {"both", "prefill", "decode"}
    assert not any(t.stages[0].gpu_type == "l40s" for t in one["east"]["q8"])  # no spanning


def test_a_partial_run_resumes_and_array_tasks_split_the_shards(tmp_path):
    tm = PerfThroughput()
    total = len(stage1.shard_plan(SPEC, tm))
    first = stage1.run(SPEC, tmp_path, tm, limit=5)
    assert (first.done_before, first.computed) == (0, 5)
    with pytest.raises(stage1.Incomplete, match=f"{total - 5} of {total}"):
        stage1.merge(SPEC, tmp_path, tm)
    # two array tasks share the folder: each takes every 2nd shard and skips finished ones
    a = stage1.run(SPEC, tmp_path, tm, task=0, tasks=2)
    b = stage1.run(SPEC, tmp_path, tm, task=1, tasks=2)
    assert a.assigned + b.assigned == total
    assert a.done_before + b.done_before == 5 and a.computed + b.computed == total - 5
    # a damaged shard is recomputed, not trusted
    victim = next((tmp_path / "shards").glob("*.json"))
    victim.write_text("{not json")
    again = stage1.run(SPEC, tmp_path, tm)
    assert (again.done_before, again.computed) == (total - 1, 1)
    assert stage1.merge(SPEC, tmp_path, tm) == _serial_reference(SPEC)


def test_models_alike_but_for_their_name_share_their_shards(tmp_path):
    twin = ModelSpec(**{**MODEL.__dict__, "name": "twin"})
    spec = stage1.Spec((MODEL, twin), SPEC.domains, SPEC.policy)
    tm = PerfThroughput()
    report = stage1.run(spec, tmp_path, tm, workers=1)
    assert report.computed == len(stage1.shard_plan(SPEC, tm))  # the twin's are the same files
    merged = stage1.merge(spec, tmp_path, tm)
    assert merged == _serial_reference(spec)
    assert {t.model for t in merged["east"]["twin"]} == {"twin"}
    paths = stage1.write_cache(spec, merged, tmp_path / "cache", tm)
    assert len(paths) == len(spec.domains)  # one cache entry per domain serves both names


def test_a_killed_run_continues_from_the_shards_it_finished(tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC.to_json()))
    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-m", "coral_solver.stage1", "run", "--spec",
                             str(spec_file), "--work", str(work), "--workers", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(work.glob("shards/*.json"))) < 2:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(work.glob("shards/*.json")))
    tm = PerfThroughput()
    total = len(stage1.shard_plan(SPEC, tm))
    assert 2 <= finished < total
    resumed = stage1.run(SPEC, work, tm)
    assert (resumed.done_before, resumed.computed) == (finished, total - finished)
    assert stage1.merge(SPEC, work, tm) == _serial_reference(SPEC)


def test_merge_writes_the_cache_the_planner_reads(tmp_path):
    tm = PerfThroughput()
    stage1.run(SPEC, tmp_path / "work", tm)
    libraries = stage1.merge(SPEC, tmp_path / "work", tm)
    paths = stage1.write_cache(SPEC, libraries, tmp_path / "cache", tm)
    assert len(paths) == 2

    class NoSearch(PerfThroughput):
        def throughput(self, *args, **kwargs):  # a cache hit never searches
            raise AssertionError("Stage 1 recomputed a library the array job had cached")

        phase_throughput = throughput

    for domain, gpus in SPEC.domains.items():
        got = build_library(SPEC.models, gpus, SPEC.policy, NoSearch(),
                            cache_dir=tmp_path / "cache")
        assert got == libraries[domain]


def test_a_bad_spec_exits_2_naming_the_field(tmp_path, capsys):
    bad = SPEC.to_json()
    bad["models"][0]["ttft"] = 1.0
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(bad))
    assert stage1.main(["shards", "--spec", str(path)]) == 2
    assert "models[0]: unknown field(s) ['ttft']" in capsys.readouterr().err
    bad = SPEC.to_json()
    bad["domains"]["east"]["a100"] = [8]
    path.write_text(json.dumps(bad))
    assert stage1.main(["run", "--spec", str(path), "--work", str(tmp_path)]) == 2
    assert "domains.east.a100: expected [gpus per node, GPU memory GB]" in \
        capsys.readouterr().err
    bad = SPEC.to_json()
    bad["policy"]["capacity"] = "guess"
    path.write_text(json.dumps(bad))
    assert stage1.main(["shards", "--spec", str(path)]) == 2
    assert "policy: policy capacity 'guess'" in capsys.readouterr().err
    assert stage1.main(["merge", "--spec", str(tmp_path / "absent.json"), "--work", "x"]) == 2
