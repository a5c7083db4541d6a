"""A replica's status, derived by ONE function from stored facts — never stored itself.

Facts are what was observed and when (``coral_hpc.store.ReplicaRecord``: Slurm state, endpoint
file found, health probes, drain and cancel requested, end) plus two facts of the cluster at the
time of asking: whether a node or partition the job uses is draining or down. From these
:func:`replica_status` returns the state the rest of the daemon acts on, and the conditions that
make a replica need a successor (walltime near, node going away, unhealthy too long, pending too
long). Keeping this in one place means ``status``, the routing table and the decide step can never
disagree about what a replica is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.records import ReplicaRecord

#: Slurm job states in which the job waits for resources (nothing of it runs yet).
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
#: Slurm job states in which the job holds its nodes.
RUNNING_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
     "RESIZING"}
)
#: Slurm job states after which the job is gone.
TERMINAL_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
     "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT", "LOST", "SUBMIT_FAILED"}
)
#: Endings that are the template's own fault (the engine exited with an error, ran out of
#: memory). Node failures, preemption, timeouts and someone's scancel are not crashes.
CRASH_STATES = frozenset({"FAILED", "OUT_OF_MEMORY"})


class ReplicaState(str, enum.Enum):
    """What a replica is doing now."""

    SUBMITTING = "SUBMITTING"  # recorded, no Slurm job id yet
    PENDING = "PENDING"  # queued in Slurm
    STARTING = "STARTING"  # job running, engine not yet answering /health
    READY = "READY"  # endpoint written and healthy: routed to
    UNHEALTHY = "UNHEALTHY"  # was READY, now failing health probes: not routed to
    DRAINING = "DRAINING"  # taken out of routing, to be (or being) cancelled
    ENDED = "ENDED"  # ended after we asked it to
    FAILED = "FAILED"  # ended without being asked: crash, node failure, preemption, timeout

    @property
    def live(self) -> bool:
        """Not yet ended."""
        return self not in (ReplicaState.ENDED, ReplicaState.FAILED)


@dataclass(frozen=True)
class ReplicaFacts:
    """A stored replica record plus what the current cluster snapshot says about its place."""

    record: ReplicaRecord
    #: a node of the job, or its partition, is draining, drained or down
    node_unavailable: bool = False
    #: seconds since it was submitted during which Slurm did not answer: not queue wait
    unanswered_s: float = 0.0


@dataclass(frozen=True)
class ReplicaStatus:
    """The derived state of a replica and the conditions that matter for deciding."""

    replica_id: str
    state: ReplicaState
    #: seconds until Slurm's time limit ends the job; None before it starts or without a limit
    time_left_s: float | None = None
    #: seconds in the queue (SUBMITTING, or PENDING while Slurm answered)
    pending_for_s: float | None = None
    #: its successor should be started now: within the lead of Slurm's walltime warning
    near_walltime: bool = False
    #: a node or partition under it is draining or down: move it
    must_move: bool = False
    #: PENDING past ``pending_timeout_s``
    pending_too_long: bool = False
    #: UNHEALTHY past ``unhealthy_grace_s``
    unhealthy_too_long: bool = False
    #: SUBMITTING past ``submit_lost_s``: the submission never reached Slurm
    submit_lost: bool = False
    #: FAILED by the template's own fault
    crashed: bool = False

    @property
    def needs_successor(self) -> bool:
        """A live replica that will stop serving soon and should be replaced (make-before-break)."""
        return self.state.live and (
            self.near_walltime or self.must_move or self.unhealthy_too_long
        )


def usable_until(record: ReplicaRecord, settings: ReconcileSettings) -> float | None:
    """When the replica stops serving by itself: Slurm's USR2 warning before its time limit
    (the job drains then). None before it starts or without a limit."""
    if record.started_at is None or record.time_limit_s is None:
        return None
    signal = min(settings.walltime_signal_s, 0.5 * record.time_limit_s)
    return record.started_at + record.time_limit_s - signal


def walltime_lead(record: ReplicaRecord, settings: ReconcileSettings) -> float:
    """Seconds before :func:`usable_until` to start a successor: the configured lead or the
    learnt start-up time, whichever is longer, at most half the usable time (a short limit
    would otherwise rotate a replica the moment it starts)."""
    lead = max(settings.walltime_lead_s, settings.startup_s)
    if record.time_limit_s is None:
        return lead
    usable = record.time_limit_s - min(settings.walltime_signal_s, 0.5 * record.time_limit_s)
    return min(lead, 0.5 * usable)


def successor_due(record: ReplicaRecord, settings: ReconcileSettings) -> float | None:
    """When a successor should be started; None when the replica has no time limit or has
    not started."""
    until = usable_until(record, settings)
    return None if until is None else until - walltime_lead(record, settings)


def replica_status(
    facts: ReplicaFacts, now: float, settings: ReconcileSettings | None = None
) -> ReplicaStatus:
    """Derive a replica's state and conditions from its facts at time ``now``."""
    settings = settings or ReconcileSettings()
    r = facts.record
    slurm = (r.slurm_state or "").upper()
    asked_to_stop = r.drain_requested_at is not None or r.cancelled_at is not None

    if r.ended_at is not None or slurm in TERMINAL_STATES:
        end_state = (r.end_state or slurm or "").upper()
        if asked_to_stop:
            return ReplicaStatus(r.id, ReplicaState.ENDED)
        return ReplicaStatus(r.id, ReplicaState.FAILED, crashed=end_state in CRASH_STATES)

    time_left = None
    if r.started_at is not None and r.time_limit_s is not None:
        time_left = r.started_at + r.time_limit_s - now
    due = successor_due(r, settings)
    near_walltime = due is not None and now >= due
    must_move = facts.node_unavailable and r.started_at is not None

    if asked_to_stop:
        return ReplicaStatus(r.id, ReplicaState.DRAINING, time_left_s=time_left)

    if r.job_id is None:
        waited = now - (r.submitted_at if r.submitted_at is not None else r.created_at)
        return ReplicaStatus(
            r.id, ReplicaState.SUBMITTING, pending_for_s=waited,
            submit_lost=waited > settings.submit_lost_s,
        )

    running = slurm in RUNNING_STATES or (slurm not in PENDING_STATES and r.started_at is not None)
    if not running:
        # PENDING, or submitted and not yet seen by the queue; a Slurm outage pauses the wait
        since = r.submitted_at if r.submitted_at is not None else r.created_at
        waited = max(0.0, now - since - facts.unanswered_s)
        return ReplicaStatus(
            r.id, ReplicaState.PENDING, pending_for_s=waited,
            pending_too_long=waited > settings.pending_timeout_s,
        )

    if r.ready_at is None:
        return ReplicaStatus(r.id, ReplicaState.STARTING, time_left_s=time_left,
                             near_walltime=near_walltime, must_move=must_move)
    if r.health_failures >= settings.unhealthy_after or slurm in ("SUSPENDED", "STOPPED"):
        last_ok = r.health_ok_at if r.health_ok_at is not None else r.ready_at
        return ReplicaStatus(
            r.id, ReplicaState.UNHEALTHY,
            unhealthy_too_long=now - last_ok > settings.unhealthy_grace_s,
            time_left_s=time_left, near_walltime=near_walltime, must_move=must_move,
        )
    return ReplicaStatus(r.id, ReplicaState.READY, time_left_s=time_left,
                         near_walltime=near_walltime, must_move=must_move)
