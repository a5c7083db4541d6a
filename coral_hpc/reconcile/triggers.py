"""When to re-plan: edge triggers computed from facts and the time of the last plan.

Each trigger fires once, for something that happened *after* the plan was made — a condition that
persists (a replica near walltime, a drained node) does not re-plan every cycle. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, replica_status, successor_due
from coral_hpc.store import Exclusion


def replan_reasons(
    plan_time: float | None,
    now: float,
    settings: ReconcileSettings,
    replicas: Sequence[ReplicaFacts] = (),
    demand_changed: Iterable[str] = (),
    unavailable: frozenset[str] = frozenset(),
    unavailable_at_plan: frozenset[str] | None = None,
    exclusions: Iterable[Exclusion] = (),
) -> list[str]:
    """Why the plan made at ``plan_time`` is out of date at ``now`` (empty: it is not).

    ``unavailable`` names the nodes and partitions draining or down now (``node:x``,
    ``partition:y``); ``unavailable_at_plan`` the same when the plan was made (None: unknown,
    e.g. after a restart, which re-plans anyway).
    """
    if plan_time is None:
        return ["no plan yet"]
    reasons = []
    if now - plan_time >= settings.replan_interval_s:
        reasons.append(f"re-plan interval ({settings.replan_interval_s:g}s) elapsed")
    changed = sorted(demand_changed)
    if changed:
        reasons.append(
            f"demand of {', '.join(changed)} moved more than "
            f"{settings.demand_change_threshold:.0%}"
        )
    if unavailable_at_plan is None:
        reasons.append("cluster state at the last plan unknown")
    else:
        went = sorted(unavailable - unavailable_at_plan)
        came = sorted(unavailable_at_plan - unavailable)
        if went:
            reasons.append(f"draining or down: {', '.join(went)}")
        if came:
            reasons.append(f"back in service: {', '.join(came)}")
    for facts in replicas:
        reason = _replica_trigger(facts, plan_time, now, settings)
        if reason:
            reasons.append(reason)
    for exclusion in exclusions:
        if exclusion.since > plan_time and exclusion.until > now:
            reasons.append(f"excluded {exclusion.key}: {exclusion.reason}")
    return list(dict.fromkeys(reasons))


def _replica_trigger(
    facts: ReplicaFacts, plan_time: float, now: float, settings: ReconcileSettings
) -> str | None:
    record = facts.record
    status = replica_status(facts, now, settings)
    if status.state is ReplicaState.FAILED:
        ended = record.ended_at if record.ended_at is not None else now
        if ended > plan_time:
            what = (record.end_state or record.slurm_state or "ended").upper()
            return f"replica {record.id} of {record.model} ended unexpectedly ({what})"
        return None
    if status.state is ReplicaState.PENDING and record.submitted_at is not None:
        deadline = record.submitted_at + settings.pending_timeout_s
        if plan_time < deadline <= now:
            return f"replica {record.id} of {record.model} pending past {settings.pending_timeout_s:g}s"
    moment = successor_due(record, settings)
    if status.near_walltime and moment is not None and plan_time < moment <= now:
        return f"replica {record.id} of {record.model} near walltime"
    if status.unhealthy_too_long:
        last_ok = record.health_ok_at if record.health_ok_at is not None else record.ready_at
        if last_ok is not None and plan_time < last_ok + settings.unhealthy_grace_s <= now:
            return f"replica {record.id} of {record.model} unhealthy"
    return None
