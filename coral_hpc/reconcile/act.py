"""The act step: apply a :class:`~coral_hpc.reconcile.decide.Decision` through Slurm and the store.

Order of writes makes every step safe to kill:

- **Submit**: the replica row is written first (SUBMITTING), then the job is submitted with the
  row's id in its tag, then the job id is recorded. Killed in between, the next observe step finds
  the tagged job and adopts it, or (no job after ``submit_lost_s``) the row is forgotten — never a
  duplicate. A transient error (timeout: the job may exist) leaves the row for adoption; a
  permanent one (partition drained, bad GRES) ends the row and keeps that shape out of plans for a
  while, with an event saying why.
- **Drain**: recorded; the next routing table leaves the replica out.
- **Cancel**: the first cancel sends SIGTERM to the job's steps (the engine drains and exits), a
  repeated one cancels for good; a pending job is cancelled at once. Non-blocking: the decide
  step re-sends a cancel
  Slurm has not carried out.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from coral_hpc.config import Deployment
from coral_hpc.errors import CoralError, PermanentError, TransientError
from coral_hpc.launch.spec import replica_spec
from coral_hpc.launch.stop import DRAIN_SIGNAL
from coral_hpc.launch.submit import submit_replica
from coral_hpc.plan.desired import Slot
from coral_hpc.reconcile.backoff import Backoff
from coral_hpc.reconcile.decide import (
    Cancel,
    Decision,
    Drain,
    Exclude,
    Forget,
    Submit,
)
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.slurm.job_shape import ReplicaShape
from coral_hpc.store import Exclusion, ReplicaRecord, Store
from coral_hpc.types import ExclusionKind, ShapeExclusion

log = logging.getLogger("coral_hpc.reconcile")


def new_replica_id() -> str:
    """A short random id, safe in job names, file names and URLs."""
    return f"r{secrets.token_hex(4)}"


@dataclass
class ActResult:
    """What one act step did."""

    submitted: list[str] = field(default_factory=list)  # replica ids
    drained: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    transient: bool = False  # a Slurm call failed transiently: back off


class Actor:
    """Applies decisions. ``submit`` defaults to :func:`coral_hpc.launch.submit.submit_replica`."""

    def __init__(
        self,
        deployment: Deployment,
        store: Store,
        client,  # coral_hpc.slurm.client.SlurmClient
        settings: ReconcileSettings,
        clock: Callable[[], float],
        api_key_file: Path | None,
        submit: Callable = submit_replica,
        backoff: Backoff | None = None,
        instance: str = "",
    ):
        self.deployment = deployment
        self.store = store
        self.client = client
        self.settings = settings
        self.clock = clock
        self.api_key_file = api_key_file
        self.submit = submit
        self.instance = instance  # written into every job's tag (coral_hpc.instance)
        self.backoff = backoff or Backoff(base_s=settings.poll_interval_s, max_s=120.0)

    def apply(self, decision: Decision) -> ActResult:
        """Apply every action of ``decision``; Slurm calls are skipped while backing off."""
        result = ActResult()
        for action in decision.actions:
            now = self.clock()
            if isinstance(action, Exclude):
                self._exclude(action, now, result)
            elif isinstance(action, Drain):
                self._drain(action, now, result)
            elif isinstance(action, Forget):
                self.store.update_replica(action.replica_id, ended_at=now, end_state="LOST",
                                          cancelled_at=now)
                self.store.add_event(now, "forget", action.reason, replica_id=action.replica_id)
            elif isinstance(action, (Cancel, Submit)):
                if not self.backoff.ready(now):
                    continue
                try:
                    if isinstance(action, Cancel):
                        self._cancel(action, now, result)
                    else:
                        self._submit(action, now, result)
                except TransientError as exc:
                    delay = self.backoff.failed(now)
                    result.transient = True
                    result.errors.append(f"{exc} (retrying in {delay:.0f}s)")
                    self.store.add_event(now, "slurm_error", f"{exc}; backing off {delay:.0f}s")
                else:
                    self.backoff.succeeded()
        return result

    # ------------------------------------------------------------------ actions

    def _exclude(self, action: Exclude, now: float, result: ActResult) -> None:
        self.store.set_exclusion(Exclusion(action.target, action.kind, now, action.until,
                                           action.reason))
        self.store.add_event(now, action.kind.value, action.reason, model=action.model)
        result.excluded.append(action.target.key)

    def _drain(self, action: Drain, now: float, result: ActResult) -> None:
        record = self.store.update_replica(action.replica_id, drain_requested_at=now)
        self.store.add_event(now, "drain", action.reason, model=record.model,
                             replica_id=record.id)
        result.drained.append(record.id)

    def _cancel(self, action: Cancel, now: float, result: ActResult) -> None:
        record = self.store.replica(action.replica_id)
        if record is None or record.job_id is None:
            return
        first = record.cancelled_at is None
        if first and record.started_at is not None:
            # grace: the drain signal to the job steps only (a signalled batch shell makes srun
            # SIGKILL its tasks; SIGTERM would reach vLLM's workers too, see
            # coral_hpc.launch.stop); the entrypoint drains the engine and exits
            self.client.cancel([record.job_id], signal=DRAIN_SIGNAL, full=False)
        else:
            self.client.cancel([record.job_id])
        changes: dict = {"cancelled_at": now}
        if record.drain_requested_at is None:
            changes["drain_requested_at"] = now
        self.store.update_replica(record.id, **changes)
        what = f"SIG{DRAIN_SIGNAL} sent" if first and record.started_at is not None else "cancelled"
        self.store.add_event(now, "cancel", f"job {record.job_id}: {what} ({action.reason})",
                             model=record.model, replica_id=record.id)
        result.cancelled.append(record.id)

    def _submit(self, action: Submit, now: float, result: ActResult) -> None:
        slot = action.slot
        replica_id = new_replica_id()
        try:
            spec = replica_spec(self.deployment, slot.model, replica_id, slot.template_id,
                                slot.layout, api_key_file=self.api_key_file,
                                instance=self.instance, time_limit_s=slot.time_limit_s,
                                shape=_shape(slot))
        except (CoralError, KeyError) as exc:
            self._refuse(action, f"cannot build a job for {slot.template_id}: {exc}", now, result)
            return
        self.store.add_replica(ReplicaRecord(
            id=replica_id, model=slot.model, template_id=slot.template_id, layout=slot.layout,
            partitions=slot.partitions, throughput=slot.throughput,
            cost_per_hour=slot.cost_per_hour, created_at=now, replaces=action.replaces,
            reason=action.reason, time_limit_s=float(spec.time_limit_s),
        ))
        try:
            job_id = self.submit(spec, self.client)
        except PermanentError as exc:
            self.store.update_replica(replica_id, ended_at=self.clock(), end_state="SUBMIT_FAILED",
                                      cancelled_at=self.clock())
            self._refuse(action, f"Slurm refused {slot.template_id} on "
                         f"{','.join(slot.partitions)}: {exc}", now, result)
            return
        # a TransientError propagates: the row stays SUBMITTING for adoption or forgetting
        submitted = self.clock()
        self.store.update_replica(replica_id, job_id=str(job_id), submitted_at=submitted)
        self.store.add_event(
            submitted, "submit",
            f"job {job_id}: {slot.template_id} on {','.join(slot.partitions)} ({action.reason})",
            model=slot.model, replica_id=replica_id,
        )
        result.submitted.append(replica_id)

    def _refuse(self, action: Submit, message: str, now: float, result: ActResult) -> None:
        """A submission that cannot succeed as planned: keep its shape out of plans a while."""
        target = ShapeExclusion(action.slot.template_id, action.slot.partitions)
        until = now + self.settings.pending_exclusion_s
        kind = ExclusionKind.SUBMIT_REFUSED
        self.store.set_exclusion(Exclusion(target, kind, now, until, message))
        self.store.add_event(now, kind.value, message, model=action.slot.model)
        result.errors.append(message)
        result.excluded.append(target.key)
        log.warning("%s", message)


def _shape(slot: Slot) -> ReplicaShape | None:
    """The per-GPU CPUs and memory the plan packed ``slot`` with; None for a plan stored before
    slots recorded them (the job then asks models.yaml's)."""
    if slot.cpus_per_gpu is None or slot.mem_per_gpu_gb is None:
        return None
    return ReplicaShape(slot.cpus_per_gpu, slot.mem_per_gpu_gb)
