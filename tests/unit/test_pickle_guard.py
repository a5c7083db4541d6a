"""Issue 16, Why-3 (unit part): when the submitting daemon died between sbatch and submitit's
pickle rename, the job writes the replica's own call as submitit's pickle instead of failing."""

from __future__ import annotations

from pathlib import Path

from submitit.core.utils import DelayedSubmission

from coral_hpc.launch.entrypoint import run_replica
from coral_hpc.launch.pickle_guard import ensure_submitted_pickle, main, submitted_pickle
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
    umask, line = submitit_parameters(spec)["setup"]
    assert umask == "umask 077"  # issue 28: what the job writes is the service account's alone
    assert line.split() == [spec.python, "-m", "coral_hpc.launch.pickle_guard",
                            str(spec.logs_dir), str(spec.spec_file), "||", "exit", "1"]


# Issue 28 item 2: submitit unpickles and runs the call as the service account, so the guard
# ends the job (exit 1, before submitit reads the pickle) when others could have swapped it.


def test_the_guard_refuses_a_folder_others_may_write(tmp_path: Path, monkeypatch, capsys):
    folder = tmp_path / "logs"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv("SLURM_JOB_ID", "31")
    assert main([str(folder), str(tmp_path / "spec.json")]) == 1
    assert f"chmod 700 {folder}" in capsys.readouterr().err
    assert not submitted_pickle(folder, "31").exists()


def test_the_guard_refuses_a_pickle_others_may_write(tmp_path: Path, monkeypatch, capsys):
    folder = tmp_path / "logs"
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    pickle = submitted_pickle(folder, "32")
    DelayedSubmission(print, "swapped").dump(pickle)
    pickle.chmod(0o666)
    monkeypatch.setenv("SLURM_JOB_ID", "32")
    assert main([str(folder), str(tmp_path / "spec.json")]) == 1
    assert f"chmod 600 {pickle}" in capsys.readouterr().err


def test_the_guard_passes_a_private_folder(tmp_path: Path, monkeypatch):
    folder = tmp_path / "logs"
    folder.mkdir()
    folder.chmod(0o700)
    DelayedSubmission(print, "own").dump(submitted_pickle(folder, "33"))
    submitted_pickle(folder, "33").chmod(0o600)
    monkeypatch.setenv("SLURM_JOB_ID", "33")
    assert main([str(folder), str(tmp_path / "spec.json")]) == 0
