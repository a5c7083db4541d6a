"""`coral-hpc cluster` on a saved snapshot (built from recorded Slurm output): the table, the JSON
round trip, and clear errors for a bad file. The live command is tested in
tests/integration/test_slurm_cluster.py."""

from __future__ import annotations

import json

import pytest

from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.cli.cluster import partition_rows
from coral_hpc.slurm.pyslurm_backend import pyslurm_unusable_reason
from tests.unit.test_slurm_snapshot import client


def saved_snapshot(tmp_path):
    snap = client()[0].snapshot("dep1")
    path = tmp_path / "snap.json"
    path.write_text(snap.to_json())
    return snap, path


def test_json_from_snapshot_file_is_the_same_snapshot(tmp_path):
    snap, path = saved_snapshot(tmp_path)
    result = CliRunner().invoke(cli, ["cluster", "--json", "--snapshot", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json.loads(snap.to_json())


def test_table_rows_count_unavailable_gpus(tmp_path):
    snap, path = saved_snapshot(tmp_path)
    rows = {(r["partition"], r["gpu_type"]): r for r in partition_rows(snap)}
    # a100-02 is drained in the recording: its 4 GPUs are unavailable, not free
    a100 = rows[("a100", "a100")]
    assert a100["gpus_total"] == 8 and a100["gpus_unavailable"] == 4
    assert a100["gpus_free"] == snap.node("a100-01").gpus_free
    assert rows[("gpu", "v100")]["billing_per_gpu"] == 1.2
    result = CliRunner().invoke(cli, ["cluster", "--snapshot", str(path)])
    assert result.exit_code == 0 and "a100-80g" in result.output


def test_bad_snapshot_files_exit_2_naming_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"slurm_version": "22.05.8"}')
    result = CliRunner().invoke(cli, ["cluster", "--snapshot", str(bad)])
    assert result.exit_code == 2 and str(bad) in result.output and "observed_at" in result.output
    result = CliRunner().invoke(cli, ["cluster", "--snapshot", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "missing.json" in result.output


def test_pyslurm_backend_refused_with_the_reason_when_unusable():
    import importlib.util

    from coral_hpc.slurm.client import BackendUnavailable, make_client

    if importlib.util.find_spec("pyslurm") is not None:
        pytest.skip("pyslurm is installed here; tests/integration/test_slurm_pyslurm.py compares backends")
    assert "does not import" in pyslurm_unusable_reason("22.05.8")
    with pytest.raises(BackendUnavailable, match="pyslurm"):
        make_client("pyslurm")
    assert make_client("auto").backend == "cli"
