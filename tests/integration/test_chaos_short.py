"""The chaos soak's short version (``bench/chaos.py --short``), run as a user runs it: a process of
its own on the local cluster, judged by the report it writes. One fault of each kind — kill -9 of
the daemon and of the gateway, scancel, a node drain, a controller outage, a partition taken by
another lab's jobs — lands on ``coral-hpc serve`` of two sim-engine models while requests flow,
and every replica reaches its 5-minute time limit at least once.

It must show: no request failed but while the gateway itself was killed (nothing listens on the
port then), no duplicate or orphaned job, nothing left after ``down``, and every fault recovered
from (every model back to two READY replicas, as the daemon observes them after the fault).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slurm

FAULTS = {"kill_daemon", "kill_gateway", "scancel", "drain_node", "ctld_outage",
          "partition_taken"}


def test_one_fault_of_each_kind_loses_no_request_and_leaves_nothing_behind(slurm_cluster,
                                                                           tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--short",
                          "--out", str(tmp_path)], cwd=REPO, env=slurm_cluster,
                         capture_output=True, text=True, timeout=1200, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "chaos.json").read_text())
    summary = (tmp_path / "chaos.md").read_text()

    assert {f["kind"] for f in report["faults"]} == FAULTS, summary
    assert all(f["recovered_s"] is not None for f in report["faults"]), summary
    requests = report["requests"]
    assert requests["sent"] > 500, summary
    assert requests["failed_counted"] == 0, summary
    assert report["duplicates"] == [] and report["orphans"] == [], summary
    assert report["jobs_left_after_down"] == [], summary
    assert report["leaked_processes"] == [], summary
    assert report["down_exit"] == 0, summary
    assert report["walltime_rotations"] >= 4, summary  # each model's two replicas at least
