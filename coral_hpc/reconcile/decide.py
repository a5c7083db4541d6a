"""The decide step: plan + replicas + time → the actions that move the cluster towards the plan.

Pure: no Slurm, no database, no clock. The act step applies what this returns.

Rules, in the order they are applied:

1. **Crash cool-down.** A template with ``crash_limit`` crashes within ``crash_cooldown_s`` is
   excluded from plans for ``crash_cooldown_s`` (an :class:`Exclude` with a clear reason); no new
   replica of it is submitted meanwhile. Replicas of it that do serve keep serving.
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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.reconcile.hysteresis import PlanHistory
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, ReplicaStatus, replica_status
from coral_hpc.records import Exclusion, ReplicaRecord
from coral_hpc.types import Excluded, ExclusionKind, ShapeExclusion, TemplateExclusion

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Observation:
    """How fresh and complete the facts are. Times are when Slurm last answered (None: never)."""

    jobs_at: float | None  # own jobs (squeue/sacct)
    cluster_at: float | None  # nodes and partitions (sinfo/scontrol)
    complete: bool = True  # False when the last Slurm call failed or answered partially

    def jobs_fresh(self, now: float, settings: ReconcileSettings) -> bool:
        return (
            self.complete and self.jobs_at is not None
            and now - self.jobs_at <= settings.stale_after_s
        )

    def cluster_fresh(self, now: float, settings: ReconcileSettings) -> bool:
        return (
            self.jobs_fresh(now, settings) and self.cluster_at is not None
            and now - self.cluster_at <= settings.stale_after_s
        )


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Submit:
    """Start a new replica of ``slot`` (``replaces``: the replica it takes over from, if any)."""

    slot: Slot
    reason: str
    replaces: str | None = None


@dataclass(frozen=True)
class Drain:
    """Take a replica out of the routing table; it is cancelled after the drain grace."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Cancel:
    """Cancel a replica's Slurm job (with a grace signal first)."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Forget:
    """Record that a replica never reached Slurm (no tagged job exists): end it in the store."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Exclude:
    """Keep a template or a shape (template on partitions) out of plans until ``until``."""

    target: Excluded
    kind: ExclusionKind
    until: float
    reason: str
    model: str | None = None


@dataclass(frozen=True)
class Keep:
    """A replica that stays as it is (for status: plan vs actual)."""

    replica_id: str


Action = Submit | Drain | Cancel | Forget | Exclude | Keep


@dataclass(frozen=True)
class Decision:
    """What to do now, and why the plan itself is out of date (empty: it is not)."""

    actions: tuple[Action, ...]
    replan: tuple[str, ...] = ()
    #: set when destructive actions or submissions were withheld, saying why
    held_back: str | None = None
    statuses: Mapping[str, ReplicaStatus] = field(default_factory=dict)

    def of(self, kind: type) -> list:
        """The actions of one kind, in order."""
        return [a for a in self.actions if isinstance(a, kind)]


# --------------------------------------------------------------------------- decide

_KEEP_ORDER = {
    ReplicaState.READY: 0,
    ReplicaState.STARTING: 1,
    ReplicaState.PENDING: 2,
    ReplicaState.SUBMITTING: 3,
    ReplicaState.UNHEALTHY: 4,
}


def goes_on_serving(status: ReplicaStatus) -> bool:
    """Whether a live replica counts towards its plan slot: it serves or will, and needs no
    successor. The one rule for the decide step (which replicas a slot keeps) and the planner
    (which replicas go on serving, keep their GPUs and get the start-up credit)."""
    return (status.state in _KEEP_ORDER and not status.needs_successor
            and not status.pending_too_long and not status.submit_lost)


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
    statuses = {f.record.id: replica_status(f, now, settings) for f in replicas}
    records = {f.record.id: f.record for f in replicas}
    if plan is not None:
        # a pending replica worth waiting for is not "pending too long" (rule 3)
        statuses = {i: replace(s, pending_too_long=False)
                    if s.pending_too_long and _worth_waiting(records[i], plan, settings, now) else s
                    for i, s in statuses.items()}
    excluded: set[Excluded] = {e.target for e in exclusions if e.until > now}
    actions: list[Action] = []
    replan: list[str] = []

    # 1. crash cool-down (a fact of the store: safe whatever the freshness)
    for exclude in _crash_cooldowns(replicas, statuses, now, settings, excluded):
        actions.append(exclude)
        excluded.add(exclude.target)
        replan.append(exclude.reason)

    # 2. freshness
    jobs_fresh = observation.jobs_fresh(now, settings)
    cluster_fresh = observation.cluster_fresh(now, settings)
    if not jobs_fresh:
        return Decision(
            tuple(actions), tuple(replan),
            held_back="own jobs not observed recently or the last Slurm call failed: "
            "no submission, drain or cancel this cycle",
            statuses=statuses,
        )
    if plan is None:
        # before the first plan (e.g. just after a restart) every replica is "surplus": touch none
        return Decision(
            tuple(actions), (*replan, "no plan yet"),
            held_back="no plan yet: nothing submitted, drained or cancelled", statuses=statuses,
        )
    held_back = None
    if not cluster_fresh:
        held_back = "cluster snapshot stale or partial: nothing drained or cancelled this cycle"
    destructive_ok = cluster_fresh

    live = [records[i] for i, s in statuses.items() if s.state.live]
    cancels: list[Cancel] = []
    drains: list[Drain] = []
    submits: list[Submit] = []

    # lost submissions: the tagged job never appeared although the queue was read
    for record in live:
        status = statuses[record.id]
        if status.state is ReplicaState.SUBMITTING and status.submit_lost:
            actions.append(Forget(record.id, "submission never reached Slurm"))

    # 3. pending too long
    for record in live:
        status = statuses[record.id]
        if status.state is ReplicaState.PENDING and status.pending_too_long:
            shape = ShapeExclusion(record.template_id, record.partitions)
            reason = (
                f"replica {record.id} of {record.model} pending {status.pending_for_s:.0f}s "
                f"(> {settings.pending_timeout_s:.0f}s) on {','.join(record.partitions)}"
            )
            if shape not in excluded:
                actions.append(Exclude(shape, ExclusionKind.PENDING_TIMEOUT,
                                       now + settings.pending_exclusion_s,
                                       reason, model=record.model))
                excluded.add(shape)
                replan.append(reason)
            cancels.append(Cancel(record.id, reason))

    # 4. match the plan
    slots = plan.slots
    by_key: dict[tuple[str, tuple[str, ...]], list[ReplicaRecord]] = defaultdict(list)
    for record in live:
        by_key[(record.template_id, record.partitions)].append(record)
    successors_needed: dict[str, list[str]] = defaultdict(list)  # model -> replica ids
    for record in live:
        if statuses[record.id].needs_successor:
            successors_needed[record.model].append(record.id)

    kept: set[str] = set()
    # Hysteresis: a replica still pending or starting whose slot a newer plan no longer names is
    # work in flight. It fills a missing slot of its model in place of a new submission (oldest
    # first) instead of being cancelled, until it is READY, pends past pending_timeout_s or the
    # model's slots are full — so plans that alternate never cancel their own replacements.
    slot_keys = {s.key for s in slots}
    in_flight: dict[tuple[str, str], list[ReplicaRecord]] = defaultdict(list)
    for record in sorted(live, key=lambda r: (r.created_at, r.id)):
        status = statuses[record.id]
        if ((record.template_id, record.partitions) not in slot_keys and goes_on_serving(status)
                and status.state in (ReplicaState.PENDING, ReplicaState.STARTING)):
            in_flight[_role_key(record)].append(record)
    # READY replicas that may stand in for a new slot of their model (hysteresis, rule 4),
    # the cheapest per request/s first
    standing: dict[tuple[str, str], list[ReplicaRecord]] = defaultdict(list)
    if history is not None:
        for record in sorted(live, key=lambda r: (_cost_per_rps(r.cost_per_hour, r.throughput),
                                                  r.created_at, r.id)):
            own = (record.template_id, record.partitions)
            if (own not in slot_keys and statuses[record.id].state is ReplicaState.READY
                    and goes_on_serving(statuses[record.id])
                    and history.absent_for(own) < settings.replace_after_plans):
                standing[_role_key(record)].append(record)
    for slot in slots:
        candidates = [r for r in by_key.get(slot.key, []) if goes_on_serving(statuses[r.id])]
        candidates.sort(key=lambda r: (_KEEP_ORDER[statuses[r.id].state],
                                       -_time_left(statuses[r.id]),
                                       r.created_at, r.id))
        keep = candidates[: slot.count]
        kept.update(r.id for r in keep)
        missing = slot.count - len(keep)
        ready_in = standing[(slot.model, slot.layout.role)]
        for record in list(ready_in):
            if missing <= 0:
                break
            if _stands_in(record, slot, settings):
                ready_in.remove(record)
                kept.add(record.id)
                missing -= 1
        flight = in_flight[(slot.model, slot.layout.role)]
        while missing > 0 and flight:
            kept.add(flight.pop(0).id)
            missing -= 1
        if missing <= 0:
            continue
        if (TemplateExclusion(slot.template_id) in excluded
                or ShapeExclusion(*slot.key) in excluded):
            replan.append(f"plan wants {missing} more of {slot.template_id} on "
                          f"{','.join(slot.partitions)}, which is excluded")
            continue
        for _ in range(missing):
            replaces = _take_predecessor(successors_needed, slot.model, by_key.get(slot.key, []))
            reason = "scale up" if replaces is None else f"successor of {replaces}"
            submits.append(Submit(slot, reason, replaces=replaces))
    for replica_id in sorted(kept):
        actions.append(Keep(replica_id))

    # 5. surplus, make-before-break
    surplus = [r for r in live if r.id not in kept and statuses[r.id].state in _KEEP_ORDER]
    # per model and role: a surplus prefill replica cannot stand in for a missing decode one
    ready_capacity: dict[tuple[str, str], float] = defaultdict(float)
    # READY replicas that will go on serving (not themselves draining-node or walltime bound):
    # only these count as a successor that lets another replica drain
    ready_count: dict[tuple[str, str], int] = defaultdict(int)
    # ... and their capacity: short of the plan's, a replica still starting serves sooner than
    # a successor submitted now
    stable_capacity: dict[tuple[str, str], float] = defaultdict(float)
    for record in live:
        if statuses[record.id].state is ReplicaState.READY:
            ready_capacity[_role_key(record)] += record.throughput
            if not statuses[record.id].needs_successor:
                ready_count[_role_key(record)] += 1
                stable_capacity[_role_key(record)] += record.throughput
    kept_last: list[str] = []
    planned = {key: plan.capacity(*key) for key in {_role_key(r) for r in live}}
    # serving surplus: the ones that will stop anyway first, then the dearest per request/s
    surplus.sort(key=lambda r: (not statuses[r.id].needs_successor,
                                -(r.cost_per_hour / max(r.throughput, 1e-9)), r.created_at, r.id))
    already_cancelled = {c.replica_id for c in cancels}
    for record in surplus:
        status = statuses[record.id]
        if status.state is ReplicaState.SUBMITTING:
            continue  # nothing to cancel yet: adopted or forgotten on a later cycle
        if status.state is not ReplicaState.READY:
            if (status.state is ReplicaState.UNHEALTHY and not status.unhealthy_too_long
                    and ready_count[_role_key(record)] < 1
                    and (configured is None or record.model in configured)):
                # it answered /health until moments ago and nothing else serves its model yet: a
                # loaded host answers late (seen with real engines starting beside it), and
                # cancelling it would leave the model with no replica until a successor is READY
                kept_last.append(f"{record.id} ({_surplus_reason(record, status, 0)}) kept: "
                                 f"unhealthy for less than {settings.unhealthy_grace_s:.0f}s, "
                                 f"no successor of {record.model} READY")
                continue
            key = _role_key(record)
            if (_starting_past_its_lead(status, settings)
                    and stable_capacity[key] + 1e-9 < planned.get(key, 0.0)
                    and (configured is None or record.model in configured)):
                # its walltime successor fell due before it became READY (its start-up beside
                # other engines loading outran the lead: seen on the real engine); it serves
                # long before that successor can, so cancelling it opens a gap
                kept_last.append(f"{record.id} kept: its walltime successor fell due while it "
                                 f"was still starting, and {record.model} lacks READY capacity")
                continue
            if record.id not in already_cancelled:
                cancels.append(Cancel(record.id, _surplus_reason(record, status,
                                                                 ready_count[_role_key(record)])))
            continue
        key = _role_key(record)
        remaining = ready_capacity[key] - record.throughput
        stable = not status.needs_successor
        others = ready_count[key] - (1 if stable else 0)
        if others < 1 and (configured is None or record.model in configured):
            role = "" if key[1] == "both" else f"{key[1]} "
            kept_last.append(f"{record.id} ({_surplus_reason(record, status, 0)}) kept: the last "
                             f"READY {role}replica of {record.model}, no successor READY")
            continue
        if remaining + 1e-9 >= planned.get(key, 0.0):
            drains.append(Drain(record.id, _surplus_reason(record, status, others)))
            ready_capacity[key] = remaining
            ready_count[key] = others

    # 6. draining replicas: cancel after the grace, retry a cancel Slurm did not carry out
    for record in live:
        if statuses[record.id].state is not ReplicaState.DRAINING:
            continue
        if record.cancelled_at is None:
            drained_at = record.drain_requested_at if record.drain_requested_at is not None else now
            if now - drained_at >= settings.drain_grace_s:
                cancels.append(Cancel(record.id, "drained"))
        elif now - record.cancelled_at >= settings.cancel_retry_s:
            cancels.append(Cancel(record.id, "cancel not yet carried out; sending again"))

    # 7. bounds and freshness
    if destructive_ok:
        actions.extend(drains)
        actions.extend(cancels[: settings.max_cancels_per_cycle])
    submits.sort(key=lambda s: s.replaces is None)  # replacements first (stable otherwise)
    actions.extend(submits[: settings.max_submits_per_cycle])
    if kept_last:
        held_back = "; ".join(filter(None, [held_back, *kept_last]))
    return Decision(tuple(actions), tuple(dict.fromkeys(replan)), held_back, statuses)


def _worth_waiting(record: ReplicaRecord, plan: DesiredPlan, settings: ReconcileSettings,
                   now: float) -> bool:
    """A pending replica keeps its place: Slurm expects to start it within the horizon, or the
    plan queues its model on this very shape (the best Slurm offers it)."""
    start = record.expected_start
    if start is not None and start - now <= settings.max_queue_wait_s:
        return True
    key = (record.template_id, record.partitions)
    return any(s.queued and s.key == key for s in plan.slots)


def _starting_past_its_lead(status: ReplicaStatus, settings: ReconcileSettings) -> bool:
    """A STARTING replica whose walltime successor is due but which can still serve: Slurm's
    walltime warning is still ahead. (A node going away is not this: rule 5 cancels it.)"""
    return (status.state is ReplicaState.STARTING and status.near_walltime
            and not status.must_move and status.time_left_s is not None
            and status.time_left_s > settings.walltime_signal_s)


def _cost_per_rps(cost_per_hour: float, throughput: float) -> float:
    return cost_per_hour / max(throughput, 1e-9)


def _stands_in(record: ReplicaRecord, slot: Slot, settings: ReconcileSettings) -> bool:
    """A READY replica may serve in place of one replica of ``slot``: it sustains at least the
    slot's requests/s, and the slot is not cheaper per request/s by ``replace_margin``."""
    if record.throughput + 1e-9 < slot.throughput:
        return False
    ours = _cost_per_rps(record.cost_per_hour, record.throughput)
    return _cost_per_rps(slot.cost_per_hour, slot.throughput) > (1 - settings.replace_margin) * ours


def _time_left(status: ReplicaStatus) -> float:
    return status.time_left_s if status.time_left_s is not None else float("inf")


def _take_predecessor(
    needed: dict[str, list[str]], model: str, same_slot: Sequence[ReplicaRecord]
) -> str | None:
    """The replica a new submission succeeds: one of the same slot first, else of the model."""
    candidates = needed.get(model, [])
    if not candidates:
        return None
    same = {r.id for r in same_slot}
    for replica_id in candidates:
        if replica_id in same:
            candidates.remove(replica_id)
            return replica_id
    return candidates.pop(0)


def _surplus_reason(record: ReplicaRecord, status: ReplicaStatus, others_ready: int) -> str:
    """Why a replica is drained, saying what actually serves its model afterwards."""
    serving = (f"{others_ready} other READY replica(s) of {record.model} serving"
               if others_ready else f"no other READY replica of {record.model}")
    if status.near_walltime:
        return f"walltime in {status.time_left_s:.0f}s; {serving}"
    if status.must_move:
        return f"node or partition draining or down; {serving}"
    if status.unhealthy_too_long:
        return f"unhealthy; {serving}"
    return f"not in the plan ({record.template_id} on {','.join(record.partitions)}); {serving}"


def _crash_cooldowns(
    replicas: Sequence[ReplicaFacts],
    statuses: Mapping[str, ReplicaStatus],
    now: float,
    settings: ReconcileSettings,
    excluded: set[Excluded],
) -> list[Exclude]:
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


def _role_key(record) -> tuple[str, str]:
    """(model, role) of a replica record; a replica adopted without its layout counts as both."""
    return record.model, record.layout.role if record.layout else "both"
