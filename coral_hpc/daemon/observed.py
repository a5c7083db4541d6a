"""What ``coral-hpc status`` shows when no daemon runs: the stored replicas re-observed now.

The database holds what the daemon last observed. Once the daemon is gone (``down``, a crash, a
``kill -9``) nobody updates it, so a replica it last saw READY stays READY there even after its
job was cancelled (issue 27.1). Without a live daemon ``status`` therefore asks Slurm itself —
one ``job_states`` call (one ``squeue``, then one ``sacct`` for the jobs the queue no longer
holds) for every stored job — and probes ``/health`` of each running replica's endpoint, puts
those facts in place of the stored ones and derives the state with the daemon's own
:func:`~coral_hpc.reconcile.replica_status`. A job neither ``squeue`` nor ``sacct`` knows is gone.

When Slurm cannot be asked, the stored states are shown as last known, never as live.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from coral_hpc.errors import PermanentError, TransientError
from coral_hpc.launch.endpoint import http_health, read_endpoint
from coral_hpc.reconcile.status import RUNNING_STATES
from coral_hpc.records import ReplicaRecord
from coral_hpc.slurm.snapshot import JobStatus

#: How long a ``status`` waits for one replica's ``/health``: a replica on the cluster network
#: answers in milliseconds; ``status`` is interactive.
PROBE_TIMEOUT_S = 2.0
#: ``slurm_state`` of a job neither ``squeue`` nor ``sacct`` knows any more.
GONE = "GONE"


@dataclass(frozen=True)
class LiveFacts:
    """What Slurm and the endpoints said about the stored replicas at ``observed_at``."""

    observed_at: float
    #: job id → its state (``source`` squeue, sacct, or none when neither knows it)
    jobs: dict[str, JobStatus] = field(default_factory=dict)
    #: replica id → whether its endpoint answered ``/health`` 200 (running replicas only)
    health: dict[str, bool] = field(default_factory=dict)
    #: why Slurm could not be asked; then nothing here is live
    error: str | None = None


def observe(records: Sequence[ReplicaRecord], client_factory: Callable[[], object],
            endpoints_dir: Path | None = None,
            probe: Callable[[str], bool] = lambda url: http_health(url, PROBE_TIMEOUT_S),
            clock: Callable[[], float] = time.time) -> LiveFacts:
    """One batched ``job_states`` call for ``records``' jobs, then a ``/health`` probe of every
    replica Slurm runs and whose endpoint is known (the stored one, or its endpoint file in
    ``endpoints_dir`` when it names the same job). ``client_factory`` makes the Slurm client
    (:func:`coral_hpc.slurm.client_for_deployment`); its errors become :attr:`LiveFacts.error`."""
    job_ids = [r.job_id for r in records if r.job_id is not None]
    try:
        jobs = client_factory().job_states(job_ids) if job_ids else {}  # type: ignore[attr-defined]
    except (TransientError, PermanentError, OSError) as exc:
        return LiveFacts(clock(), error=f"Slurm could not be asked: {exc}")
    observed_at = clock()
    targets: list[tuple[str, str]] = []
    for r in records:
        status = jobs.get(r.job_id or "")
        if status is None or (status.state or "").split(" ")[0] not in RUNNING_STATES:
            continue
        url = r.endpoint
        if endpoints_dir is not None:
            endpoint = read_endpoint(Path(endpoints_dir) / f"{r.id}.json")
            if endpoint is not None and endpoint.job_id == r.job_id:
                url = None if endpoint.draining_at is not None else endpoint.url
        if url:
            targets.append((r.id, url))
    health: dict[str, bool] = {}
    if targets:
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            answers = pool.map(lambda t: probe(t[1]), targets)
            health = {rid: bool(ok) for (rid, _), ok in zip(targets, answers)}
    return LiveFacts(observed_at, jobs, health)


def as_observed(record: ReplicaRecord, live: LiveFacts,
                unhealthy_after: int) -> ReplicaRecord:
    """``record`` with what ``live`` saw in place of the stored Slurm and health facts
    (unchanged when Slurm could not be asked or the replica has no job yet)."""
    if live.error is not None or record.job_id is None:
        return record
    status = live.jobs.get(record.job_id)
    now = live.observed_at
    if status is None or status.state is None:
        return replace(record, slurm_state=GONE, ended_at=record.ended_at or now,
                       end_state=record.end_state or GONE, last_seen_at=now)
    state = status.state.split(" ")[0]
    if status.finished:
        return replace(record, slurm_state=state, ended_at=record.ended_at or now,
                       end_state=record.end_state or state, last_seen_at=now)
    reason = status.reason if status.reason is not None else record.slurm_reason
    changed = replace(record, slurm_state=state, slurm_reason=reason, last_seen_at=now)
    ok = live.health.get(record.id)
    if ok is True:
        changed = replace(changed, health_ok_at=now, health_failures=0,
                          ready_at=record.ready_at or now)
    elif ok is False or (state in RUNNING_STATES and record.ready_at is not None):
        # a replica that cannot be reached now is not shown READY from the database
        changed = replace(changed, health_failures=max(record.health_failures, unhealthy_after))
    return changed


#: States in which a replica's job had started when the row was published.
_STARTED = frozenset({"STARTING", "READY", "UNHEALTHY", "DRAINING"})


def record_from_row(row: dict, published_at: float) -> ReplicaRecord:
    """The facts a published ``status.json`` row implies (it holds states, not facts), so
    :func:`as_observed` and :func:`~coral_hpc.reconcile.replica_status` can derive the state
    again from what Slurm and the endpoint say now. Used where the database is on another host
    and its daemon no longer runs."""
    state = row.get("state")
    return ReplicaRecord(
        id=str(row["id"]), model=str(row["model"]), template_id=str(row.get("template") or ""),
        layout=None, partitions=tuple(p for p in str(row.get("partition") or "").split(",") if p),
        throughput=float(row.get("throughput") or 0.0), cost_per_hour=0.0,
        created_at=published_at - float(row.get("age_s") or 0.0),
        job_id=row.get("job_id"), endpoint=row.get("endpoint"),
        slurm_state=row.get("slurm_state"), slurm_reason=row.get("slurm_reason"),
        started_at=published_at if state in _STARTED else None,
        ready_at=published_at if state in ("READY", "UNHEALTHY") else None,
        drain_requested_at=published_at if state == "DRAINING" else None,
        expected_start=row.get("expected_start"),
        last_seen_at=row.get("observed_at") or published_at,
    )
