"""Plain input and output types of the planner (no ``coral_hpc`` here: it converts into these).

Units (../shared/ARCHITECTURE.md): demand and throughput are requests per second of the model's
own request mix; cost is per hour in the deployment's one unit (currency per GPU-hour prices, or
Slurm billing units); GPU memory in GB.

Inputs: :class:`ModelSpec` (with :class:`ObservedLengths`), :class:`NodeGroup`, :class:`Partition` (with :class:`Billing`),
:class:`Quota`, :class:`RunningReplica`, :class:`Policy`, bundled in :class:`Cluster`.
Outputs: :class:`Template` (Stage 1) and :class:`Plan` of :class:`PlanRow` (Stage 2).
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: A configuration: (GPU type, GPUs used on one node), e.g. ("a100", 4).
Config = tuple[str, int]

#: What a replica serves: both phases (aggregated), or only prefill or only decode
#: (disaggregated; vLLM's KV connector moves the prompt's KV cache from one to the other).
Role = Literal["both", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("both", "prefill", "decode")

#: Whether Stage 1/2 may split a model's phases: ``off`` aggregated only, ``on`` prefill and
#: decode replicas only, ``auto`` both kinds, Stage 2 picks the cheaper mix.
Disaggregation = Literal["auto", "on", "off"]


#: Observed (prompt, output) pairs a model carries at most (:class:`ObservedLengths`). Stage 1's
#: simulated capacity draws 700 pairs from them (``coral_solver.simcap``: WARMUP + COUNTED); the
#: 95 % Kolmogorov-Smirnov band of 2000 pairs around the trace's own distribution,
#: 1.36 / sqrt(2000) = 3 %, is narrower than that of those 700 draws (5 %): a larger sample
#: would change no figure much, and keeps cache keys and Stage-1 specs small (a statistical
#: choice, not a fitted one).
OBSERVED_PAIRS = 2000
#: Seed of the subsample of a longer trace: fixed, so the same trace gives the same sample, and
#: so the same Stage-1 cache key, on every read.
OBSERVED_SEED = 20261203


@dataclass(frozen=True)
class ObservedLengths:
    """A model's observed request lengths: (prompt tokens, output tokens) pairs of its requests
    as served (a trace's, or the lengths ``coral-hpc simulate`` replays), at most
    :data:`OBSERVED_PAIRS` of them, and where they came from (``source``, named in reports).

    Only Stage 1's simulated capacity reads them (``Policy.capacity`` ``simulated``:
    :meth:`coral_solver.throughput_model.PerfThroughput._lengths`); the analytic model reads
    the model's mean mix."""

    source: str
    pairs: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError(f"observed lengths ({self.source}): no requests")
        if len(self.pairs) > OBSERVED_PAIRS:
            raise ValueError(f"observed lengths ({self.source}): {len(self.pairs)} pairs, at "
                             f"most {OBSERVED_PAIRS} (ObservedLengths.bounded subsamples)")
        if min(min(p, o) for p, o in self.pairs) < 1:
            raise ValueError(f"observed lengths ({self.source}): every prompt and output must "
                             "be >= 1 token")

    @classmethod
    def bounded(cls, prompts: Sequence[int], outputs: Sequence[int],
                source: str) -> ObservedLengths:
        """The requests' (prompt, output) pairs, each at least 1 token: all of them when at
        most :data:`OBSERVED_PAIRS`, else that many drawn without replacement (fixed seed) and
        kept in the requests' order."""
        if len(prompts) != len(outputs):
            raise ValueError(f"observed lengths ({source}): {len(prompts)} prompts, "
                             f"{len(outputs)} outputs")
        n = len(prompts)
        picks: Sequence[int] = range(n)
        if n > OBSERVED_PAIRS:
            picks = sorted(random.Random(OBSERVED_SEED).sample(range(n), OBSERVED_PAIRS))
        return cls(source, tuple((max(1, int(prompts[i])), max(1, int(outputs[i])))
                                 for i in picks))

    def digest(self) -> str:
        """A hash of the pairs (not of ``source``: where a sample came from changes no figure):
        what the Stage-1 cache key holds of them."""
        return hashlib.sha256(repr(self.pairs).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ModelSpec:
    """One served model as the planner sees it."""

    name: str
    arch: str  #: key of the architecture in profiles (``coral_solver.catalog.model_arch``)
    input_tokens: int  #: mean input tokens of the mix
    output_tokens: int  #: mean output tokens of the mix
    ttft_s: float  #: SLO: time to first token
    tpot_s: float  #: SLO: time per output token
    demand_rps: float = 0.0  #: requests/s of this model's mix to serve
    priority: float = 1.0  #: weight of served demand when GPUs are scarce
    min_replicas: int = 0
    max_replicas: int | None = None
    gpu_types: tuple[str, ...] = ()  #: allowed GPU types; empty = all
    partitions: tuple[str, ...] = ()  #: allowed partitions; empty = all
    disaggregation: Disaggregation = "off"  #: see :data:`Disaggregation`
    #: tokens one request may hold (vLLM ``--max-model-len``); every stage's KV cache must hold
    #: them, or vLLM refuses to start. None: the model's own context, not checked
    max_model_len: int | None = None
    #: an embedding model served by vLLM's pooling runner: one forward pass per request, no
    #: decode. Its latency per request is ``ttft_s`` (the time to its only answer); ``tpot_s``
    #: and ``output_tokens`` are not read (coral_solver.perf_pooling)
    pooling: bool = False
    #: observed request lengths (a trace's): what Stage 1's simulated capacity draws lengths
    #: from; None: the mean mix with a stated distribution. The analytic model never reads them
    lengths: ObservedLengths | None = None

    def allows_gpu(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types

    def allows_partition(self, partition: str) -> bool:
        return not self.partitions or partition in self.partitions


@dataclass(frozen=True)
class NodeGroup:
    """Identical nodes (GPU type, GPUs per node, GPU memory) and what each has free for us.

    ``free[i]`` = idle GPUs + GPUs held by this deployment's own replicas on node ``nodes[i]``;
    0 for a node that is down, draining or reserved. A group with ``wait_s`` > 0 holds GPUs that
    are busy now but that Slurm expects to give a job of ours within the horizon, after that
    wait (its start estimate for that shape); Stage 2 prices the wait.
    """

    name: str
    gpu_type: str
    gpus_per_node: int
    gpu_memory_gb: float
    nodes: tuple[str, ...]
    free: tuple[int, ...]
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.free):
            raise ValueError(f"node group {self.name}: {len(self.nodes)} nodes, {len(self.free)} free counts")
        for node, count in zip(self.nodes, self.free):
            if not 0 <= count <= self.gpus_per_node:
                raise ValueError(f"node {node}: free {count} outside 0..{self.gpus_per_node}")


@dataclass(frozen=True)
class Billing:
    """Slurm's billing of a job shape: TRESBillingWeights and the per-GPU CPU/memory request.

    billing per hour of a stage with ``g`` GPUs of type ``t`` on one node =
    g × (cpu × cpus_per_gpu + mem_gb × mem_per_gpu_gb + gpu + gpu_by_type[t]) + node;
    with ``max_tres`` (PriorityFlags=MAX_TRES) the per-GPU sum becomes its largest term.
    Slurm counts a typed GPU request under both ``GRES/gpu`` and ``GRES/gpu:<type>``.
    """

    cpu: float = 0.0
    mem_gb: float = 0.0
    gpu: float = 0.0
    gpu_by_type: Mapping[str, float] = field(default_factory=dict)
    cpus_per_gpu: int = 4
    mem_per_gpu_gb: float = 32.0
    max_tres: bool = False
    node: float = 0.0  #: TRESBillingWeights Node=, charged once per node (one stage)

    def per_gpu_hour(self, gpu_type: str) -> float:
        """Billing units per hour for one GPU of ``gpu_type`` with its share of CPUs and memory."""
        terms = [
            self.cpu * self.cpus_per_gpu,
            self.mem_gb * self.mem_per_gpu_gb,
            self.gpu + self.gpu_by_type.get(gpu_type, 0.0),
        ]
        return max(terms) if self.max_tres else sum(terms)


@dataclass(frozen=True)
class Partition:
    """A Slurm partition: which node groups it holds, whether usable, and its price."""

    name: str
    node_groups: tuple[str, ...]
    usable: bool = True  #: False when the partition is down/drained/inactive
    prices: Mapping[str, float] | None = None  #: per GPU-hour per GPU type
    billing: Billing | None = None  #: or Slurm billing of the job shape
    #: jobs here may be preempted (a scavenger partition, a QOS others preempt): Stage 2 puts a
    #: model's replicas here only beside one of its replicas that is not (never its only one)
    preemptible: bool = False

    def gpu_hour_cost(self, gpu_type: str) -> float | None:
        """Cost per hour of one GPU of ``gpu_type`` here; None when not priced (not allowed)."""
        if self.billing is not None:
            return self.billing.per_gpu_hour(gpu_type)
        if self.prices is not None and gpu_type in self.prices:
            return float(self.prices[gpu_type])
        return None

    def stage_cost(self, gpu_type: str, gpus: int) -> float | None:
        """Cost per hour of one pipeline stage using ``gpus`` GPUs of ``gpu_type`` here."""
        unit = self.gpu_hour_cost(gpu_type)
        if unit is None:
            return None
        return unit * gpus + (self.billing.node if self.billing is not None else 0.0)


@dataclass(frozen=True)
class Quota:
    """At most ``max_gpus`` GPUs held over the matching partitions and GPU types.

    Expresses deployment quotas (per partition, per GPU type) and QOS/association GrpTRES GPU
    limits (already reduced by what others in the same QOS hold). Empty tuples match everything.
    """

    name: str
    max_gpus: int
    partitions: tuple[str, ...] = ()
    gpu_types: tuple[str, ...] = ()

    def matches(self, partition: str, gpu_type: str) -> bool:
        return (not self.partitions or partition in self.partitions) and (
            not self.gpu_types or gpu_type in self.gpu_types
        )


@dataclass(frozen=True)
class RunningReplica:
    """Replicas of this deployment already running: template id, partition per stage, count."""

    template_id: str
    partitions: tuple[str, ...]
    count: int = 1


@dataclass(frozen=True)
class QueueOption:
    """Slurm's estimate for one job shape: ``nodes`` nodes of ``gpus_per_node`` GPUs of
    ``gpu_type`` in ``partition`` would start after ``wait_s`` seconds."""

    partition: str
    gpu_type: str
    gpus_per_node: int
    nodes: int
    wait_s: float
    node_names: tuple[str, ...] = ()
    #: a replica of ours already waits in Slurm's queue with this shape (``wait_s`` is its own
    #: expected start): moving it loses its place, so another shape must be clearly sooner
    held: bool = False
    #: Slurm gave no estimate for this shape (none saved, ``sbatch --test-only`` refused or
    #: rate-limited): the job may queue here, but when it starts is unknown (``wait_s`` means
    #: nothing). A shape with a known start is always preferred to one without
    start_known: bool = True


@dataclass(frozen=True)
class JobLimits:
    """Site limits that bind each replica job or the number of them (None = no limit).

    A replica is one Slurm job (a heterogeneous one counts once), so MaxJobs caps replicas
    running and MaxSubmit caps replicas running or pending."""

    #: MaxTRES gres/gpu per job (association/QOS), and per GPU type
    max_gpus_per_job: int | None = None
    max_gpus_per_job_by_type: Mapping[str, int] = field(default_factory=dict)
    #: MaxNodes per job, per partition (partition MaxNodes, QOS MaxTRES node=)
    max_nodes_by_partition: Mapping[str, int] = field(default_factory=dict)
    #: MaxTRES gres/gpu per job of the partition's own QOS
    max_gpus_per_job_by_partition: Mapping[str, int] = field(default_factory=dict)
    #: MaxJobs (running at once) and MaxSubmit (running + pending), over the whole deployment
    max_jobs: int | None = None
    max_submit: int | None = None
    #: jobs of this user that count against those caps but are not this plan's replicas
    other_jobs: int = 0


@dataclass(frozen=True)
class Policy:
    """Planner knobs; every field has a default that suits a real cluster."""

    n_max: int = 6  #: Stage 1: nodes (pipeline stages) per template at most
    rho: float = 12.0  #: Stage 1: template GPU memory ≤ rho × model weights
    heterogeneous: bool = True  #: allow stages on different GPU types in one template
    max_tp: int = 8  #: largest tensor-parallel degree considered
    startup_penalty: float = 3.0  #: K = start-up time ÷ re-plan interval
    time_limit_s: float = 10.0  #: Stage 2 wall-clock limit per solve
    mip_gap: float = 1e-4  #: Stage 2 relative MIP gap
    prune: bool = True  #: Stage 2 exact LP reduced-cost column restriction (False = full model)
    #: a stage that starts after a wait of w seconds pays w ÷ this × its cost per hour on top
    #: (the same exchange rate as the start-up penalty K = start-up time ÷ re-plan interval)
    replan_interval_s: float = 60.0
    #: horizon: capacity Slurm expects to start within this counts as available
    max_queue_wait_s: float = 1800.0
    #: Stage 1 keeps only templates whose figure was measured (a single-stage profile that
    #: applies to the mix and SLO, or that exact pipeline measured): for an engine the analytic
    #: GPU model does not describe (vLLM's CPU build)
    measured_only: bool = False
    #: Stage 1: how a template's throughput is found. ``analytic``: per-stage figures of
    #: :mod:`coral_solver.perf` (TTFT and TPOT split evenly over the stages, Poisson tails),
    #: the bottleneck stage's; ``simulated``: the whole replica simulated
    #: (:mod:`coral_solver.simcap`): the highest Poisson rate at which ``slo_attainment`` of the
    #: model's requests meet TTFT and TPOT end to end (aggregated templates; prefill-only and
    #: decode-only ones stay analytic)
    capacity: Literal["analytic", "simulated"] = "analytic"
    #: the share of requests a template's rated throughput keeps within both objectives
    #: (``simulated`` capacity)
    slo_attainment: float = 0.95

    def __post_init__(self) -> None:
        if self.capacity not in ("analytic", "simulated"):
            raise ValueError(f"policy capacity {self.capacity!r}: expected 'analytic' or "
                             "'simulated'")
        if not 0.0 < self.slo_attainment <= 1.0:
            raise ValueError(f"policy slo_attainment {self.slo_attainment}: expected a share "
                             "in (0, 1]")


@dataclass(frozen=True)
class Cluster:
    """What Stage 2 may use this epoch."""

    node_groups: tuple[NodeGroup, ...]
    partitions: tuple[Partition, ...]
    quotas: tuple[Quota, ...] = ()
    running: tuple[RunningReplica, ...] = ()
    #: (template id, GPU type, partition): stages Stage 2 must not place there this epoch — a
    #: shape that sat pending past its timeout or that Slurm refused, kept out for a while
    excluded_stages: frozenset[tuple[str, str, str]] = frozenset()
    #: where Slurm expects to start a job of a shape, beyond what ``node_groups`` offer: a model
    #: with no replica in the plan gets its best one queued on the earliest of these
    queue_options: tuple[QueueOption, ...] = ()
    #: site limits per job and on jobs at once (partition MaxNodes/MaxTRES, QOS/association)
    job_limits: JobLimits = field(default_factory=lambda: JobLimits())
    #: partitions whose engine environments may serve one pipeline together (the same vLLM, or
    #: declared compatible); a multi-stage replica keeps all its stages inside one group.
    #: Empty = every partition is compatible with every other
    environment_groups: tuple[tuple[str, ...], ...] = ()

    #: GB/s the site's fabric carries for prefill→decode KV transfers in total (all
    #: disaggregated models together); None = not a limit (a non-blocking fabric, where each
    #: node's own link, priced in Stage 1, is what binds)
    kv_fabric_gbs: float | None = None

    def pipeline_groups(self) -> tuple[tuple[str, ...], ...]:
        """The partitions one multi-stage replica may spread over: the engine-environment
        groups (all partitions when none are given), each split into its preemptible and its
        other partitions when some are preemptible, so a replica is preemptible as a whole or
        not at all."""
        preemptible = {p.name for p in self.partitions if p.preemptible}
        if not preemptible:
            return self.environment_groups
        groups = self.environment_groups or (tuple(sorted(p.name for p in self.partitions)),)
        out = []
        for group in groups:
            for part in (tuple(p for p in group if p not in preemptible),
                         tuple(p for p in group if p in preemptible)):
                if part:
                    out.append(part)
        return tuple(out)

    def preemptible(self) -> frozenset[str]:
        """Names of the partitions whose jobs may be preempted."""
        return frozenset(p.name for p in self.partitions if p.preemptible)

    def node_group(self, name: str) -> NodeGroup:
        for group in self.node_groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def configurations(self) -> tuple[Config, ...]:
        """Every (GPU type, GPUs on one node) a stage could use, from the node sizes present."""
        out = set()
        for group in self.node_groups:
            for gpus in range(1, group.gpus_per_node + 1):
                out.add((group.gpu_type, gpus))
        return tuple(sorted(out))

    def gpu_types(self) -> dict[str, tuple[int, float]]:
        """GPU type → (largest GPUs per node, GPU memory GB) over the node groups."""
        out: dict[str, tuple[int, float]] = {}
        for group in self.node_groups:
            size, memory = out.get(group.gpu_type, (0, group.gpu_memory_gb))
            out[group.gpu_type] = (max(size, group.gpus_per_node), memory)
        return out


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Stage:
    """One pipeline stage of a template: a GPU type (TP GPUs on one node) and its layers."""

    gpu_type: str
    layers: int


@dataclass(frozen=True)
class Template:
    """A vLLM-runnable serving layout of one model (Stage 1 output).

    Pipeline stages in order, one tensor-parallel degree for all (vLLM requires it), each stage
    on one node; ``throughput`` in requests/s under the model's SLO and mix. A ``prefill``
    template's throughput is its prompt tokens/s under TTFT ÷ the mix's mean input tokens; a
    ``decode`` template's its output tokens/s under TPOT ÷ mean output tokens (ARCHITECTURE
    "Units"), so every role's throughput compares with the same requests/s of demand.
    ``kv_bytes_per_request``: KV bytes one request moves from prefill to decode (0 for ``both``).
    """

    model: str
    tp: int
    stages: tuple[Stage, ...]
    throughput: float
    calibrated: bool = True
    role: Role = "both"
    kv_bytes_per_request: float = 0.0

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @functools.cached_property
    def id(self) -> str:
        """Stable identifier, safe for Slurm job comments: ``model.tp2.a100-20.v100-12``; a
        disaggregated role is named after the model: ``model.prefill.tp2.a100-32``."""
        parts = ".".join(f"{s.gpu_type}-{s.layers}" for s in self.stages)
        role = "" if self.role == "both" else f"{self.role}."
        return f"{self.model}.{role}tp{self.tp}.{parts}"

    @property
    def layer_partition(self) -> str:
        """The value of ``VLLM_PP_LAYER_PARTITION`` (layers per stage, comma-separated)."""
        return ",".join(str(s.layers) for s in self.stages)

    @property
    def heterogeneous(self) -> bool:
        return len({s.gpu_type for s in self.stages}) > 1

    def usage(self) -> dict[Config, int]:
        """Stages per configuration (GPU type, TP GPUs on one node)."""
        out: dict[Config, int] = {}
        for stage in self.stages:
            key = (stage.gpu_type, self.tp)
            out[key] = out.get(key, 0) + 1
        return out

    def stage_counts(self) -> dict[str, int]:
        """Stages per GPU type."""
        out: dict[str, int] = {}
        for stage in self.stages:
            out[stage.gpu_type] = out.get(stage.gpu_type, 0) + 1
        return out


@dataclass(frozen=True)
class PlanRow:
    """``count`` replicas of one template, stage ``i`` in partition ``partitions[i]``.

    ``nodes`` suggests a placement: one tuple of node names (one per stage) per replica.
    """

    template: Template
    partitions: tuple[str, ...]
    count: int
    cost_per_hour: float  #: per replica
    nodes: tuple[tuple[str, ...], ...] = ()
    #: per replica (aligned with ``nodes``): seconds until Slurm expects to start it (0 = now)
    waits: tuple[float, ...] = ()
    #: False for a queued row Slurm gave no start estimate for (``waits`` then mean nothing)
    start_known: bool = True

    @property
    def wait_s(self) -> float:
        """The longest expected wait of the row's replicas (0 = all start now)."""
        return max(self.waits, default=0.0)

    @property
    def model(self) -> str:
        return self.template.model

    @property
    def throughput(self) -> float:
        """Per replica, requests/s."""
        return self.template.throughput

    @property
    def role(self) -> Role:
        """What these replicas serve: ``both``, ``prefill`` or ``decode``."""
        return self.template.role


@dataclass(frozen=True)
class Plan:
    """Stage 2 output: replicas per (template, partition of each stage) and what they achieve."""

    rows: tuple[PlanRow, ...]
    demand: Mapping[str, float]  #: requests/s asked per model
    served: Mapping[str, float]  #: requests/s planned per model: min(demand, capacity)
    capacity: Mapping[str, float]  #: requests/s the planned replicas sustain per model
    cost_per_hour: float
    status: str  #: "optimal", "feasible" (time limit), "scarce" (demand not met), "infeasible"
    gap: float  #: relative optimality gap proven for the last phase solved
    solve_seconds: float
    binding: tuple[str, ...] = ()  #: constraints at their limit, in words
    phases: Mapping[str, float] = field(default_factory=dict)  #: lexicographic phase optima
    #: replicas queued beyond the horizon (not counted in capacity, served or cost): for each
    #: model that got no replica, its best one where Slurm expects to start it first
    queued: tuple[PlanRow, ...] = ()

    def replicas(self, model: str | None = None) -> int:
        return sum(r.count for r in self.rows if model is None or r.model == model)


def served_capacity(rows) -> dict[str, float]:
    """Requests/s the rows sustain per model: aggregated replicas plus, for disaggregated ones,
    the lesser of the prefill and the decode capacity (a request needs one of each)."""
    by_role: dict[str, dict[str, float]] = {}
    for row in rows:
        roles = by_role.setdefault(row.model, {"both": 0.0, "prefill": 0.0, "decode": 0.0})
        roles[row.role] += row.count * row.throughput
    return {m: r["both"] + min(r["prefill"], r["decode"]) for m, r in by_role.items()}

