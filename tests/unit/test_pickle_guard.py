"""Issue 16, Why-3 (unit part): when the submitting daemon died between sbatch and submitit's
pickle rename, the job writes the replica's own call as submitit's pickle instead of failing."""

from __future__ import annotations

from pathlib import Path

from submitit.core.utils import DelayedSubmission

from coral_hpc.launch.entrypoint import run_replica
from coral_hpc.launch.pickle_guard import ensure_submitted_pickle, submitted_pickle
from coral_hpc.launch.submit import submitit_parameters
from tests.unit.launch_cases import case_spec


def test_a_missing_pickle_is_written_with_the_replicas_call(tmp_path: Path):
    spec_file = tmp_path / "replicas" / "r1" / "spec.json"
    assert ensure_submitted_pickle(tmp_path, "4242", spec_file, wait_s=0) == "written"
    loaded = DelayedSubmission.load(submitted_pickle(tmp_path, "4242"))
    assert loaded.function is run_replica and loaded.args == (str(spec_file),)
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["4242_submitted.pkl"]


def test_submitits_own_pickle_is_kept(tmp_path: Path):
    DelayedSubmission(print, "submitit's own").dump(submitted_pickle(tmp_path, "7"))
    waited = []
    assert ensure_submitted_pickle(tmp_path, "7", tmp_path / "s.json", wait_s=5,
                                   sleep=waited.append) == "present"
    assert DelayedSubmission.load(submitted_pickle(tmp_path, "7")).args == ("submitit's own",)
    assert waited == []


def test_every_submitit_job_runs_the_guard_first():
    spec = case_spec("single", "sim")
    (line,) = submitit_parameters(spec)["setup"]
    assert line.split() == [spec.python, "-m", "coral_hpc.launch.pickle_guard",
                            str(spec.logs_dir), str(spec.spec_file)]
