"""Rule 1a of the decide step: a layout that fails at start backs off, exponentially, capped.

A replica whose job failed before it was READY — vLLM refusing a ``max_model_len`` its KV cache
cannot hold, a checkpoint it cannot read — will most likely fail the same way when submitted
again. So its template is kept out of plans at once (the same exclusion the crash cool-down
uses, kind ``start_failed``) for ``start_backoff_s``, twice as long after each further failed
start in a row, at most ``crash_cooldown_s``; the reason names the failure from the job's logs
(``ReplicaRecord.failure``), so ``status`` says why and until when. A replica of the template
that reaches READY ends the run: the next failed start backs off from ``start_backoff_s`` again.

Pure: the previous exclusions (also those expired within ``crash_cooldown_s``) carry the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from coral_hpc.reconcile.actions import Exclude
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaStatus
from coral_hpc.records import Exclusion, ReplicaRecord
from coral_hpc.types import Excluded, ExclusionKind, TemplateExclusion

__all__ = ["next_backoff_s", "start_backoffs"]

#: kinds of a template's previous exclusion that a failed start continues (doubles)
_RUN_KINDS = frozenset({ExclusionKind.START_FAILED, ExclusionKind.CRASH_COOLDOWN})


def next_backoff_s(previous_s: float | None, settings: ReconcileSettings) -> float:
    """The exclusion after a failed start: ``start_backoff_s`` first, then twice the previous
    one (``previous_s``, None when the run starts), at most ``crash_cooldown_s``."""
    cap = settings.crash_cooldown_s
    if previous_s is None:
        return min(cap, settings.start_backoff_s)
    # whole seconds: the stored exclusion starts a few ms after the decision that set it
    return min(cap, max(settings.start_backoff_s, 2.0 * round(previous_s)))


def _failed_at_start(record: ReplicaRecord, status: ReplicaStatus) -> bool:
    return status.crashed and record.ready_at is None


def start_backoffs(
    replicas: Sequence[ReplicaFacts],
    statuses: Mapping[str, ReplicaStatus],
    exclusions: Sequence[Exclusion],
    now: float,
    settings: ReconcileSettings,
    excluded: Set[Excluded],
) -> list[Exclude]:
    """Rule 1a: an :class:`Exclude` for each template not excluded now whose replica failed at
    start since its last exclusion ended (see the module docstring)."""
    latest: dict[TemplateExclusion, Exclusion] = {}
    for e in exclusions:
        if isinstance(e.target, TemplateExclusion) and (
                e.target not in latest or e.until > latest[e.target].until):
            latest[e.target] = e
    failed: dict[str, list[ReplicaRecord]] = {}
    ready_since: dict[str, float] = {}
    for facts in replicas:
        record = facts.record
        if record.ready_at is not None:
            ready_since[record.template_id] = max(ready_since.get(record.template_id, 0.0),
                                                  record.ready_at)
        if _failed_at_start(record, statuses[record.id]):
            failed.setdefault(record.template_id, []).append(record)
    out = []
    for template_id, records in sorted(failed.items()):
        key = TemplateExclusion(template_id)
        if key in excluded:
            continue
        previous = latest.get(key)
        # a failure that ended while the template was excluded was counted (or is stale)
        fresh = [r for r in records if previous is None
                 or (r.ended_at if r.ended_at is not None else now) > previous.until]
        if not fresh:
            continue
        fresh.sort(key=lambda r: (r.ended_at if r.ended_at is not None else now, r.id))
        last = fresh[-1]
        run_goes_on = (previous is not None and previous.kind in _RUN_KINDS
                       and ready_since.get(template_id, 0.0) <= previous.since)
        delay = next_backoff_s(previous.until - previous.since if run_goes_on and previous
                               else None, settings)
        why = last.failure or "its logs name no error"
        out.append(Exclude(
            key, ExclusionKind.START_FAILED, now + delay,
            f"template {template_id} failed to start (replica {last.id}, job {last.job_id} "
            f"{last.end_state or 'FAILED'}): {why}; kept out of plans for {delay:.0f}s "
            f"(doubling with each failed start in a row, at most "
            f"{settings.crash_cooldown_s:.0f}s)",
            model=last.model,
        ))
    return out
