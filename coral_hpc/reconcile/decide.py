"""The decide step: plan + replicas + time → the actions that move the cluster towards the plan.

Pure: no Slurm, no database, no clock. The act step applies what this returns.

Rules, in the order they are applied:

1. **Crash cool-down.** A template with ``crash_limit`` crashes within ``crash_cooldown_s`` is
   excluded from plans for ``crash_cooldown_s`` (an :class:`Exclude` with a clear reason); no new
   replica of it is submitted meanwhile. Replicas of it that do serve keep serving. Before that
   (1a, :mod:`coral_hpc.reconcile.start_backoff`), a template whose replica failed before READY
   is excluded at once for ``start_backoff_s``, doubling with each failed start in a row up to
   ``crash_cooldown_s``, its reason the error line of the job's logs.
2. **Stale or partial observations.** When the job observation is stale (older than
   ``stale_after_polls`` polls) or the last Slurm call failed or was partial, nothing is submitted
   and nothing drained or cancelled: a job we cannot see may still be running.
   When only the cluster snapshot is stale, submissions may go on but nothing destructive does.
3. **Pending too long.** A replica pending past ``pending_timeout_s`` — counted only while Slurm
   answered: a controller outage pauses it (``ReplicaFacts.unanswered_s``) — is cancelled (it serves
   nothing) and its shape — template on those partitions — is excluded for
   ``pending_exclusion_s``, so the next plan places that capacity elsewhere. Not while Slurm
   expects to start it within the horizon (``max_queue_wait_s``: it would lose its place in the
   queue for nothing), nor while the plan queues it there (nothing starts within the horizon
   and this is where Slurm starts it first): a queued replica is moved when the plan queues its
   model on another shape, because that one would start sooner.
4. **Match the plan.** For every plan slot (template on partitions, count), keep up to ``count``
   live replicas of that slot that will go on serving — READY first, then STARTING, then
   PENDING — then, for what is still missing, replicas of the same model still pending or
   starting in a slot the plan no longer names (hysteresis: a changed plan never cancels work in
   flight), and submit the rest. Before those, a READY replica whose slot the plan no longer names
   stands in for a missing replica of its model and role while its slot has been absent from
   fewer than ``replace_after_plans`` consecutive plans, the plan's slot is not cheaper per
   request/s by ``replace_margin`` and the replica sustains at least the slot's requests/s
   (:mod:`coral_hpc.reconcile.hysteresis`): a plan that alternates never replaces a READY
   replica. Replicas that need a successor (walltime near, node or
   partition draining or down, unhealthy too long) do not count as matching: their successors are
   submitted now, ahead of time.
5. **Make-before-break.** Every other live replica is surplus. Surplus that serves nothing
   (pending, starting, unhealthy) is cancelled at once — except an unhealthy one still within
   ``unhealthy_grace_s`` while its model has no other READY replica (a late /health on a loaded
   host is not a dead engine), and a starting one whose walltime successor fell due before it
   was READY while its model's READY replicas that go on serving fall short of the plan's
   capacity (it serves before that successor can). A READY surplus replica is drained
   only while the model's READY capacity without it still reaches the plan's capacity for the
   model — so a replacement is READY before the replica it replaces drains — and never when it
   is its (configured) model's last READY replica: a re-plan that drops a model for want of
   GPUs, a drained node or walltime near leaves it serving until a successor is READY, or until
   its job ends when none can start (issue 16: a maintenance drain failed 87 of 87 requests).
6. **Drain, then cancel.** A DRAINING replica is cancelled ``drain_grace_s`` after it left the
   routing table (re-sent after ``cancel_retry_s`` if Slurm has not ended it).
7. **Bounded calls.** At most ``max_submits_per_cycle`` submissions and
   ``max_cancels_per_cycle`` cancellations per cycle; replacements and the oldest slots first.

The rules are one function each, called in this order by :func:`decide`: rules 1–3, 6 and 7
here, rule 4 in :mod:`coral_hpc.reconcile.match`, rule 5 in :mod:`coral_hpc.reconcile.surplus`.
The values read and returned live in :mod:`coral_hpc.reconcile.actions`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace

from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.reconcile.actions import (
    Action,
    Cancel,
    Decision,
    Drain,
    Exclude,
    Forget,
    Keep,
    Observation,
    Submit,
)
from coral_hpc.reconcile.hysteresis import PlanHistory
from coral_hpc.reconcile.match import match_plan
from coral_hpc.reconcile.serving import goes_on_serving
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.start_backoff import start_backoffs
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, ReplicaStatus, replica_status
from coral_hpc.reconcile.surplus import settle_surplus
from coral_hpc.records import Exclusion, ReplicaRecord
from coral_hpc.types import Excluded, ExclusionKind, ShapeExclusion, TemplateExclusion

__all__ = [
    "Action", "Cancel", "Decision", "DesiredPlan", "Drain", "Exclude", "Forget", "Keep",
    "Observation", "Slot", "Submit", "decide", "goes_on_serving",
]


def decide(
    plan: DesiredPlan | None,
    replicas: Sequence[ReplicaFacts],
    now: float,
    settings: ReconcileSettings | None = None,
    exclusions: Sequence[Exclusion] = (),
    observation: Observation | None = None,
    configured: frozenset[str] | None = None,
    history: PlanHistory | None = None,
) -> Decision:
    """Compare ``plan`` with ``replicas`` (live ones, plus recently ended ones for crash counting)
    and return the actions to take at ``now``. See the module docstring for the rules.
    ``configured``: the models of models.yaml (None: every model with replicas); a model no
    longer configured may lose its last READY replica. ``history``: the plans so far, for the
    hysteresis on READY replicas (None: no history, a READY replica follows the plan at once,
    make-before-break)."""
    settings = settings or ReconcileSettings()
    observation = observation or Observation(jobs_at=now, cluster_at=now)
    statuses = replica_statuses(plan, replicas, now, settings)
    excluded: set[Excluded] = {e.target for e in exclusions if e.until > now}
    # 1a. a failed start backs off (exponential, capped), 1. crash cool-down (facts of the
    # store: safe whatever the freshness)
    cooldowns = start_backoffs(replicas, statuses, exclusions, now, settings, excluded)
    excluded.update(e.target for e in cooldowns)
    cooldowns += crash_cooldowns(replicas, statuses, now, settings, excluded)
    excluded.update(e.target for e in cooldowns)
    actions: list[Action] = [*cooldowns]
    replan = [e.reason for e in cooldowns]
    # 2. freshness: nothing at all on stale jobs or before the first plan
    hold = hold_everything(plan, observation, now, settings)
    if hold is not None or plan is None:
        reason, why = hold or _NO_PLAN  # (no plan always holds: the `or` only narrows for mypy)
        return Decision(tuple(actions), (*replan, *why), held_back=reason, statuses=statuses)
    held = hold_destructive(observation, now, settings)
    records = {f.record.id: f.record for f in replicas}
    live = [records[i] for i, s in statuses.items() if s.state.live]
    actions.extend(lost_submissions(live, statuses))
    # 3. pending too long
    pending = pending_too_long(live, statuses, now, settings, excluded)
    actions.extend(pending.excludes)
    excluded.update(e.target for e in pending.excludes)
    replan.extend(e.reason for e in pending.excludes)
    # 4. match the plan
    match = match_plan(plan, live, statuses, settings, excluded, history)
    replan.extend(match.replan)
    actions.extend(Keep(replica_id) for replica_id in sorted(match.kept))
    # 5. surplus, make-before-break
    settled = settle_surplus(plan, live, statuses, match.kept,
                             {c.replica_id for c in pending.cancels}, settings, configured)
    # 6. draining replicas
    cancels = [*pending.cancels, *settled.cancels, *drained_cancels(live, statuses, now, settings)]
    # 7. bounds and freshness
    actions.extend(bounded(settled.drains, cancels, match.submits, held is None, settings))
    held_back = "; ".join(filter(None, [held, *settled.kept_last])) or None
    return Decision(tuple(actions), tuple(dict.fromkeys(replan)), held_back, statuses)


# --------------------------------------------------------------------------- the phases


def replica_statuses(
    plan: DesiredPlan | None,
    replicas: Sequence[ReplicaFacts],
    now: float,
    settings: ReconcileSettings,
) -> dict[str, ReplicaStatus]:
    """Each replica's status by id; a pending replica worth waiting for under ``plan`` is not
    "pending too long" (rule 3). Without a plan nothing is worth waiting for."""
    statuses = {f.record.id: replica_status(f, now, settings) for f in replicas}
    if plan is None:
        return statuses
    records = {f.record.id: f.record for f in replicas}
    return {i: replace(s, pending_too_long=False)
            if s.pending_too_long and worth_waiting(records[i], plan, settings, now) else s
            for i, s in statuses.items()}


def crash_cooldowns(
    replicas: Sequence[ReplicaFacts],
    statuses: Mapping[str, ReplicaStatus],
    now: float,
    settings: ReconcileSettings,
    excluded: Set[Excluded],
) -> list[Exclude]:
    """Rule 1: exclude each template not yet excluded that crashed ``crash_limit`` times within
    ``crash_cooldown_s``, for ``crash_cooldown_s``, naming its last crash."""
    crashes: dict[str, list[ReplicaRecord]] = defaultdict(list)
    for facts in replicas:
        record = facts.record
        status = statuses[record.id]
        ended = record.ended_at if record.ended_at is not None else now
        if status.crashed and now - ended <= settings.crash_cooldown_s:
            crashes[record.template_id].append(record)
    out = []
    for template_id, crashed in sorted(crashes.items()):
        crashed.sort(key=lambda r: (r.ended_at or now, r.id))
        key = TemplateExclusion(template_id)
        if len(crashed) < settings.crash_limit or key in excluded:
            continue
        out.append(
            Exclude(
                key, ExclusionKind.CRASH_COOLDOWN, now + settings.crash_cooldown_s,
                f"template {template_id} crashed {len(crashed)} times within "
                f"{settings.crash_cooldown_s:.0f}s (last: {crashed[-1].id}, "
                f"{crashed[-1].end_state or 'FAILED'}); excluded for "
                f"{settings.crash_cooldown_s:.0f}s",
                model=crashed[-1].model,
            )
        )
    return out


#: why nothing is done before the first plan (e.g. just after a restart), when every replica
#: would be "surplus": touch none
_NO_PLAN = ("no plan yet: nothing submitted, drained or cancelled", ("no plan yet",))


def hold_everything(
    plan: DesiredPlan | None, observation: Observation, now: float, settings: ReconcileSettings
) -> tuple[str, tuple[str, ...]] | None:
    """Rule 2: why nothing may be submitted, drained or cancelled this cycle, and what that adds
    to the replan reasons — or None when the own jobs are fresh and there is a plan. A job we
    cannot see may still be running, so stale jobs hold everything."""
    if not observation.jobs_fresh(now, settings):
        return ("own jobs not observed recently or the last Slurm call failed: "
                "no submission, drain or cancel this cycle", ())
    if plan is None:
        return _NO_PLAN
    return None


def hold_destructive(
    observation: Observation, now: float, settings: ReconcileSettings
) -> str | None:
    """Rule 2: why nothing may be drained or cancelled this cycle (a stale or partial cluster
    snapshot may hide a node coming back), or None when it may. Submissions go on."""
    if observation.cluster_fresh(now, settings):
        return None
    return "cluster snapshot stale or partial: nothing drained or cancelled this cycle"


def lost_submissions(
    live: Sequence[ReplicaRecord], statuses: Mapping[str, ReplicaStatus]
) -> list[Forget]:
    """Submissions whose tagged job never appeared although the queue was read: forgotten."""
    return [Forget(r.id, "submission never reached Slurm") for r in live
            if statuses[r.id].state is ReplicaState.SUBMITTING and statuses[r.id].submit_lost]


@dataclass(frozen=True)
class Pending:
    """Rule 3's outcome: the shapes excluded (one per shape) and the replicas cancelled."""

    excludes: tuple[Exclude, ...]
    cancels: tuple[Cancel, ...]


def pending_too_long(
    live: Sequence[ReplicaRecord],
    statuses: Mapping[str, ReplicaStatus],
    now: float,
    settings: ReconcileSettings,
    excluded: Set[Excluded],
) -> Pending:
    """Rule 3: cancel each replica pending too long and exclude its shape (template on those
    partitions) for ``pending_exclusion_s`` unless already excluded, so the next plan places
    that capacity elsewhere."""
    seen = set(excluded)
    excludes: list[Exclude] = []
    cancels: list[Cancel] = []
    for record in live:
        status = statuses[record.id]
        if status.state is not ReplicaState.PENDING or not status.pending_too_long:
            continue
        shape = ShapeExclusion(record.template_id, record.partitions)
        reason = (
            f"replica {record.id} of {record.model} pending {status.pending_for_s:.0f}s "
            f"(> {settings.pending_timeout_s:.0f}s) on {','.join(record.partitions)}"
        )
        if shape not in seen:
            excludes.append(Exclude(shape, ExclusionKind.PENDING_TIMEOUT,
                                    now + settings.pending_exclusion_s, reason,
                                    model=record.model))
            seen.add(shape)
        cancels.append(Cancel(record.id, reason))
    return Pending(tuple(excludes), tuple(cancels))


def drained_cancels(
    live: Sequence[ReplicaRecord],
    statuses: Mapping[str, ReplicaStatus],
    now: float,
    settings: ReconcileSettings,
) -> list[Cancel]:
    """Rule 6: cancel a DRAINING replica ``drain_grace_s`` after it left the routing table, and
    send the cancel again ``cancel_retry_s`` after one Slurm has not carried out."""
    cancels = []
    for record in live:
        if statuses[record.id].state is not ReplicaState.DRAINING:
            continue
        if record.cancelled_at is None:
            drained_at = record.drain_requested_at if record.drain_requested_at is not None else now
            if now - drained_at >= settings.drain_grace_s:
                cancels.append(Cancel(record.id, "drained"))
        elif now - record.cancelled_at >= settings.cancel_retry_s:
            cancels.append(Cancel(record.id, "cancel not yet carried out; sending again"))
    return cancels


def bounded(
    drains: Sequence[Drain],
    cancels: Sequence[Cancel],
    submits: Sequence[Submit],
    destructive_ok: bool,
    settings: ReconcileSettings,
) -> list[Action]:
    """Rule 7: the drains and cancels (only when ``destructive_ok``) and submissions to send,
    at most ``max_cancels_per_cycle`` cancels and ``max_submits_per_cycle`` submissions, the
    submissions that replace a replica first (otherwise in the order given)."""
    out: list[Action] = []
    if destructive_ok:
        out.extend(drains)
        out.extend(cancels[: settings.max_cancels_per_cycle])
    first = sorted(submits, key=lambda s: s.replaces is None)  # stable: slot order otherwise
    out.extend(first[: settings.max_submits_per_cycle])
    return out


def worth_waiting(record: ReplicaRecord, plan: DesiredPlan, settings: ReconcileSettings,
                  now: float) -> bool:
    """A pending replica keeps its place: Slurm expects to start it within the horizon, or the
    plan queues its model on this very shape (the best Slurm offers it)."""
    start = record.expected_start
    if start is not None and start - now <= settings.max_queue_wait_s:
        return True
    key = (record.template_id, record.partitions)
    return any(s.queued and s.key == key for s in plan.slots)
