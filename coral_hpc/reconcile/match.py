"""Rule 4 of the decide step: which live replicas fill each plan slot, and what to submit for
the rest (see :mod:`coral_hpc.reconcile.decide` for the rules in full)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.reconcile.actions import Submit
from coral_hpc.reconcile.hysteresis import PlanHistory
from coral_hpc.reconcile.serving import (
    KEEP_ORDER,
    cost_per_rps,
    goes_on_serving,
    role_key,
    time_left,
)
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaState, ReplicaStatus
from coral_hpc.records import ReplicaRecord
from coral_hpc.types import Excluded, ShapeExclusion, TemplateExclusion

ShapeKey = tuple[str, tuple[str, ...]]  # (template, partitions): a plan slot's key
RoleKey = tuple[str, str]  # (model, role)
#: replicas outside the plan that may still fill a slot of their model and role, best first;
#: matching consumes them
Pool = dict[RoleKey, list[ReplicaRecord]]


@dataclass(frozen=True)
class Match:
    """What matching the plan came to: the replicas kept, the submissions for what is still
    missing, and why the plan is out of date (a slot it wants is excluded)."""

    kept: frozenset[str]
    submits: tuple[Submit, ...]
    replan: tuple[str, ...]


def match_plan(
    plan: DesiredPlan,
    live: Sequence[ReplicaRecord],
    statuses: Mapping[str, ReplicaStatus],
    settings: ReconcileSettings,
    excluded: Set[Excluded],
    history: PlanHistory | None,
) -> Match:
    """Keep up to ``count`` replicas per slot that go on serving, then READY stand-ins and work
    in flight of the same model and role, and submit the rest — successors first take over
    from the replicas that need one (rule 4)."""
    slot_keys = {s.key for s in plan.slots}
    by_key: dict[ShapeKey, list[ReplicaRecord]] = defaultdict(list)
    for record in live:
        by_key[(record.template_id, record.partitions)].append(record)
    successors = successors_needed(live, statuses)
    flight = in_flight(live, statuses, slot_keys)
    standing = standing_in(live, statuses, slot_keys, settings, history)
    kept: set[str] = set()
    submits: list[Submit] = []
    replan: list[str] = []
    for slot in plan.slots:
        same = by_key.get(slot.key, [])
        filled = fill_slot(slot, same, statuses, settings, standing, flight)
        kept.update(filled)
        missing = slot.count - len(filled)
        if missing <= 0:
            continue
        if TemplateExclusion(slot.template_id) in excluded or ShapeExclusion(*slot.key) in excluded:
            replan.append(f"plan wants {missing} more of {slot.template_id} on "
                          f"{','.join(slot.partitions)}, which is excluded")
            continue
        for _ in range(missing):
            replaces = take_predecessor(successors, slot.model, same)
            reason = "scale up" if replaces is None else f"successor of {replaces}"
            submits.append(Submit(slot, reason, replaces=replaces))
    return Match(frozenset(kept), tuple(submits), tuple(replan))


def fill_slot(
    slot: Slot,
    same: Sequence[ReplicaRecord],
    statuses: Mapping[str, ReplicaStatus],
    settings: ReconcileSettings,
    standing: Pool,
    flight: Pool,
) -> list[str]:
    """The replicas that fill ``slot``: its own that go on serving (READY first, then the most
    time left, then the oldest), then READY stand-ins, then work in flight — taken out of
    ``standing`` and ``flight`` so that no replica fills two slots."""
    own = [r for r in same if goes_on_serving(statuses[r.id])]
    own.sort(key=lambda r: (KEEP_ORDER[statuses[r.id].state], -time_left(statuses[r.id]),
                            r.created_at, r.id))
    filled = [r.id for r in own[: slot.count]]
    ready_in = standing.get((slot.model, slot.layout.role), [])
    for record in list(ready_in):
        if len(filled) >= slot.count:
            break
        if stands_in(record, slot, settings):
            ready_in.remove(record)
            filled.append(record.id)
    pending = flight.get((slot.model, slot.layout.role), [])
    while len(filled) < slot.count and pending:
        filled.append(pending.pop(0).id)
    return filled


def successors_needed(
    live: Sequence[ReplicaRecord], statuses: Mapping[str, ReplicaStatus]
) -> dict[str, list[str]]:
    """Per model, the replicas that need a successor (walltime near, node going away, unhealthy
    too long), in the order given: a new submission of the model takes over from one."""
    needed: dict[str, list[str]] = defaultdict(list)
    for record in live:
        if statuses[record.id].needs_successor:
            needed[record.model].append(record.id)
    return needed


def in_flight(
    live: Sequence[ReplicaRecord], statuses: Mapping[str, ReplicaStatus], slot_keys: Set[ShapeKey]
) -> Pool:
    """Replicas still pending or starting in a slot the plan no longer names, oldest first.

    Hysteresis: such a replica is work in flight. It fills a missing slot of its model in place
    of a new submission instead of being cancelled, until it is READY, pends past
    ``pending_timeout_s`` or the model's slots are full — so plans that alternate never cancel
    their own replacements."""
    pool: Pool = defaultdict(list)
    for record in sorted(live, key=lambda r: (r.created_at, r.id)):
        status = statuses[record.id]
        if ((record.template_id, record.partitions) not in slot_keys and goes_on_serving(status)
                and status.state in (ReplicaState.PENDING, ReplicaState.STARTING)):
            pool[role_key(record)].append(record)
    return pool


def standing_in(
    live: Sequence[ReplicaRecord],
    statuses: Mapping[str, ReplicaStatus],
    slot_keys: Set[ShapeKey],
    settings: ReconcileSettings,
    history: PlanHistory | None,
) -> Pool:
    """READY replicas whose slot the plan no longer names but has named within
    ``replace_after_plans`` plans, cheapest per request/s first: they may stand in for a new
    slot of their model, so a plan that alternates never replaces a READY replica. None without
    a history (the plan is followed at once, make-before-break)."""
    pool: Pool = defaultdict(list)
    if history is None:
        return pool
    for record in sorted(live, key=lambda r: (cost_per_rps(r.cost_per_hour, r.throughput),
                                              r.created_at, r.id)):
        own = (record.template_id, record.partitions)
        status = statuses[record.id]
        if (own not in slot_keys and status.state is ReplicaState.READY
                and goes_on_serving(status)
                and history.absent_for(own) < settings.replace_after_plans):
            pool[role_key(record)].append(record)
    return pool


def stands_in(record: ReplicaRecord, slot: Slot, settings: ReconcileSettings) -> bool:
    """A READY replica may serve in place of one replica of ``slot``: it sustains at least the
    slot's requests/s, and the slot is not cheaper per request/s by ``replace_margin``."""
    if record.throughput + 1e-9 < slot.throughput:
        return False
    ours = cost_per_rps(record.cost_per_hour, record.throughput)
    return cost_per_rps(slot.cost_per_hour, slot.throughput) > (1 - settings.replace_margin) * ours


def take_predecessor(
    needed: dict[str, list[str]], model: str, same_slot: Sequence[ReplicaRecord]
) -> str | None:
    """The replica a new submission succeeds (taken out of ``needed``): one of the same slot
    first, else of the model."""
    candidates = needed.get(model, [])
    if not candidates:
        return None
    same = {r.id for r in same_slot}
    for replica_id in candidates:
        if replica_id in same:
            candidates.remove(replica_id)
            return replica_id
    return candidates.pop(0)
