"""Deployment + ClusterSnapshot (+ demand) → the solver's inputs.

- :func:`model_specs`: configured models with the demand (requests/s of their mix) to plan for;
- :func:`running_of`, :func:`held_gpus`: the replicas that go on serving (the start-up penalty
  keeps them) and the GPUs per node their RUNNING jobs hold (which count as available:
  otherwise every epoch would churn) — one rule for ``serve`` and ``coral-hpc plan``;
- :func:`cluster_from_snapshot`: node groups with available GPUs per node (free + held, 0 on
  nodes that are down or draining), the configured partitions Slurm knows with their prices (per
  GPU-hour, or Slurm billing of the replica job shape: GPUs, ``cpus_per_gpu`` × GPUs CPUs,
  ``mem_per_gpu_gb`` × GPUs memory, per hour with the partition's TRESBillingWeights),
  deployment quotas and the account's QOS/association GPU limits, and the running replicas;
- :func:`job_shape`, :func:`fit_job_shape`, :func:`placeable`: what Slurm can actually start
  (every node packed by free GPUs, CPUs and memory with the shape the replica jobs ask);
- :func:`without_templates`, :func:`excluded_stages`: exclusions (cool-downs, refused shapes);
- :func:`policy_of`: the solver policy (K = start-up time ÷ re-plan interval).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from coral_hpc.config import Deployment
from coral_hpc.site_prices import partition_prices
from coral_hpc.slurm.job_shape import ReplicaShape, replica_shape
from coral_hpc.slurm.snapshot import ClusterSnapshot, JobInfo
from coral_hpc.types import placement_name
from coral_solver.catalog import gpu_memory_gb
from coral_solver.types import (
    Billing,
    Cluster,
    ModelSpec,
    NodeGroup,
    ObservedLengths,
    Policy,
    Quota,
    RunningReplica,
    Template,
)
from coral_solver.types import Partition as SolverPartition


def model_specs(deployment: Deployment, demand_rps: Mapping[str, float] | None = None,
                mix: Mapping[str, tuple[int, int]] | None = None) -> list[ModelSpec]:
    """One :class:`ModelSpec` per configured model. Demand: ``demand_rps[name]`` when given, else
    the declared demand (0 for ``demand: auto`` until it is measured); mix likewise; observed
    lengths when the model has them (:func:`observed_lengths`)."""
    out = []
    for m in deployment.models:
        rps = (demand_rps or {}).get(m.name, m.demand_rps)
        inp, outp = (mix or {}).get(m.name, (m.mix.input_tokens, m.mix.output_tokens))
        out.append(ModelSpec(
            name=m.name, arch=m.arch_key, input_tokens=inp, output_tokens=outp,
            # an embedding model's latency per request is its time to first (and only) answer
            ttft_s=m.slo.first_answer_s, tpot_s=m.slo.per_token_s, demand_rps=float(rps or 0.0),
            priority=m.priority, min_replicas=m.min_replicas, max_replicas=m.max_replicas,
            gpu_types=tuple(m.gpu_types), partitions=tuple(m.partitions),
            # one forward pass per request: no phases to split
            disaggregation="off" if m.embedding else deployment.policy.disaggregation,
            max_model_len=m.max_model_len, pooling=m.embedding,
            lengths=observed_lengths(deployment, m.name),
        ))
    return out


def observed_lengths(deployment: Deployment, name: str) -> ObservedLengths | None:
    """Model ``name``'s observed request lengths (``models[].lengths``, or what ``coral-hpc
    simulate`` replays), put on the deployment by :mod:`coral_hpc.model_lengths`; None
    without."""
    found = deployment._lengths.get(name)
    return found if isinstance(found, ObservedLengths) else None


def billing_of(weights: Mapping[str, float], cpus_per_gpu: int, mem_per_gpu_gb: float) -> Billing:
    """A partition's TRESBillingWeights (lower-case keys, ``mem`` per GB) as the solver's billing
    of a replica stage's job shape. With no weights at all Slurm bills the CPU count."""
    if not weights:
        return Billing(cpu=1.0, cpus_per_gpu=cpus_per_gpu, mem_per_gpu_gb=float(mem_per_gpu_gb))
    by_type = {key.split(":", 1)[1]: value for key, value in weights.items()
               if key.startswith("gres/gpu:")}
    return Billing(cpu=weights.get("cpu", 0.0), mem_gb=weights.get("mem", 0.0),
                   gpu=weights.get("gres/gpu", 0.0), gpu_by_type=by_type,
                   node=weights.get("node", 0.0),
                   cpus_per_gpu=cpus_per_gpu, mem_per_gpu_gb=float(mem_per_gpu_gb))


def _billing(weights: Mapping[str, float], shape: ReplicaShape) -> Billing:
    return billing_of(weights, shape.cpus_per_gpu, shape.mem_per_gpu_gb)


#: (template id, partition of each stage) of one replica
ReplicaKey = tuple[str, tuple[str, ...]]


def job_partitions(job: JobInfo) -> tuple[str, ...]:
    """Where each stage of one of our jobs runs: a hetjob's components, or one per node of a
    homogeneous job (one stage per node); ``partition@reservation`` for one in a reservation
    (:func:`coral_hpc.types.placement_name`), as the replica's layout names it."""
    if job.components:
        return tuple(placement_name(c.partition, c.reservation) for c in job.components)
    return (placement_name(job.partition, job.reservation),) * max(job.num_nodes, 1)


def running_of(snapshot: ClusterSnapshot) -> tuple[ReplicaKey, ...]:
    """The replicas that go on serving as far as a snapshot alone tells (``coral-hpc plan``):
    this deployment's tagged jobs that run or wait to run. ``serve`` knows more (walltime,
    health, pending timeouts) and passes its own list."""
    return tuple(sorted((job.tag.template_id, job_partitions(job)) for job in snapshot.jobs
                        if job.tag is not None and job.tag.template_id
                        and job.state in ("RUNNING", "PENDING")))


def running_replicas(running: tuple[ReplicaKey, ...]) -> tuple[RunningReplica, ...]:
    """``running`` counted per (template, partitions), as the solver takes it."""
    counts = Counter(running)
    return tuple(RunningReplica(template_id, tuple(partitions), count)
                 for (template_id, partitions), count in sorted(counts.items()))


def held_gpus(snapshot: ClusterSnapshot, running: tuple[ReplicaKey, ...]) -> dict[str, int]:
    """GPUs per node held by the RUNNING jobs of the replicas that go on serving: per (template,
    partitions), as many jobs as ``running`` lists, oldest first. A replica being replaced keeps
    its GPUs until its successor is READY, so they must not be planned for the successor."""
    wanted = Counter(running)
    held: Counter = Counter()
    jobs = sorted((j for j in snapshot.jobs if j.tag is not None and j.state == "RUNNING"),
                  key=lambda j: (j.start_time or 0.0, j.job_id))
    for job in jobs:
        assert job.tag is not None
        parts = job_partitions(job)
        key = (job.tag.template_id, parts)
        if wanted[key] <= 0:
            # a record may name a homogeneous job's partitions another way round
            key = next((k for k in wanted if k[0] == job.tag.template_id and wanted[k] > 0
                        and set(k[1]) == set(parts)), key)
        if wanted[key] <= 0:
            continue
        wanted[key] -= 1
        for component in job.components or (job,):
            nodes = component.nodes
            for node in nodes:
                held[node] += component.gpus // max(len(nodes), 1)
    return dict(held)


def cluster_from_snapshot(deployment: Deployment, snapshot: ClusterSnapshot,
                          running: tuple[RunningReplica, ...] | None = None,
                          held: Mapping[str, int] | None = None) -> Cluster:
    """The Stage-2 cluster over the deployment's partitions (see the module docstring).

    Nodes are grouped by (GPU type, GPUs per node, GPU memory, configured partitions holding them),
    so each solver node group is one set of interchangeable nodes and each node appears once."""
    if running is None or held is None:
        keys = running_of(snapshot)
        running, held = running_replicas(keys), held_gpus(snapshot, keys)
    configured = {p.name: p for p in deployment.cluster.partitions}
    slurm_parts = {p.name: p for p in snapshot.partitions}
    groups: dict[tuple, list[tuple[str, int]]] = {}
    for node in snapshot.nodes:
        if not node.gpu_type or node.gpus_total <= 0:
            continue
        parts = tuple(sorted(
            p for p in node.partitions if p in configured and p in slurm_parts
            and (not configured[p].gpu_types or node.gpu_type in configured[p].gpu_types)))
        if not parts:
            continue
        memory = node.gpu_memory_gb or gpu_memory_gb(node.gpu_type) or 0.0
        free = node.gpus_free + held.get(node.name, 0) if node.usable else 0
        key = (node.gpu_type, node.gpus_total, float(memory), parts)
        groups.setdefault(key, []).append((node.name, max(0, min(free, node.gpus_total))))
    node_groups: list[NodeGroup] = []
    members: dict[str, list[str]] = {}
    for i, ((gpu, size, memory, parts), nodes) in enumerate(sorted(groups.items())):
        name = f"{gpu}-{size}x{memory:g}g-{i}"
        node_groups.append(NodeGroup(name, gpu, size, memory, tuple(n for n, _ in nodes),
                                     tuple(f for _, f in nodes)))
        for p in parts:
            members.setdefault(p, []).append(name)
    cfg = deployment.cluster
    shape = job_shape(deployment, snapshot)
    partitions = []
    for name, part in configured.items():
        info = slurm_parts.get(name)
        if info is None:
            continue  # configured but unknown to Slurm: nothing can run there
        partitions.append(SolverPartition(
            name=name,
            node_groups=tuple(members.get(name, ())),
            usable=info.state == "up",
            prices=partition_prices(deployment, part),
            billing=_billing(info.billing_weights, shape) if part.price == "billing" else None,
        ))
    quotas = [Quota(f"gpu_quotas[{gpu}]", limit, gpu_types=(gpu,))
              for gpu, limit in sorted(cfg.gpu_quotas.items())]
    quotas += [Quota(f"partition {p.name} max_gpus", p.max_gpus, partitions=(p.name,))
               for p in cfg.partitions if p.max_gpus is not None]
    limits = snapshot.limits
    if limits is not None:
        if limits.grp_gpus is not None:
            quotas.append(Quota("GrpTRES=gres/gpu", limits.grp_gpus))
        quotas += [Quota(f"GrpTRES=gres/gpu:{gpu}", limit, gpu_types=(gpu,))
                   for gpu, limit in sorted(limits.grp_gpus_by_type.items())]
    return Cluster(tuple(node_groups), tuple(partitions), tuple(quotas), tuple(running),
                   kv_fabric_gbs=deployment.policy.kv_fabric_gbs)



# --------------------------------------------------------------------------- what Slurm can start

def job_shape(deployment: Deployment, snapshot: ClusterSnapshot) -> ReplicaShape:
    """The per-GPU CPUs and memory every replica job of the deployment asks
    (:func:`replica_shape` over the configured partitions Slurm knows). One shape for every
    stage and partition: packing, billing, ``sbatch --test-only`` probes and the jobs themselves
    then use the same numbers, wherever a stage lands."""
    configured = {p.name for p in deployment.cluster.partitions}
    return replica_shape(deployment.cluster,
                         [p for p in snapshot.partitions if p.name in configured])


def fit_job_shape(cluster: Cluster, snapshot: ClusterSnapshot, held: Mapping[str, int],
                  shape: ReplicaShape) -> Cluster:
    """Available GPUs per node capped by the CPUs and memory a replica asks per GPU.

    A stage with ``g`` GPUs asks ``g × cpus_per_gpu`` CPUs and ``g × mem_per_gpu_gb`` memory
    (``shape``: :func:`job_shape`, the numbers the job's sbatch asks), so a node takes

        min(GPUs available, ⌊CPUs free / cpus_per_gpu⌋, ⌊memory free / mem_per_gpu_gb⌋)

    GPUs of stages, in any mix of sizes (both sides are linear in GPUs). CPUs free are CPUs
    (CPUEfctv) less CPUAlloc, memory free is RealMemory less MemSpecLimit and AllocMem, as Slurm
    counts them; a node whose memory is all held starts nothing, however many GPUs it has idle
    (issue 27: a successor planned beside our own 70B replica, whose job held the node's memory,
    pended until its pending timeout). What our serving replicas hold (``held``: their GPUs,
    :func:`held_gpus`) comes back with the CPUs and memory their jobs asked for those GPUs, the
    rule for their GPUs. The checker (``coral_solver.check``) holds the plan to these counts."""
    nodes = {n.name: n for n in snapshot.nodes}
    groups = []
    for group in cluster.node_groups:
        free = []
        for name, gpus in zip(group.nodes, group.free):
            node = nodes.get(name)
            if node is None or gpus <= 0:
                free.append(gpus)
                continue
            back = held.get(name, 0)
            cpus = node.cpus - node.cpus_alloc + back * shape.cpus_per_gpu
            mem = node.mem_gb - node.mem_alloc_gb + back * shape.mem_per_gpu_gb
            if group.wait_s > 0:
                # GPUs given later (a reservation that has not started): what runs there now
                # is gone by then, so the node's whole CPUs and memory bound the stages
                cpus, mem = node.cpus, node.mem_gb
            fit = min(gpus, int(cpus // shape.cpus_per_gpu),
                      int(mem // shape.mem_per_gpu_gb + 1e-9))
            free.append(max(0, min(fit, group.gpus_per_node)))
        groups.append(replace(group, free=tuple(free)))
    return replace(cluster, node_groups=tuple(groups))



def without_templates(library: dict[str, list[Template]],
                      excluded: frozenset[str]) -> dict[str, list[Template]]:
    """The library less the templates on cool-down."""
    return {model: [t for t in templates if t.id not in excluded]
            for model, templates in library.items()}



def placeable(library: dict[str, list[Template]], cluster: Cluster) -> dict[str, list[Template]]:
    """The templates whose stages can each get a node of their own this epoch.

    A replica runs one stage per node: submitit asks for ``pp`` nodes, and Slurm's backfill
    scheduler starts a heterogeneous job only when it can give each component a different node
    (Slurm's heterogeneous_jobs page, "Limitations"). Stage 2 packs GPUs per node and may put two
    stages of one replica on one node; a template with more stages of a GPU type than there are
    nodes of that type with room for one stage (``tp`` free GPUs) would then never start."""
    nodes_with_room: dict[tuple[str, int], int] = {}
    for group in cluster.node_groups:
        for tp in range(1, group.gpus_per_node + 1):
            key = (group.gpu_type, tp)
            nodes_with_room[key] = nodes_with_room.get(key, 0) + sum(
                1 for free in group.free if free >= tp)
    return {
        model: [t for t in templates
                if all(count <= nodes_with_room.get((gpu, t.tp), 0)
                       for gpu, count in t.stage_counts().items())]
        for model, templates in library.items()
    }



def excluded_stages(library: dict[str, list[Template]],
                    shapes: frozenset[tuple[str, tuple[str, ...]]]) -> frozenset:
    """(template id, GPU type, partition) for every stage of every excluded shape. Stage 2 routes
    stages to partitions per (template, GPU type), so a shape is kept out stage by stage."""
    by_id = {t.id: t for templates in library.values() for t in templates}
    out = set()
    for template_id, partitions in shapes:
        template = by_id.get(template_id)
        if template is None:
            continue  # no longer in the library (cooled down, or an old cache): nothing to keep out
        for stage, partition in zip(template.stages, partitions):
            out.add((template_id, stage.gpu_type, partition))
    return frozenset(out)


def policy_of(deployment: Deployment, startup_s: float | None = None) -> Policy:
    """The solver policy from ``policy:`` (K = start-up time ÷ re-plan interval)."""
    p = deployment.policy
    startup = p.startup_time_s if startup_s is None else startup_s
    return Policy(n_max=p.n_max, rho=p.rho, heterogeneous=p.heterogeneous,
                  startup_penalty=startup / p.replan_interval_s,
                  time_limit_s=p.solver_time_limit_s, mip_gap=p.solver_mip_gap,
                  replan_interval_s=p.replan_interval_s, max_queue_wait_s=p.max_queue_wait_s,
                  max_tp=p.max_tp, measured_only=p.measured_only, capacity=p.capacity,
                  slo_attainment=p.slo_attainment)
