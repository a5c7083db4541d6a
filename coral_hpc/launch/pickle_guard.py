"""``python -m coral_hpc.launch.pickle_guard FOLDER SPEC_FILE``: the first line a submitit replica's
batch script runs (submitit's ``setup``), before ``srun`` starts the entrypoint.

submitit pickles the submitted call under a temporary name, runs sbatch, and only then renames the
pickle to ``<job id>_submitted.pkl``; the job waits 60 s for that name and fails. A daemon killed
between sbatch and the rename (kill -9 during submission, issue 16: 3 of 3 tries) left a job that
failed at start, kept its model down ~63 s and counted toward the template's crash cool-down.
The call a replica job makes is known without the pickle — ``run_replica(SPEC_FILE)``, the spec
written before sbatch — so when the pickle has not appeared within :data:`WAIT_S`, the job writes
it itself (atomically; a late rename by the daemon replaces it with the same call).

submitit's job then unpickles that file and runs it as the service account, so first the guard
refuses (exit 1, which ends the job before submitit reads anything) a folder or pickle that is not
the user's or that group or others may write: a swapped pickle would run anyone's code.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from coral_hpc.atomic import not_private_problem

#: How long to wait for submitit's own rename before writing the pickle: the rename follows
#: sbatch's answer by milliseconds, so seconds mean the submitting process is gone.
WAIT_S = 10.0


def submitted_pickle(folder: Path, job_id: str) -> Path:
    """submitit's name for a job's pickle (``submitit.core.utils.JobPaths.submitted_pickle``)."""
    return Path(folder) / f"{job_id}_submitted.pkl"


def ensure_submitted_pickle(folder: Path, job_id: str, spec_file: Path, wait_s: float = WAIT_S,
                            sleep: Callable[[float], None] = time.sleep) -> str:
    """``"present"`` when submitit's pickle appears within ``wait_s``; otherwise write the
    replica's call there and return ``"written"``."""
    from submitit.core.utils import DelayedSubmission

    from coral_hpc.launch.entrypoint import run_replica

    target = submitted_pickle(folder, job_id)
    deadline = time.monotonic() + wait_s
    while True:
        if target.exists():
            return "present"
        if time.monotonic() >= deadline:
            break
        sleep(0.5)
    tmp = target.with_name(f".{job_id}.guard.{os.getpid()}.pkl")
    DelayedSubmission(run_replica, str(spec_file)).dump(tmp)
    if target.exists():  # renamed meanwhile: keep submitit's own
        tmp.unlink(missing_ok=True)
        return "present"
    tmp.replace(target)
    return "written"


def unsafe_pickle_problem(folder: Path, job_id: str) -> str | None:
    """Why submitit must not unpickle job ``job_id``'s call from ``folder``, or None: the folder
    or the pickle is not this user's, or group or others may write it."""
    return (not_private_problem(folder, "submitit folder")
            or not_private_problem(submitted_pickle(folder, job_id), "submitit pickle"))


def main(argv: list[str]) -> int:
    folder, spec_file = Path(argv[0]), Path(argv[1])
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        print("pickle_guard: SLURM_JOB_ID is not set; nothing to do", file=sys.stderr)
        return 0
    problem = unsafe_pickle_problem(folder, job_id)
    if problem:
        print(f"pickle_guard: refusing to run job {job_id}: {problem}", file=sys.stderr)
        return 1
    outcome = ensure_submitted_pickle(folder, job_id, spec_file)
    problem = unsafe_pickle_problem(folder, job_id)
    if problem:
        print(f"pickle_guard: refusing to run job {job_id}: {problem}", file=sys.stderr)
        return 1
    if outcome == "written":
        print(f"pickle_guard: the submitting process never renamed the pickle of job {job_id}; "
              f"wrote run_replica({spec_file}) as {submitted_pickle(folder, job_id)}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
