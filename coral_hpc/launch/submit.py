"""Submit one replica as a Slurm job.

Single-node and homogeneous multi-node replicas go through submitit (the job runs
:func:`coral_hpc.launch.entrypoint.run_replica`, one task per node). Heterogeneous replicas —
stages on different partitions or GPU types — are Slurm heterogeneous jobs, which submitit cannot
express: their batch script is rendered from ``sbatch_templates/hetjob.sbatch.j2`` and submitted
through ``coral_hpc.slurm`` (the only layer that runs Slurm commands; submitit running sbatch
itself is the one accepted exception).

Every job: partition, ``gpu:TYPE:N`` GRES, nodes, time limit, account/QOS, the reservation
when the plan put the replica in one, the :class:`JobTag`
in name and comment, ``--no-requeue`` (the daemon resubmits by itself), ``--signal=USR2@90``, and
logs under ``<state_dir>/<deployment>/logs/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import submitit

from coral_hpc.atomic import private_dir, write_atomic
from coral_hpc.launch.entrypoint import run_replica
from coral_hpc.launch.quoting import shell_word, slurm_word
from coral_hpc.launch.render import render_engine_script, render_hetjob
from coral_hpc.launch.spec import SIGNAL_LEAD_S, ReplicaSpec
from coral_hpc.slurm.errors import classify

#: how a failed submission is named in errors (submitit runs the command itself)
_SUBMIT_ARGV = ("submitit-sbatch",)
#: secrets a job must never inherit from the daemon's shell: sbatch exports the submitting
#: environment to the job by default, and the engine gets them from their files instead
WITHHELD_ENV = ("HF_TOKEN", "VLLM_API_KEY", "HUGGING_FACE_HUB_TOKEN")


@contextmanager
def secrets_withheld() -> Iterator[None]:
    """Leave the secrets out of this process's environment while sbatch runs (submitit and the
    Slurm layer both hand sbatch ``os.environ``), so no job's environment holds them."""
    saved = {name: os.environ.pop(name) for name in WITHHELD_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class ScriptSubmitter(Protocol):
    """What hetjob submission needs from ``coral_hpc.slurm``: submit a batch script file."""

    def submit_script(self, script: Path) -> str: ...


def submitit_parameters(spec: ReplicaSpec) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters of a single-node or homogeneous replica."""
    if spec.layout.kind == "hetero":
        raise ValueError(f"replica {spec.replica_id} is heterogeneous: submit it as a hetjob")
    request = spec.stage_request(spec.stages[0])
    tag = spec.tag
    # submitit writes `#SBATCH --key=value` unquoted: only bare Slurm names may reach those lines
    params: dict[str, Any] = {
        "job_name": tag.job_name(),
        "comment": tag.comment(),
        "partition": str(slurm_word(request.partition)),
        "nodes": spec.pp,
        "ntasks_per_node": 1,  # one entrypoint per node: the node rank is SLURM_PROCID
        "gres": str(slurm_word(request.gres)),
        "cpus_per_task": request.cpus,
        "mem": request.mem,
        "time": spec.time_limit_min,
        "signal_delay_s": SIGNAL_LEAD_S,
        "stderr_to_stdout": True,
        "wckey": None,  # submitit would tag every job with the wckey "submitit"
        "additional_parameters": {"no_requeue": True},
    }
    if request.reservation:
        # the plan put this replica on a reservation's nodes: only jobs naming it run there
        params["additional_parameters"]["reservation"] = str(slurm_word(request.reservation))
    # a daemon killed between sbatch and submitit's pickle rename must not leave a job that
    # fails at start: the job writes the (known) call itself (coral_hpc.launch.pickle_guard)
    # umask first: what the job writes under the state folder is the service account's alone
    params["setup"] = ["umask 077", " ".join(shell_word(word) for word in (
        spec.python, "-m", "coral_hpc.launch.pickle_guard", str(spec.logs_dir),
        str(spec.spec_file))) + " || exit 1"]  # an unsafe pickle folder ends the job
    if spec.account:
        params["account"] = str(slurm_word(spec.account))
    if spec.qos:
        params["qos"] = str(slurm_word(spec.qos))
    return params


def submit_with_submitit(spec: ReplicaSpec, spec_file: Path) -> str:
    """Submit a single-node or homogeneous replica through submitit; return the job id."""
    private_dir(spec.logs_dir)
    executor = submitit.SlurmExecutor(folder=spec.logs_dir, python=spec.python)
    executor.update_parameters(**submitit_parameters(spec))
    try:
        job = executor.submit(run_replica, str(spec_file))
    except submitit.core.utils.FailedJobError as exc:
        # the one table of Slurm's messages decides transient (retry) or permanent (surface)
        raise classify(_SUBMIT_ARGV, 1, str(exc)) from exc
    return str(job.job_id)


def check_renderable(spec: ReplicaSpec) -> None:
    """Render every engine script the job will run (with placeholder ports), so a value that
    cannot be written safely raises :class:`~coral_hpc.launch.quoting.UnsafeValue` (a
    PermanentError) before anything is submitted. submitit writes the state path (its log folder)
    and python onto its own script lines too."""
    shell_word(spec.state_path)
    shell_word(spec.python)
    for rank in range(spec.pp):
        render_engine_script(spec, rank=rank, port=1 if rank == 0 else None,
                             master_addr="head", master_port=2)


def write_hetjob(spec: ReplicaSpec, spec_file: Path) -> Path:
    """Render the hetjob batch script into the replica folder and return its path."""
    script = spec.replica_dir / "hetjob.sbatch"
    write_atomic(script, render_hetjob(spec, spec_file))
    return script


def submit_replica(spec: ReplicaSpec, client: ScriptSubmitter) -> str:
    """Submit ``spec`` as one Slurm job and return its job id.

    ``client`` is a ``coral_hpc.slurm`` client; it submits heterogeneous replicas' batch scripts.
    Raises a ``coral_hpc.slurm.errors`` error: ``SlurmUnavailable`` (a TransientError: retry
    later) or ``SlurmRejected``/``SlurmCommandError`` (PermanentErrors: surface them).
    """
    check_renderable(spec)  # refuse an unsafe value here, not as a job that fails at start
    spec_file = spec.write()
    # Slurm cannot start a job whose --output folder is missing (JobLaunchFailure)
    private_dir(spec.logs_dir)
    with secrets_withheld():
        if spec.layout.kind == "hetero":
            return str(client.submit_script(write_hetjob(spec, spec_file)))
        return submit_with_submitit(spec, spec_file)
