"""Stop replica jobs the way they are built: SIGTERM to the job *steps* only, then scancel.

Every replica runs its entrypoint under ``srun`` (submitit's step, or the hetjob's
``srun --het-group``). Slurm's ``scancel --signal=TERM --full`` also signals the batch shell and
its children, ``srun`` included — and srun answers SIGTERM by sending SIGKILL to its tasks
("forcing job termination"), so the engine never drains. Signalling the steps alone
(``full=False``) reaches the entrypoints, which drain the engine and exit; the batch script then
ends by itself. Whatever still runs after ``grace_s`` is cancelled for good.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from coral_hpc.slurm.snapshot import JobStatus


class StopClient(Protocol):
    """The part of ``coral_hpc.slurm.SlurmClient`` stopping needs."""

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobStatus]: ...

    def cancel(
        self, job_ids: Iterable[str], signal: str | None = None, *, full: bool = True
    ) -> None: ...


def stop_replicas(
    client: StopClient,
    job_ids: Iterable[str],
    grace_s: float,
    *,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, str]:
    """Drain then cancel replica jobs. Pending jobs are cancelled at once; running ones get
    SIGTERM on their steps and ``grace_s`` seconds to end. Returns job id → ``"exited"`` (ended
    within the grace) or ``"cancelled"``. A job whose state is unknown (sacct lagging) is treated
    as still running: never reported gone on partial data."""
    ids = [str(j) for j in job_ids]
    if not ids:
        return {}
    states = client.job_states(ids)
    pending = [i for i in ids if states[i].state == "PENDING"]
    running = [i for i in ids if i not in pending and not states[i].finished]
    outcome = {i: "exited" for i in ids if i not in pending and i not in running}
    if pending:
        client.cancel(pending)
        outcome.update({i: "cancelled" for i in pending})
    if running:
        client.cancel(running, signal="TERM", full=False)  # steps only: see the module docstring
        deadline = clock() + grace_s
        alive = running
        while alive and clock() < deadline:
            sleep(min(poll_s, max(0.0, deadline - clock())))
            now = client.job_states(alive)
            alive = [i for i in alive if not now[i].finished]
        outcome.update({i: "exited" for i in running if i not in alive})
        if alive:
            client.cancel(alive)
            outcome.update({i: "cancelled" for i in alive})
    return {i: outcome[i] for i in ids}
