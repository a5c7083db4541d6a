"""What coral-hpc knows about the cluster at one moment: plain, frozen, JSON-round-trippable data.

:class:`ClusterSnapshot` is built by a :class:`~coral_hpc.slurm.client.SlurmClient` backend and
turned into solver inputs by ``coral_hpc.plan``. ``coral-hpc cluster --json`` prints
:meth:`ClusterSnapshot.to_json`; :meth:`ClusterSnapshot.from_json` reads it back, so a saved
snapshot reproduces a plan (``--snapshot FILE``).

Times are Unix epoch seconds (float); durations are seconds; memory is GB.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from coral_hpc.config import DEFAULT_CPUS_PER_GPU, DEFAULT_MEM_PER_GPU_GB
from coral_hpc.slurm.billing import billing_sum
from coral_hpc.types import JobTag

#: Node states whose GPUs can be given to new jobs (Slurm's base state, lower case).
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})

#: Job states after which a job holds nothing any more.
FINISHED_JOB_STATES = frozenset(
    {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
        "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
    }
)

#: How a job ended, told apart for the daemon (resubmit vs cool down a template).
END_KINDS = {
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "failed",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "COMPLETED": "completed",
}


def end_kind(state: str | None) -> str | None:
    """``"preempted" | "node_fail" | "timeout" | "failed" | "cancelled" | "completed"`` for a
    finished Slurm state (``"CANCELLED by 0"`` counts as CANCELLED); None while the job lives."""
    if not state:
        return None
    return END_KINDS.get(state.split()[0].rstrip("+"))


@dataclass(frozen=True)
class NodeInfo:
    """One Slurm node."""

    name: str
    #: ``idle | mixed | allocated | completing | draining | drained | down | fail | maint |
    #: reserved | future | powered_down | unknown`` — drain/down flags win over the base state
    state: str
    #: the raw Slurm state (``MIXED+DRAIN``), for display and debugging
    slurm_state: str
    reason: str | None
    partitions: tuple[str, ...]
    gpu_type: str | None
    gpus_total: int
    gpus_alloc: int
    #: GPUs a new job could get: 0 unless the node is up and not draining
    gpus_free: int
    gpu_memory_gb: float | None
    cpus: int
    cpus_alloc: int
    mem_gb: float
    mem_alloc_gb: float
    #: the GRES type as the site wrote it (``nvidia_a100-sxm4-80gb``) when it differs from the
    #: catalogue type in ``gpu_type``
    site_gpu_type: str | None = None
    features: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """True when new jobs may start here (up, responding, not draining or drained)."""
        return self.state in USABLE_NODE_STATES


@dataclass(frozen=True)
class PartitionInfo:
    """One Slurm partition."""

    name: str
    #: ``up | drain | down | inactive``
    state: str
    nodes: tuple[str, ...]
    gpu_types: tuple[str, ...]
    #: None = unlimited
    max_time_s: int | None
    #: lower-case TRES name → weight; ``mem`` is per GB
    billing_weights: dict[str, float]
    default: bool = False
    #: MaxNodes per job; None = unlimited
    max_nodes: int | None = None
    #: the partition's QOS, whose per-job and per-user limits bind every job here
    qos: str | None = None
    #: PreemptMode as Slurm reports it (``off`` = jobs here are not preempted by partition)
    preempt_mode: str = "off"
    #: the partition QOS's limits (sacctmgr), when it has one
    qos_limits: Limits | None = None
    #: PriorityTier (preempt/partition_prio: a higher tier's jobs preempt this one's)
    priority_tier: int = 1
    #: the site's defaults for a job here that asks no CPUs or memory of its own (JobDefaults
    #: DefCpuPerGPU / DefMemPerGPU, DefMemPerCPU; memory in MB); None = not set
    def_cpu_per_gpu: int | None = None
    def_mem_per_gpu_mb: int | None = None
    def_mem_per_cpu_mb: int | None = None

    def billing_for(
        self, gpus: int, gpu_type: str | None, cpus: float, mem_gb: float, nodes: int = 1
    ) -> float:
        """Slurm's billing units for a job of this shape in this partition (the sum formula of
        TRESBillingWeights; Slurm's AllocTRES shows it truncated to an integer)."""
        return billing_sum(self.billing_weights, gpus, gpu_type, cpus, mem_gb, nodes)


@dataclass(frozen=True)
class NodeGroupInfo:
    """Identical nodes (GPU type, GPUs per node, GPU memory); each node appears in one group only,
    however many partitions contain it."""

    gpu_type: str | None
    gpus_per_node: int
    gpu_memory_gb: float | None
    nodes: tuple[str, ...]
    #: every partition that contains at least one node of the group
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class JobComponent:
    """One component of a heterogeneous job (``JOBID+OFFSET``), or the job itself."""

    job_id: str
    offset: int
    state: str
    partition: str
    nodes: tuple[str, ...]
    num_nodes: int
    gpus: int
    gpu_type: str | None
    #: the reservation the component runs (or waits to run) in
    reservation: str | None = None


@dataclass(frozen=True)
class JobInfo:
    """One of this deployment's jobs as squeue shows it."""

    #: the job id to scancel: for a hetjob, its leader's id
    job_id: str
    tag: JobTag | None
    name: str
    #: Slurm's state (PENDING, RUNNING, COMPLETING, TIMEOUT, ...); a hetjob's is its leader's
    state: str
    reason: str | None
    partition: str
    nodes: tuple[str, ...]
    num_nodes: int
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    time_limit_s: int | None
    time_left_s: int | None
    #: for a pending job, when Slurm expects it to start (squeue --start); None when unknown
    expected_start: float | None
    restarts: int
    #: GPUs allocated (or requested, while pending) over all nodes and components
    gpus: int
    gpu_type: str | None
    #: heterogeneous components (``()`` for an ordinary job)
    components: tuple[JobComponent, ...] = ()
    array_job_id: str | None = None
    array_task_id: str | None = None
    #: the account the job is charged to (squeue's Account); None when not known
    account: str | None = None
    #: the reservation it runs or waits in (a hetjob's: its leader's); None = none
    reservation: str | None = None

    @property
    def end_kind(self) -> str | None:
        """preempted / node_fail / timeout / failed / cancelled / completed, or None (alive)."""
        return end_kind(self.state)

    @property
    def is_het(self) -> bool:
        return bool(self.components)


@dataclass(frozen=True)
class Limits:
    """What the account's association and QOS allow (sacctmgr); None = no limit."""

    account: str | None
    qos: str | None
    #: GrpTRES gres/gpu: GPUs held at once by the whole association / QOS
    grp_gpus: int | None
    #: GrpTRES gres/gpu:<type>
    grp_gpus_by_type: dict[str, int]
    #: MaxTRES (per job) gres/gpu
    max_gpus_per_job: int | None
    max_gpus_per_job_by_type: dict[str, int]
    #: MaxJobs (running at once) and MaxSubmit (running + pending)
    max_jobs: int | None
    max_submit_jobs: int | None
    observed_at: float
    #: MaxTRESPU gres/gpu of the QOS (GPUs one user holds at once); also counted in grp_gpus
    max_gpus_per_user: int | None = None
    #: MaxTRES node= per job (nodes one job may span)
    max_nodes_per_job: int | None = None
    #: QOS name → the QOS that may preempt its jobs (sacctmgr Preempt lists, PreemptMode not
    #: OFF); the QOS this deployment's jobs or a partition's run under may be among them
    qos_preempted_by: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ShapeEstimate:
    """Slurm's own answer to "when would a job of this shape start?" (``sbatch --test-only``:
    the backfill scheduler's estimate, nothing submitted), for one shape at one moment."""

    partition: str
    gpu_type: str | None
    gpus_per_node: int
    nodes: int
    #: epoch seconds; None when Slurm refused the shape (``error`` says why)
    start: float | None
    #: the nodes Slurm would start it on
    node_names: tuple[str, ...]
    observed_at: float
    error: str | None = None
    #: the reservation the probe ran in, if any
    reservation: str | None = None

    @property
    def wait_s(self) -> float | None:
        """Seconds from the probe to the expected start (0 = now); None when refused."""
        return None if self.start is None else max(0.0, self.start - self.observed_at)

    @property
    def key(self) -> tuple[str, str | None, int, int, str | None]:
        return (self.partition, self.gpu_type, self.gpus_per_node, self.nodes, self.reservation)


@dataclass(frozen=True)
class ReservationInfo:
    """A reservation this deployment's account or user may run in (``scontrol show res``)."""

    name: str
    nodes: tuple[str, ...]
    start: float | None
    end: float | None
    partition: str | None
    state: str  # "active" | "inactive"
    #: Slurm's Flags (``MAINT``, ``IGNORE_JOBS``, ``SPEC_NODES`` ...), upper case
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one observe cycle learnt from Slurm."""

    slurm_version: str
    observed_at: float
    deployment: str
    backend: str
    nodes: tuple[NodeInfo, ...]
    partitions: tuple[PartitionInfo, ...]
    node_groups: tuple[NodeGroupInfo, ...]
    #: this deployment's jobs only (their comment parses to a JobTag of this deployment)
    jobs: tuple[JobInfo, ...]
    limits: Limits | None = None
    #: what the snapshot could not make sense of, naming the node, partition or type (a GPU type
    #: no catalogue entry matches, an untyped ``gpu:N`` without a feature naming its type)
    warnings: tuple[str, ...] = ()
    #: Slurm's start estimates per job shape (``sbatch --test-only``), when probed
    estimates: tuple[ShapeEstimate, ...] = ()
    #: reservations this account or user may use
    reservations: tuple[ReservationInfo, ...] = ()
    #: this user's live jobs (pending or running) that are not this deployment's: they count
    #: against MaxJobs/MaxSubmit too
    other_user_jobs: int = 0
    #: the same jobs per account they are charged to (squeue's Account; ``""`` = not known)
    other_user_jobs_by_account: dict[str, int] = field(default_factory=dict)

    def node(self, name: str) -> NodeInfo:
        """The node called ``name``; KeyError when Slurm has no such node."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def partition(self, name: str) -> PartitionInfo:
        """The partition called ``name``; KeyError when Slurm has no such partition."""
        for partition in self.partitions:
            if partition.name == name:
                return partition
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (the ``coral-hpc cluster --json`` format)."""
        data = asdict(self)
        for job, raw in zip(self.jobs, data["jobs"]):
            raw["tag"] = asdict(job.tag) if job.tag else None
            raw["end_kind"] = job.end_kind
        return data

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterSnapshot:
        """Rebuild a snapshot from :meth:`to_dict` output; raises ValueError naming the field
        that is missing or wrong."""
        try:
            return cls(
                slurm_version=str(data["slurm_version"]),
                observed_at=float(data["observed_at"]),
                deployment=str(data.get("deployment", "")),
                backend=str(data.get("backend", "file")),
                nodes=tuple(_build(NodeInfo, n) for n in data["nodes"]),
                partitions=tuple(_build_partition(p) for p in data["partitions"]),
                node_groups=tuple(_build(NodeGroupInfo, g) for g in data.get("node_groups", [])),
                jobs=tuple(_build_job(j) for j in data.get("jobs", [])),
                limits=_build(Limits, data["limits"]) if data.get("limits") else None,
                warnings=tuple(data.get("warnings", ())),
                estimates=tuple(_build(ShapeEstimate, e) for e in data.get("estimates", [])),
                reservations=tuple(_build(ReservationInfo, r)
                                   for r in data.get("reservations", [])),
                other_user_jobs=int(data.get("other_user_jobs", 0)),
                other_user_jobs_by_account={str(k): int(v) for k, v in
                                            data.get("other_user_jobs_by_account", {}).items()},
            )
        except KeyError as exc:
            raise ValueError(f"snapshot is missing the field {exc.args[0]!r}") from None
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"snapshot has a field of the wrong type: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> ClusterSnapshot:
        """Parse :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class JobStatus:
    """A job's state as of ``observed_at``, from squeue while Slurm still holds it, from sacct
    after. ``state`` is None when neither knows the job yet (sacct lags squeue): not a reason to
    act."""

    job_id: str
    state: str | None
    reason: str | None
    source: str  # "squeue" | "sacct" | "none"
    observed_at: float
    exit_code: str | None = None

    @property
    def finished(self) -> bool:
        words = (self.state or "").split()
        return bool(words) and words[0] in FINISHED_JOB_STATES

    @property
    def end_kind(self) -> str | None:
        return end_kind(self.state)


@dataclass(frozen=True)
class AccountingRecord:
    """One allocation of one of this deployment's jobs, from sacct. A hetjob gives one record per
    component (``job_id`` ``123+0``, ``123+1``); a requeued job gives one record per run."""

    job_id: str
    het_job_id: str | None
    het_offset: int | None
    tag: JobTag | None
    partition: str
    state: str
    gpus: int
    gpu_type: str | None
    cpus: int
    mem_gb: float
    nodes: int
    #: Slurm's billing TRES for this allocation (integer, as Slurm stores it); None if absent
    billing: float | None
    submit_time: float | None
    start_time: float | None
    #: None while running
    end_time: float | None
    #: seconds run; for a running job, up to ``observed_at``
    elapsed_s: int
    observed_at: float

    @property
    def gpu_seconds(self) -> int:
        return self.gpus * self.elapsed_s

    @property
    def end_kind(self) -> str | None:
        return end_kind(self.state)


@dataclass(frozen=True)
class JobShape:
    """A job shape to probe with ``sbatch --test-only`` (one component)."""

    partition: str
    gpus_per_node: int
    gpu_type: str | None = None
    nodes: int = 1
    cpus_per_gpu: int = DEFAULT_CPUS_PER_GPU
    mem_per_gpu_gb: int = DEFAULT_MEM_PER_GPU_GB
    time_limit_s: int = 3600
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None


@dataclass(frozen=True)
class StartEstimate:
    """What ``sbatch --test-only`` says about a shape: when and where it would start."""

    start: float
    nodes: tuple[str, ...]
    partition: str
    observed_at: float

    @property
    def wait_s(self) -> float:
        """Seconds from the probe until the expected start (0 when it would start now)."""
        return max(0.0, self.start - self.observed_at)


# --------------------------------------------------------------------------- from_dict helpers


def _build(cls: type, raw: dict[str, Any]) -> Any:
    """Construct a flat dataclass from a dict, turning lists back into tuples."""
    kwargs = {}
    for f in fields(cls):
        if f.name not in raw:
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue
            raise KeyError(f"{cls.__name__}.{f.name}")
        value = raw[f.name]
        kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def _build_partition(raw: dict[str, Any]) -> PartitionInfo:
    data = dict(raw)
    if data.get("qos_limits"):
        data["qos_limits"] = _build(Limits, data["qos_limits"])
    return _build(PartitionInfo, data)


def _build_job(raw: dict[str, Any]) -> JobInfo:
    data = dict(raw)
    data.pop("end_kind", None)
    tag = data.get("tag")
    data["tag"] = JobTag(**tag) if tag else None
    data["components"] = [_build(JobComponent, c) for c in data.get("components", [])]
    return _build(JobInfo, data)
