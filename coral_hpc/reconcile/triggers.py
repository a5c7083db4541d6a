"""When to re-plan: edge triggers computed from facts and the time of the last plan.

Each trigger fires once, for something that happened *after* the plan was made — a condition that
persists (a replica near walltime, a drained node) does not re-plan every cycle. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, replica_status, successor_due
from coral_hpc.records import Exclusion


class TriggerKind(str, enum.Enum):
    """What made the plan out of date (the daemon's ``plans`` metric label)."""

    START = "start"  #: no plan yet, or the cluster at the last plan is unknown (a restart)
    INTERVAL = "interval"  #: the re-plan interval elapsed
    DEMAND = "demand"  #: a model's demand moved past the threshold
    CLUSTER = "cluster"  #: a node or partition went away or came back
    REPLICA_FAILED = "replica_failed"  #: a replica ended without being asked to
    PENDING_TIMEOUT = "pending_timeout"  #: a replica sat pending past the timeout
    WALLTIME = "walltime"  #: a replica nears its time limit
    UNHEALTHY = "unhealthy"  #: a READY replica stopped answering
    EXCLUSION = "exclusion"  #: a template or shape was excluded since the plan
    IDLE = "idle"  #: a model scaled to zero went cold (coral_hpc.reconcile.idle)
    WAKE = "wake"  #: a request for a cold model: plan for it now, not at the next interval


@dataclass(frozen=True)
class Trigger:
    """One reason to re-plan: its kind and a sentence for people."""

    kind: TriggerKind
    reason: str


def replan_triggers(
    plan_time: float | None,
    now: float,
    settings: ReconcileSettings,
    replicas: Sequence[ReplicaFacts] = (),
    demand_changed: Iterable[str] = (),
    unavailable: frozenset[str] = frozenset(),
    unavailable_at_plan: frozenset[str] | None = None,
    exclusions: Iterable[Exclusion] = (),
) -> list[Trigger]:
    """Why the plan made at ``plan_time`` is out of date at ``now`` (empty: it is not).

    ``unavailable`` names the nodes and partitions draining or down now (``node:x``,
    ``partition:y``); ``unavailable_at_plan`` the same when the plan was made (None: unknown,
    e.g. after a restart, which re-plans anyway).
    """
    if plan_time is None:
        return [Trigger(TriggerKind.START, "no plan yet")]
    triggers = []
    if now - plan_time >= settings.replan_interval_s:
        triggers.append(Trigger(TriggerKind.INTERVAL,
                                f"re-plan interval ({settings.replan_interval_s:g}s) elapsed"))
    changed = sorted(demand_changed)
    if changed:
        triggers.append(Trigger(TriggerKind.DEMAND,
                                f"demand of {', '.join(changed)} moved more than "
                                f"{settings.demand_change_threshold:.0%}"))
    if unavailable_at_plan is None:
        triggers.append(Trigger(TriggerKind.START, "cluster state at the last plan unknown"))
    else:
        went = sorted(unavailable - unavailable_at_plan)
        came = sorted(unavailable_at_plan - unavailable)
        if went:
            triggers.append(Trigger(TriggerKind.CLUSTER, f"draining or down: {', '.join(went)}"))
        if came:
            triggers.append(Trigger(TriggerKind.CLUSTER, f"back in service: {', '.join(came)}"))
    for facts in replicas:
        trigger = _replica_trigger(facts, plan_time, now, settings)
        if trigger:
            triggers.append(trigger)
    for exclusion in exclusions:
        if exclusion.since > plan_time and exclusion.until > now:
            triggers.append(Trigger(TriggerKind.EXCLUSION,
                                    f"excluded {exclusion.key}: {exclusion.reason}"))
    return list(dict.fromkeys(triggers))


def _replica_trigger(
    facts: ReplicaFacts, plan_time: float, now: float, settings: ReconcileSettings
) -> Trigger | None:
    record = facts.record
    status = replica_status(facts, now, settings)
    if status.state is ReplicaState.FAILED:
        ended = record.ended_at if record.ended_at is not None else now
        if ended > plan_time:
            what = (record.end_state or record.slurm_state or "ended").upper()
            return Trigger(TriggerKind.REPLICA_FAILED,
                           f"replica {record.id} of {record.model} ended unexpectedly ({what})")
        return None
    if status.state is ReplicaState.PENDING and record.submitted_at is not None:
        deadline = record.submitted_at + settings.pending_timeout_s + facts.unanswered_s
        if plan_time < deadline <= now:
            return Trigger(TriggerKind.PENDING_TIMEOUT, f"replica {record.id} of {record.model} "
                           f"pending past {settings.pending_timeout_s:g}s")
    moment = successor_due(record, settings)
    if status.near_walltime and moment is not None and plan_time < moment <= now:
        return Trigger(TriggerKind.WALLTIME, f"replica {record.id} of {record.model} near walltime")
    if status.unhealthy_too_long:
        last_ok = record.health_ok_at if record.health_ok_at is not None else record.ready_at
        if last_ok is not None and plan_time < last_ok + settings.unhealthy_grace_s <= now:
            return Trigger(TriggerKind.UNHEALTHY,
                           f"replica {record.id} of {record.model} unhealthy")
    return None
