"""Stop replica jobs the way they are built: a drain signal to the job *steps* only, then scancel.

Every replica runs its entrypoint under ``srun`` (submitit's step, or the hetjob's
``srun --het-group``). Slurm's ``scancel --signal=TERM --full`` also signals the batch shell and
its children, ``srun`` included — and srun answers SIGTERM by sending SIGKILL to its tasks
("forcing job termination"), so the engine never drains. Signalling the steps alone
(``full=False``) reaches the entrypoints, which drain the engine and exit; the batch script then
ends by itself. Whatever still runs after ``grace_s`` is cancelled for good.

The drain signal is SIGUSR2, not SIGTERM. Slurm delivers a step's signal to *every* process of
the step, and real vLLM is a process tree (API server, engine core, one worker per rank, a
headless worker tree on each further node): its workers exit on SIGTERM at once, so the requests
in flight are lost and a pipeline's head waits on a dead stage. Every engine launch script
ignores SIGUSR2 (``trap '' USR2``, inherited through exec and by the engine's children); the
entrypoints turn it into one SIGTERM to the head's API server, which drains its own tree
(``--shutdown-timeout``), while worker nodes wait for the head to finish. Slurm's walltime warning
is the same signal, so both paths are one. A person's ``scancel --signal=TERM`` still stops a
replica, without that drain.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

#: what asks a replica to drain (see the module docstring)
DRAIN_SIGNAL = "USR2"


class StopClient(Protocol):
    """The part of ``coral_hpc.slurm.SlurmClient`` stopping needs."""

    def cancel_with_grace(
        self, job_ids: Iterable[str], grace_s: float, signal: str = "TERM", poll_s: float = 1.0,
        *, full: bool = True,
    ) -> dict[str, str]: ...


def stop_replicas(
    client: StopClient, job_ids: Iterable[str], grace_s: float, *, poll_s: float = 1.0
) -> dict[str, str]:
    """Drain then cancel replica jobs through the Slurm layer's ``cancel_with_grace``, signalling
    the job steps only (see the module docstring). Pending jobs are cancelled at once; running
    ones get :data:`DRAIN_SIGNAL` and ``grace_s`` seconds to end. Returns job id → ``"exited"`` or
    ``"cancelled"``; a job whose state is unknown (sacct lagging) counts as still running."""
    return client.cancel_with_grace(job_ids, grace_s, DRAIN_SIGNAL, poll_s, full=False)
