"""Knobs of the reconcile loop: every field has a default and a line saying why.

Most come from ``policy:`` in ``models.yaml`` (:meth:`ReconcileSettings.from_policy`): their
defaults are :class:`~coral_hpc.config.PolicyConfig`'s, the one place those are set and
explained, and the knobs derived from them follow the rules below. So ``ReconcileSettings()``
is exactly what a ``models.yaml`` without ``policy:`` gets. The rest are safety margins of the
loop itself, a site rarely needs to change, set and explained here.
"""

from __future__ import annotations

from dataclasses import dataclass

from coral_hpc.config import PolicyConfig
from coral_hpc.types import SIGNAL_LEAD_S, SIGNAL_RESOLUTION_S

#: ``policy:`` as a models.yaml without one gets it: the defaults of the policy-sourced knobs
_POLICY = PolicyConfig()


def pending_exclusion_for(policy: PolicyConfig) -> float:
    """How long a shape that timed out pending stays out of plans: long enough that the next
    plans route around it, short enough that a queue that has cleared is used again."""
    return max(3 * policy.pending_timeout_s, 2 * policy.replan_interval_s)


def unhealthy_grace_for(policy: PolicyConfig) -> float:
    """A replica needs a few polls to recover from a blip before it is replaced."""
    return max(6 * policy.poll_interval_s, 30.0)


def drain_grace_for(policy: PolicyConfig) -> float:
    """Two polls: the gateway reloads the routing table and in-flight requests finish."""
    return max(2 * policy.poll_interval_s, 5.0)


@dataclass(frozen=True)
class ReconcileSettings:
    """How the decide step judges replicas. Seconds unless named otherwise."""

    #: Observe Slurm this often; staleness is counted in polls.
    poll_interval_s: float = _POLICY.poll_interval_s
    #: Re-plan at least this often even when nothing moved (prices, free GPUs drift).
    replan_interval_s: float = _POLICY.replan_interval_s
    #: Re-plan early when a model's demand moves by more than this fraction.
    demand_change_threshold: float = _POLICY.demand_change_threshold
    #: A replica PENDING longer than this is cancelled and its shape avoided for a while.
    pending_timeout_s: float = _POLICY.pending_timeout_s
    #: How long a shape that timed out pending stays out of plans.
    pending_exclusion_s: float = pending_exclusion_for(_POLICY)
    #: The plan's horizon: a pending replica Slurm expects to start within it keeps its place
    #: in the queue however long it has waited (on a busy cluster waiting is the norm).
    max_queue_wait_s: float = _POLICY.max_queue_wait_s
    #: Start a successor this long before a replica must stop (at most half its usable time).
    walltime_lead_s: float = _POLICY.walltime_lead_s
    #: Submit→READY seconds learnt from this deployment's replicas, the slowest recent one
    #: (``reconcile.startup.lead_startup_s``; the daemon sets it each cycle): a successor starts
    #: at least this long ahead too, since a lead shorter than the engine's start-up leaves
    #: the model a gap (seen on the real engine).
    startup_s: float = 0.0
    #: Slurm warns a replica up to this long before its time limit (``--signal=USR2@N``, and
    #: up to a minute earlier still: SIGNAL_RESOLUTION_S) and the replica then drains: its
    #: usable life ends here, not at the limit itself.
    walltime_signal_s: float = float(SIGNAL_LEAD_S + SIGNAL_RESOLUTION_S)
    #: Crashes of one template within ``crash_cooldown_s`` that put it on cool-down.
    crash_limit: int = _POLICY.crash_limit
    #: How long a crashing template stays out of plans.
    crash_cooldown_s: float = _POLICY.crash_cooldown_s
    #: A template whose replica failed before READY is excluded this long, doubling with each
    #: further failed start in a row, at most ``crash_cooldown_s``.
    start_backoff_s: float = _POLICY.start_backoff_s
    #: Consecutive failed health probes before a READY replica stops counting as serving.
    unhealthy_after: int = 3
    #: An unhealthy replica that has not recovered after this is cancelled and replaced.
    unhealthy_grace_s: float = unhealthy_grace_for(_POLICY)
    #: Between taking a replica out of the routing table and cancelling it: the gateway reloads
    #: the table and in-flight requests finish (the engine also drains on SIGTERM).
    drain_grace_s: float = drain_grace_for(_POLICY)
    #: A cancel Slurm has not carried out after this is sent again.
    cancel_retry_s: float = 120.0
    #: A replica recorded as being submitted whose tagged job never showed up in the queue after
    #: this (the daemon died between recording and sbatch) is forgotten.
    submit_lost_s: float = 30.0
    #: Observations older than this many polls are stale: nothing destructive is done on them.
    stale_after_polls: int = 3
    #: Hysteresis (coral_hpc.reconcile.hysteresis): a READY replica whose slot the plan no
    #: longer names keeps serving in place of the plan's new slot until its slot has been
    #: absent from this many consecutive plans: three plans in a row naming another layout are
    #: a decision, not the alternation every other plan that issue 16 measured after a drain.
    replace_after_plans: int = 3
    #: ... or at once when the plan's slot is cheaper per request/s by at least this fraction:
    #: a saving worth a new replica's start-up (a policy choice, not a measured constant).
    replace_margin: float = 0.10
    #: Slurm calls one cycle may make for submissions and for cancellations (each).
    max_submits_per_cycle: int = 8
    max_cancels_per_cycle: int = 8

    @classmethod
    def from_policy(cls, policy: PolicyConfig) -> ReconcileSettings:
        """Settings from a deployment's ``policy:`` section."""
        return cls(
            poll_interval_s=policy.poll_interval_s,
            replan_interval_s=policy.replan_interval_s,
            demand_change_threshold=policy.demand_change_threshold,
            pending_timeout_s=policy.pending_timeout_s,
            pending_exclusion_s=pending_exclusion_for(policy),
            max_queue_wait_s=policy.max_queue_wait_s,
            walltime_lead_s=policy.walltime_lead_s,
            crash_limit=policy.crash_limit,
            crash_cooldown_s=policy.crash_cooldown_s,
            start_backoff_s=policy.start_backoff_s,
            unhealthy_grace_s=unhealthy_grace_for(policy),
            drain_grace_s=drain_grace_for(policy),
        )

    @property
    def stale_after_s(self) -> float:
        """Age at which an observation is stale."""
        return self.stale_after_polls * self.poll_interval_s
