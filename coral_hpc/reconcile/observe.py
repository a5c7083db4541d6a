"""The observe step: read Slurm, endpoint files and health probes; record the facts in the store.

One snapshot call per cycle (nodes, partitions, own jobs in one batched observation), one batched
``job_states`` call for jobs the queue no longer holds, and one ``/health`` probe per running
replica, in parallel with a short timeout. Nothing here decides anything: it writes facts
(``coral_hpc.store``) and returns them with how fresh and complete they are.

Adoption: every job carrying this deployment's tag *and instance* (``coral_hpc.instance``: the
state folder it belongs to) is matched to its replica row by the tag's replica id — a row recorded
just before the daemon died mid-submission gets its job id; a job with no row at all (a lost
database) gets a row rebuilt from its tag and its ``spec.json``. So a restarted daemon never
submits a duplicate of a job that already runs. Jobs of the same deployment name but another
instance (a second copy of the file elsewhere), and jobs whose ``spec.json`` cannot be read, are
left alone: never adopted, counted or cancelled; each is reported once as an event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from coral_hpc.config import Deployment
from coral_hpc.errors import CoralError
from coral_hpc.launch.endpoint import Endpoint, EndpointRefused, http_health, read_endpoint
from coral_hpc.launch.failure import failure_line
from coral_hpc.launch.spec import ReplicaSpec, is_pre_instance_job_of
from coral_hpc.reconcile.decide import Observation
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import TERMINAL_STATES, ReplicaFacts
from coral_hpc.slurm.snapshot import ClusterSnapshot, JobInfo
from coral_hpc.store import ReplicaRecord, StartupObservation, Store
from coral_hpc.types import ReplicaLayout, split_placement

log = logging.getLogger("coral_hpc.reconcile")

@dataclass
class Observed:
    """What one observe step saw."""

    observation: Observation
    snapshot: ClusterSnapshot | None
    #: ``node:<name>`` / ``partition:<name>`` of this deployment's partitions draining or down
    unavailable: frozenset[str]
    facts: list[ReplicaFacts]
    error: str | None = None
    events: list[str] = field(default_factory=list)


def slurm_word(state: str | None) -> str | None:
    """``"CANCELLED by 0"`` → ``"CANCELLED"``; ``"RUNNING"`` stays."""
    if not state:
        return None
    return state.split()[0].rstrip("+").upper()


def unavailable_places(snapshot: ClusterSnapshot, partitions: Iterable[str]) -> frozenset[str]:
    """Nodes and partitions among ``partitions`` that are draining, drained, down or inactive.
    A node in an active reservation (RESERVED) is not among them: the jobs running there go on,
    ours in the reservation included; only jobs that do not name it cannot start there."""
    wanted = set(partitions)
    out = set()
    for part in snapshot.partitions:
        if part.name in wanted and part.state != "up":
            out.add(f"partition:{part.name}")
    for node in snapshot.nodes:
        if wanted & set(node.partitions) and not node.usable and node.state != "reserved":
            out.add(f"node:{node.name}")
    return frozenset(out)


def split_instance(snapshot: ClusterSnapshot, instance: str
                   ) -> tuple[ClusterSnapshot, tuple[JobInfo, ...]]:
    """(the snapshot holding only jobs of ``instance``, the deployment's other jobs). The planner
    and the reconciler see only their own instance's jobs; others' GPUs are simply not free."""
    own = tuple(j for j in snapshot.jobs if j.tag is not None and j.tag.instance == instance)
    foreign = tuple(j for j in snapshot.jobs if j not in own)
    return replace(snapshot, jobs=own), foreign


def on_unavailable(record: ReplicaRecord, unavailable: frozenset[str]) -> bool:
    """Whether one of the replica's nodes or partitions is draining or down."""
    nodes = {n for n in (record.nodes or "").split(",") if n}
    return any(f"node:{n}" in unavailable for n in nodes) or any(
        f"partition:{split_placement(p)[0]}" in unavailable for p in record.partitions
    )


class Observer:
    """Runs the observe step against an injected Slurm client, store and clock."""

    def __init__(
        self,
        deployment: Deployment,
        store: Store,
        client,  # coral_hpc.slurm.client.SlurmClient
        settings: ReconcileSettings,
        clock: Callable[[], float],
        probe: Callable[[str], bool] = http_health,
        throughput_of: Callable[[str], float | None] = lambda template_id: None,
        instance: str = "",
        api_key_file: Path | None = None,
    ):
        self.deployment = deployment
        self.store = store
        self.client = client
        self.settings = settings
        self.clock = clock
        self.probe = probe
        self.throughput_of = throughput_of
        self.instance = instance
        #: the replica key: endpoint files must be signed with it (None: taken as written)
        self.api_key_file = api_key_file
        self._refused: set[tuple[str, str]] = set()  # (file, why) already logged
        self._pool: ThreadPoolExecutor | None = None
        self._reported: set[str] = set()  # job ids already reported as left alone
        # Slurm outages: from the last answer before a failed snapshot to the next answer. Queue
        # wait counts only time Slurm answered (issue 27: an outage cancelled nothing it paused)
        self._answered_at: float | None = None
        self._unanswered_since: float | None = None
        self._outages: list[tuple[float, float]] = []

    # ------------------------------------------------------------------ the step

    def observe(self) -> Observed:
        """Observe once; facts of live replicas (and those ended within the crash window)."""
        now = self.clock()
        partitions = [p.name for p in self.deployment.cluster.partitions]
        try:
            snapshot = self.client.snapshot(self.deployment.deployment)
        except CoralError as exc:
            # nothing is recorded from a failed observation; decide() does nothing destructive
            if self._unanswered_since is None:
                self._unanswered_since = (self._answered_at if self._answered_at is not None
                                          else now)
            return Observed(
                Observation(jobs_at=None, cluster_at=None, complete=False), None,
                frozenset(), self._facts(now, frozenset()), error=f"Slurm snapshot failed: {exc}",
            )
        events: list[str] = []
        self._answered(now, events)
        snapshot = self._own_jobs(snapshot, now, events)
        error = self._record_jobs(snapshot, now, events)
        self._adopt_untracked(snapshot, now, events)
        self._check_health(now, events)
        # jobs left alone are not ours to plan around either (their GPUs are simply taken)
        snapshot = replace(snapshot, jobs=tuple(j for j in snapshot.jobs
                                                if j.job_id not in self._reported))
        unavailable = unavailable_places(snapshot, partitions)
        return Observed(
            Observation(jobs_at=snapshot.observed_at, cluster_at=snapshot.observed_at,
                        complete=error is None),
            snapshot, unavailable, self._facts(now, unavailable), error=error, events=events,
        )

    def _own_jobs(self, snapshot: ClusterSnapshot, now: float,
                  events: list[str]) -> ClusterSnapshot:
        """``snapshot`` with this instance's jobs only (and its jobs from before instance
        tags); another instance's jobs of the deployment name are reported and left alone."""
        snapshot, foreign = split_instance(snapshot, self.instance)
        if self.instance:
            # jobs from before instance tags existed: ours when their spec.json in our state
            # folder says so (an upgrade must not orphan the replicas serving at that moment)
            legacy = tuple(j for j in foreign if j.tag is not None and is_pre_instance_job_of(
                j.tag, self.deployment.state_path, self.deployment.deployment))
            if legacy:
                snapshot = replace(snapshot, jobs=snapshot.jobs + legacy)
                foreign = tuple(j for j in foreign if j not in legacy)
        for other in foreign:
            theirs = other.tag.instance if other.tag is not None else None
            self._leave_alone(other, now, "belongs to another instance of this deployment name "
                              f"(instance {theirs or 'none'}, not {self.instance or 'none'}; "
                              "another state_dir)", events)
        return snapshot

    def _record_jobs(self, snapshot: ClusterSnapshot, now: float,
                     events: list[str]) -> str | None:
        """Record what Slurm says of every live replica's job (sacct for those squeue no longer
        holds); the error when their states could not be read (the observation is partial)."""
        jobs = {j.job_id: j for j in snapshot.jobs}
        by_replica = {j.tag.replica_id: j for j in snapshot.jobs if j.tag is not None}
        missing: list[ReplicaRecord] = []
        for record in self.store.replicas(live_only=True):
            job = jobs.get(record.job_id) if record.job_id else by_replica.get(record.id)
            if job is None:
                if record.job_id is not None:
                    missing.append(record)
                continue
            self._record_job(record, job, now, events)
        if not missing:
            return None
        # jobs squeue no longer holds: one batched call (sacct behind it)
        try:
            states = self.client.job_states([r.job_id for r in missing if r.job_id])
        except CoralError as exc:
            return f"Slurm job states failed: {exc}"
        for record in missing:
            self._record_gone(record, states.get(record.job_id), now, events)
        return None

    def _adopt_untracked(self, snapshot: ClusterSnapshot, now: float,
                         events: list[str]) -> None:
        """Tagged live jobs with no row: adopt them (a lost or older database); never submit
        them again."""
        live_ids = {r.id for r in self.store.replicas(live_only=True)}
        ended_ids = {r.id for r in self.store.replicas(live_only=False)} - live_ids
        for job in snapshot.jobs:
            if job.tag is None or job.tag.replica_id in live_ids:
                continue
            if job.tag.replica_id in ended_ids or slurm_word(job.state) in TERMINAL_STATES:
                continue
            if self.store.replica_by_job(job.job_id) is not None:
                continue
            self._adopt(job, now, events)

    def close(self) -> None:
        """Stop the probe threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ------------------------------------------------------------------ Slurm outages

    def unanswered_s(self, since: float | None, now: float) -> float:
        """Seconds between ``since`` and ``now`` during which Slurm did not answer (recorded
        outages and the one going on); 0 for ``since`` None."""
        if since is None:
            return 0.0
        spans = list(self._outages)
        if self._unanswered_since is not None:
            spans.append((self._unanswered_since, now))
        return sum(max(0.0, min(end, now) - max(start, since)) for start, end in spans)

    def _answered(self, now: float, events: list[str]) -> None:
        """Slurm answered at ``now``: close the outage going on, if any."""
        began, self._unanswered_since = self._unanswered_since, None
        self._answered_at = now
        if began is not None and now > began:
            self._outages.append((began, now))
            message = (f"Slurm did not answer for {now - began:.0f}s; that time does not count "
                       "as queue wait (pending timeout paused)")
            events.append(message)
            log.warning("%s", message)
            self.store.add_event(now, "slurm_outage", message)
        if self._outages:
            # keep what can still overlap a live replica's time in the queue
            live = [r.submitted_at or r.created_at for r in self.store.replicas(live_only=True)]
            oldest = min(live, default=now)
            self._outages = [(b, e) for b, e in self._outages if e > oldest][-1000:]

    # ------------------------------------------------------------------ facts

    def _facts(self, now: float, unavailable: frozenset[str]) -> list[ReplicaFacts]:
        records = self.store.replicas(live_only=True)
        records += self.store.ended_replicas_since(now - self.settings.crash_cooldown_s)
        return [ReplicaFacts(r, node_unavailable=on_unavailable(r, unavailable),
                             unanswered_s=self.unanswered_s(r.submitted_at or r.created_at, now))
                for r in records]

    def _record_job(self, record: ReplicaRecord, job: JobInfo, now: float, events: list) -> None:
        state = slurm_word(job.state)
        changes: dict = {
            "slurm_state": state,
            "slurm_reason": job.reason,
            "last_seen_at": now,
            # Slurm's own estimate while it waits (squeue --start); gone once it runs
            "expected_start": job.expected_start if state == "PENDING" else None,
        }
        if record.job_id is None:
            changes["job_id"] = job.job_id
            changes["submitted_at"] = job.submit_time or now
            events.append(f"adopted job {job.job_id} of replica {record.id} "
                          "(submitted before a restart)")
            self.store.add_event(now, "adopt", f"job {job.job_id} found for replica {record.id}",
                                 model=record.model, replica_id=record.id)
        nodes = list(job.nodes)
        for component in job.components:
            nodes.extend(n for n in component.nodes if n not in nodes)
        if nodes:
            changes["nodes"] = ",".join(nodes)
        if job.time_limit_s:
            # every cycle, not once: an admin shortens running jobs before maintenance
            # (scontrol update TimeLimit=), and the walltime successor follows the new end
            changes["time_limit_s"] = float(job.time_limit_s)
        if job.start_time and state not in ("PENDING", None) and record.started_at is None:
            changes["started_at"] = job.start_time
        if state in TERMINAL_STATES:
            changes["ended_at"] = job.end_time or now
            changes["end_state"] = state
            self._event_end(record, state, now)
        self.store.update_replica(record.id, **changes)

    def _record_gone(self, record: ReplicaRecord, status, now: float, events: list) -> None:
        state = slurm_word(status.state) if status is not None else None
        if state in TERMINAL_STATES:
            self.store.update_replica(record.id, slurm_state=state, ended_at=now, end_state=state)
            self._event_end(record, state, now)
            return
        if state is not None:
            self.store.update_replica(record.id, slurm_state=state, last_seen_at=now)
            return
        # neither squeue nor sacct knows it yet (sacct lags): wait, but not for ever
        seen = record.last_seen_at or record.submitted_at or record.created_at
        if now - seen > 10 * self.settings.poll_interval_s + 60:
            self.store.update_replica(record.id, ended_at=now, end_state="LOST")
            self._event_end(record, "LOST", now)

    def _event_end(self, record: ReplicaRecord, state: str, now: float) -> None:
        asked = record.drain_requested_at is not None or record.cancelled_at is not None
        kind = "ended" if asked else "failed"
        message = f"job {record.job_id} ended {state}"
        if not asked:
            # Slurm knows only FAILED: why is in the job's logs (vLLM refusing a context its KV
            # cache cannot hold, a missing checkpoint); status and the cool-down name it
            failure = failure_line(self.deployment.state_path / "logs", record.id, record.job_id)
            if failure:
                self.store.update_replica(record.id, failure=failure)
                message += f": {failure}"
        self.store.add_event(now, kind, message, model=record.model, replica_id=record.id)

    def _leave_alone(self, job: JobInfo, now: float, why: str, events: list) -> None:
        """Report once that ``job`` is not ours to adopt or cancel."""
        if job.job_id in self._reported:
            return
        self._reported.add(job.job_id)
        message = f"job {job.job_id} left alone (never adopted or cancelled): {why}"
        events.append(message)
        log.warning("%s", message)
        self.store.add_event(now, "foreign_job", message,
                             model=job.tag.model if job.tag else None)

    def _adopt(self, job: JobInfo, now: float, events: list) -> None:
        tag = job.tag
        assert tag is not None
        spec_file = self.deployment.state_path / "replicas" / tag.replica_id / "spec.json"
        try:
            spec = ReplicaSpec.from_json(spec_file.read_text())
        except (OSError, ValueError, TypeError, KeyError, CoralError) as exc:
            # without its spec the layout is unknown: adopting it stalled the daemon, and a job
            # we cannot read is not one we may cancel either
            self._leave_alone(job, now, f"its {spec_file} cannot be read ({exc})", events)
            return
        # a pre-instance job (checked by is_pre_instance_job_of) has a spec without an instance
        expected = self.instance if tag.instance else ""
        if spec.instance != expected or spec.replica_id != tag.replica_id:
            self._leave_alone(job, now, f"its {spec_file} names another replica or instance",
                              events)
            return
        layout: ReplicaLayout = spec.layout  # a readable spec always carries its layout
        partitions = layout.partitions
        throughput = self.throughput_of(tag.template_id) or 1.0
        record = ReplicaRecord(
            id=tag.replica_id, model=tag.model, template_id=tag.template_id, layout=layout,
            partitions=partitions, throughput=throughput, cost_per_hour=0.0, created_at=now,
            reason="adopted", job_id=job.job_id, submitted_at=job.submit_time or now,
        )
        self.store.add_replica(record)
        self._record_job(record, job, now, events)
        message = (f"adopted running job {job.job_id} as replica {tag.replica_id} "
                   f"({tag.template_id})")
        events.append(message)
        self.store.add_event(now, "adopt", message, model=tag.model, replica_id=tag.replica_id)

    # ------------------------------------------------------------------ endpoints and health

    def _replica_key(self) -> str | None:
        if self.api_key_file is None:
            return None
        try:
            return Path(self.api_key_file).read_text().strip() or None
        except OSError:
            return None

    def _trusted_endpoint(self, path: Path, record: ReplicaRecord, key: str | None,
                          now: float) -> Endpoint | None:
        """The replica's endpoint file once it is authenticated: signed with the replica key
        and naming one of the nodes Slurm gave the job (when Slurm reported them). A file that
        fails is refused (None), logged and recorded as an event once per file and reason."""
        try:
            endpoint = read_endpoint(path, key)
        except EndpointRefused as exc:
            self._refuse(path, record, str(exc), now)
            return None
        if endpoint is None or endpoint.job_id != record.job_id:
            return endpoint
        nodes = {n for n in (record.nodes or "").split(",") if n}
        if nodes and endpoint.node not in nodes:
            self._refuse(path, record, f"{path} names node {endpoint.node!r}, not one of job "
                         f"{record.job_id}'s nodes ({', '.join(sorted(nodes))})", now)
            return None
        return endpoint

    def _refuse(self, path: Path, record: ReplicaRecord, why: str, now: float) -> None:
        if (str(path), why) in self._refused:
            return
        self._refused.add((str(path), why))
        log.warning("endpoint file refused, not routed to: %s", why)
        self.store.add_event(now, "endpoint-refused", f"not routed to: {why}",
                             model=record.model, replica_id=record.id)

    def _check_health(self, now: float, events: list) -> None:
        endpoints_dir = self.deployment.state_path / "endpoints"
        targets: list[tuple[ReplicaRecord, str, bool]] = []
        key = self._replica_key()
        for record in self.store.replicas(live_only=True):
            if record.job_id is None or record.started_at is None:
                continue
            if record.drain_requested_at is not None or record.cancelled_at is not None:
                continue
            endpoint = self._trusted_endpoint(Path(endpoints_dir) / f"{record.id}.json", record,
                                              key, now)
            if endpoint is None or endpoint.job_id != record.job_id:
                if record.ready_at is not None:
                    targets.append((record, record.endpoint or "", True))
                continue
            targets.append((record, endpoint.url, endpoint.draining_at is not None))
        if not targets:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="probe")
        results = list(self._pool.map(
            lambda t: (not t[2]) and bool(t[1]) and self.probe(t[1]), targets
        ))
        for (record, url, _), ok in zip(targets, results):
            if ok:
                changes: dict = {"health_ok_at": now, "health_failures": 0}
                if record.ready_at is None:
                    changes.update(ready_at=now, endpoint=url)
                    started = record.submitted_at or record.created_at
                    gpu = record.layout.stages[0].gpu_type if record.layout else ""
                    self.store.add_startup(StartupObservation(
                        now, record.id, record.template_id, gpu, max(0.0, now - started)))
                    self.store.add_event(now, "ready", f"READY at {url} after "
                                         f"{now - started:.0f}s", model=record.model,
                                         replica_id=record.id)
                    events.append(f"replica {record.id} READY")
                self.store.update_replica(record.id, **changes)
            elif record.ready_at is not None:
                self.store.update_replica(record.id, health_failures=record.health_failures + 1)
