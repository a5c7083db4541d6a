"""A fake Slurm implementing :class:`coral_hpc.slurm.client.SlurmClient` for unit tests.

The cluster it shows is recorded, not invented: nodes, partitions and limits come from a real
snapshot (``tests/data/plan/devcluster-snapshot.json``, written by ``coral-hpc cluster --json``
on the local cluster, or Slurm 22.05 command output in ``tests/data/slurm`` parsed by the real CLI
backend). On top of it the fake keeps a queue of jobs that :meth:`FakeSlurm.submit_spec` adds
(a tagged PENDING job, as sbatch would queue it), that tests move along (:meth:`start`,
:meth:`end`) and that :meth:`cancel` ends. Any method can be made to fail the next time it is
called (:meth:`fail_next`) with the error the real backends raise, so partial failures of
observe, submit and cancel are reproducible.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from coral_hpc.launch.spec import ReplicaSpec
from coral_hpc.slurm.snapshot import (
    AccountingRecord,
    ClusterSnapshot,
    JobInfo,
    JobShape,
    JobStatus,
    Limits,
    StartEstimate,
)

DATA = Path(__file__).resolve().parents[1] / "data"
DEVCLUSTER_SNAPSHOT = DATA / "plan" / "devcluster-snapshot.json"


def recorded_snapshot(path: Path = DEVCLUSTER_SNAPSHOT) -> ClusterSnapshot:
    """The local cluster as ``coral-hpc cluster --json`` recorded it."""
    return ClusterSnapshot.from_json(path.read_text())


class FakeSlurm:
    """A Slurm whose nodes and partitions are a recorded snapshot and whose queue is in memory."""

    backend = "fake"

    def __init__(self, base: ClusterSnapshot, clock: Callable[[], float]):
        self.base = replace(base, jobs=())
        self.clock = clock
        self.queue: dict[str, JobInfo] = {}  # job id -> job Slurm still holds
        self.finished: dict[str, str] = {}  # job id -> end state, as sacct reports it
        self.submitted: list[ReplicaSpec] = []
        self.cancelled: list[tuple[str, str | None, bool]] = []  # (job id, signal, full)
        self._ids = itertools.count(1 + max((int(j.job_id) for j in base.jobs), default=100))
        self._failures: dict[str, list[Exception]] = {}
        #: how old each snapshot is when it arrives (a slow or cached answer)
        self.lag_s = 0.0
        for job in base.jobs:
            self.queue[job.job_id] = job

    # ------------------------------------------------------------------ test controls

    def fail_next(self, method: str, error: Exception) -> None:
        """Make the next call of ``method`` raise ``error`` (queued: call again for more)."""
        self._failures.setdefault(method, []).append(error)

    def _maybe_fail(self, method: str) -> None:
        queue = self._failures.get(method)
        if queue:
            raise queue.pop(0)

    def start(self, job_id: str, nodes: Sequence[str]) -> None:
        """The scheduler starts a pending job on ``nodes``."""
        job = self.queue[job_id]
        self.queue[job_id] = replace(job, state="RUNNING", reason=None, nodes=tuple(nodes),
                                     num_nodes=len(nodes), start_time=self.clock())

    def end(self, job_id: str, state: str) -> None:
        """The job ends in ``state`` (FAILED, TIMEOUT, ...): squeue forgets it, sacct keeps it."""
        self.queue.pop(job_id)
        self.finished[job_id] = state

    def add_job(self, job: JobInfo) -> None:
        """A job that was already in the queue (submitted by an earlier daemon)."""
        self.queue[job.job_id] = job

    # ------------------------------------------------------------------ SlurmClient

    def version(self) -> str:
        return self.base.slurm_version

    def snapshot(self, deployment: str) -> ClusterSnapshot:
        self._maybe_fail("snapshot")
        own = tuple(j for j in self.queue.values()
                    if j.tag is not None and j.tag.deployment == deployment)
        return replace(self.base, deployment=deployment, observed_at=self.clock() - self.lag_s,
                       jobs=own)

    def jobs(self) -> list[JobInfo]:
        self._maybe_fail("jobs")
        return list(self.queue.values())

    def limits(self) -> Limits | None:  # type: ignore[override]
        return self.base.limits

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        self._maybe_fail("job_states")
        now = self.clock()
        out = {}
        for job_id in job_ids:
            if job_id in self.queue:
                out[job_id] = JobStatus(job_id, self.queue[job_id].state, None, "squeue", now)
            elif job_id in self.finished:
                out[job_id] = JobStatus(job_id, self.finished[job_id], None, "sacct", now)
            else:
                out[job_id] = JobStatus(job_id, None, None, "none", now)
        return out

    def accounting(self, deployment: str, start: float, end: float) -> list[AccountingRecord]:
        return []

    def test_only(self, shape: JobShape) -> StartEstimate:
        raise NotImplementedError("the fake Slurm has no scheduler to ask")

    def submit_script(self, path: str | Path, extra_env: Mapping[str, str] | None = None) -> str:
        raise NotImplementedError("use submit_spec: the fake queues specs, not batch scripts")

    def cancel(self, job_ids: Iterable[str], signal: str | None = None, *,
               full: bool = True) -> None:
        self._maybe_fail("cancel")
        for job_id in job_ids:
            self.cancelled.append((job_id, signal, full))
            if job_id in self.queue and (full or self.queue[job_id].state == "PENDING"):
                self.end(job_id, "CANCELLED")

    def cancel_with_grace(self, job_ids: Iterable[str], grace_s: float, signal: str = "TERM",
                          poll_s: float = 1.0, *, full: bool = True) -> dict[str, str]:
        ids = list(job_ids)
        self.cancel(ids)
        return {job_id: "CANCELLED" for job_id in ids}

    # ------------------------------------------------------------------ launch seam

    def submit_spec(self, spec: ReplicaSpec, client: object = None) -> str:
        """What ``coral_hpc.launch.submit.submit_replica`` does, as the queue and the shared
        filesystem see it: ``spec.json`` written, then a PENDING job tagged with the spec's
        replica, one node (or component) per stage."""
        spec.write()
        self._maybe_fail("submit")
        job_id = str(next(self._ids))
        tag = spec.tag
        self.queue[job_id] = JobInfo(
            job_id=job_id, tag=tag, name=tag.job_name(), state="PENDING", reason="Resources",
            partition=spec.stages[0].partition, nodes=(), num_nodes=spec.pp,
            submit_time=self.clock(), start_time=None, end_time=None,
            time_limit_s=spec.time_limit_s, time_left_s=spec.time_limit_s, expected_start=None,
            restarts=0, gpus=spec.total_gpus, gpu_type=spec.stages[0].gpu_type,
        )
        self.submitted.append(spec)
        return job_id
