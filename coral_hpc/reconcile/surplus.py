"""Rule 5 of the decide step, make-before-break: what becomes of the live replicas the plan
does not keep — cancelled, drained or kept serving until a successor is READY (see
:mod:`coral_hpc.reconcile.decide` for the rules in full)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from coral_hpc.plan.desired import DesiredPlan
from coral_hpc.reconcile.actions import Cancel, Drain
from coral_hpc.reconcile.serving import KEEP_ORDER, role_key
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaState, ReplicaStatus
from coral_hpc.records import ReplicaRecord

RoleKey = tuple[str, str]  # (model, role)


@dataclass
class ReadyTally:
    """READY replicas per (model, role), updated as surplus drains: a surplus prefill replica
    cannot stand in for a missing decode one, so each role is counted apart."""

    #: requests/s of every READY replica
    capacity: dict[RoleKey, float] = field(default_factory=lambda: defaultdict(float))
    #: READY replicas that go on serving (not themselves draining-node or walltime bound): only
    #: these count as a successor that lets another replica drain
    count: dict[RoleKey, int] = field(default_factory=lambda: defaultdict(int))
    #: ... and their requests/s: short of the plan's, a replica still starting serves sooner
    #: than a successor submitted now
    stable: dict[RoleKey, float] = field(default_factory=lambda: defaultdict(float))


@dataclass(frozen=True)
class Settled:
    """What becomes of the surplus: drains, cancels, and why replicas were kept serving."""

    drains: tuple[Drain, ...]
    cancels: tuple[Cancel, ...]
    kept_last: tuple[str, ...]


def settle_surplus(
    plan: DesiredPlan,
    live: Sequence[ReplicaRecord],
    statuses: Mapping[str, ReplicaStatus],
    kept: Set[str],
    already_cancelled: Set[str],
    settings: ReconcileSettings,
    configured: frozenset[str] | None,
) -> Settled:
    """Cancel surplus that serves nothing, drain READY surplus while its model's READY capacity
    without it still reaches the plan's, keep the last READY replica of a configured model
    (rule 5). ``already_cancelled``: replicas an earlier rule cancels (not cancelled twice)."""
    tally = ready_tally(live, statuses)
    planned = {key: plan.capacity(*key) for key in {role_key(r) for r in live}}
    drains: list[Drain] = []
    cancels: list[Cancel] = []
    kept_last: list[str] = []
    for record in surplus_order(live, statuses, kept):
        status = statuses[record.id]
        if status.state is ReplicaState.SUBMITTING:
            continue  # nothing to cancel yet: adopted or forgotten on a later cycle
        if status.state is not ReplicaState.READY:
            unready = settle_unready(record, status, tally, planned, settings, configured)
            if isinstance(unready, str):
                kept_last.append(unready)
            elif record.id not in already_cancelled:
                cancels.append(unready)
            continue
        ready = settle_ready(record, status, tally, planned, configured)
        if isinstance(ready, str):
            kept_last.append(ready)
        elif ready is not None:
            drains.append(ready)
    return Settled(tuple(drains), tuple(cancels), tuple(kept_last))


def ready_tally(live: Sequence[ReplicaRecord], statuses: Mapping[str, ReplicaStatus]) -> ReadyTally:
    """The READY replicas of each (model, role) before any surplus drains."""
    tally = ReadyTally()
    for record in live:
        if statuses[record.id].state is ReplicaState.READY:
            key = role_key(record)
            tally.capacity[key] += record.throughput
            if not statuses[record.id].needs_successor:
                tally.count[key] += 1
                tally.stable[key] += record.throughput
    return tally


def surplus_order(
    live: Sequence[ReplicaRecord], statuses: Mapping[str, ReplicaStatus], kept: Set[str]
) -> list[ReplicaRecord]:
    """Live replicas not kept, in the order they are settled: the ones that will stop anyway
    first, then the dearest per request/s, then the oldest."""
    surplus = [r for r in live if r.id not in kept and statuses[r.id].state in KEEP_ORDER]
    surplus.sort(key=lambda r: (not statuses[r.id].needs_successor,
                                -(r.cost_per_hour / max(r.throughput, 1e-9)), r.created_at, r.id))
    return surplus


def settle_unready(
    record: ReplicaRecord,
    status: ReplicaStatus,
    tally: ReadyTally,
    planned: Mapping[RoleKey, float],
    settings: ReconcileSettings,
    configured: frozenset[str] | None,
) -> Cancel | str:
    """A surplus replica that serves nothing yet (pending, starting, unhealthy): its Cancel, or
    why it is kept."""
    key = role_key(record)
    if (status.state is ReplicaState.UNHEALTHY and not status.unhealthy_too_long
            and tally.count[key] < 1 and _configured(record, configured)):
        # it answered /health until moments ago and nothing else serves its model yet: a
        # loaded host answers late (seen with real engines starting beside it), and
        # cancelling it would leave the model with no replica until a successor is READY
        return (f"{record.id} ({surplus_reason(record, status, 0)}) kept: "
                f"unhealthy for less than {settings.unhealthy_grace_s:.0f}s, "
                f"no successor of {record.model} READY")
    if (starting_past_its_lead(status, settings)
            and tally.stable[key] + 1e-9 < planned.get(key, 0.0)
            and _configured(record, configured)):
        # its walltime successor fell due before it became READY (its start-up beside
        # other engines loading outran the lead: seen on the real engine); it serves
        # long before that successor can, so cancelling it opens a gap
        return (f"{record.id} kept: its walltime successor fell due while it "
                f"was still starting, and {record.model} lacks READY capacity")
    return Cancel(record.id, surplus_reason(record, status, tally.count[key]))


def settle_ready(
    record: ReplicaRecord,
    status: ReplicaStatus,
    tally: ReadyTally,
    planned: Mapping[RoleKey, float],
    configured: frozenset[str] | None,
) -> Drain | str | None:
    """A READY surplus replica: its Drain (taken off ``tally``), why it is kept as its model's
    last READY replica, or None while the others fall short of the plan's capacity."""
    key = role_key(record)
    remaining = tally.capacity[key] - record.throughput
    others = tally.count[key] - (0 if status.needs_successor else 1)
    if others < 1 and _configured(record, configured):
        role = "" if key[1] == "both" else f"{key[1]} "
        return (f"{record.id} ({surplus_reason(record, status, 0)}) kept: the last "
                f"READY {role}replica of {record.model}, no successor READY")
    if remaining + 1e-9 >= planned.get(key, 0.0):
        tally.capacity[key] = remaining
        tally.count[key] = others
        return Drain(record.id, surplus_reason(record, status, others))
    return None


def starting_past_its_lead(status: ReplicaStatus, settings: ReconcileSettings) -> bool:
    """A STARTING replica whose walltime successor is due but which can still serve: Slurm's
    walltime warning is still ahead. (A node going away is not this: rule 5 cancels it.)"""
    return (status.state is ReplicaState.STARTING and status.near_walltime
            and not status.must_move and status.time_left_s is not None
            and status.time_left_s > settings.walltime_signal_s)


def surplus_reason(record: ReplicaRecord, status: ReplicaStatus, others_ready: int) -> str:
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


def _configured(record: ReplicaRecord, configured: frozenset[str] | None) -> bool:
    """Whether the replica's model is still in models.yaml (None: every model counts): a model
    no longer configured may lose its last READY replica."""
    return configured is None or record.model in configured
