"""Available GPUs on a busy cluster: what Slurm would give this deployment *soon*, and its rules.

ARCHITECTURE.md, "Available GPUs": idle GPUs and our own count now; GPUs Slurm's scheduler
expects to give a job of a shape within the horizon (``policy.max_queue_wait_s``) count with
their wait, which Stage 2 prices; beyond the horizon a model with nothing still gets a replica
queued where Slurm expects to start it first; site limits bind. This module turns the
snapshot's facts into those solver inputs, between ``coral_hpc.plan``'s cluster and Stage 2:

- :func:`type_untyped_nodes`: an untyped ``gpu:N`` node takes the one GPU type its configured
  partitions name; what stays untyped or unknown is a warning naming it;
- :func:`config_warnings`: configured partitions Slurm lacks or has down, partition MaxTime
  below the configured time limit (replicas there get the partition's limit);
- :func:`probe_shapes`: the job shapes the library could use, for ``sbatch --test-only``;
- :func:`with_estimates`: busy nodes Slurm would give us within the horizon become node groups
  with a wait; every estimate becomes a queue option;
- :func:`with_unknown_starts`: shapes Slurm gave no estimate for still become queue options,
  of unknown start, ranked after every known one (busy is not invalid input);
- :func:`job_limits` / :func:`environment_groups`: site limits and the partitions whose engine
  environments may serve one pipeline together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from coral_hpc.config import Deployment
from coral_hpc.plan.inputs import job_shape
from coral_hpc.plan.reservations import reservation_time_limit
from coral_hpc.slurm.snapshot import ClusterSnapshot, JobShape, ShapeEstimate
from coral_hpc.types import split_placement
from coral_solver.types import Cluster, JobLimits, NodeGroup, QueueOption, Quota, Template


def type_untyped_nodes(deployment: Deployment,
                       snapshot: ClusterSnapshot) -> tuple[ClusterSnapshot, list[str]]:
    """The snapshot with untyped ``gpu:N`` nodes typed from the configured partitions that hold
    them (their ``gpu_types`` must name exactly one type), and a warning for every GPU node
    the plan still cannot use."""
    configured = {p.name: p for p in deployment.cluster.partitions}
    nodes, warnings, untyped = [], [], []
    for node in snapshot.nodes:
        if node.gpus_total <= 0 or node.gpu_type is not None:
            nodes.append(node)
            continue
        mine = [configured[p] for p in node.partitions if p in configured]
        types = {t for p in mine for t in p.gpu_types}
        if len(types) == 1:
            nodes.append(replace(node, gpu_type=types.pop()))
            continue
        nodes.append(node)
        if mine:
            untyped.append(node.name)
    if untyped:
        warnings.append(
            f"node(s) {', '.join(untyped[:5])}{' and more' if len(untyped) > 5 else ''}: GRES "
            "is an untyped gpu:N and neither a node feature nor the partition's gpu_types names "
            "one GPU type: not planned; set cluster.partitions[].gpu_types or "
            "cluster.gpu_type_map (gpu: <type>)")
    return replace(snapshot, nodes=tuple(nodes)), list(snapshot.warnings) + warnings


def config_warnings(deployment: Deployment, snapshot: ClusterSnapshot) -> list[str]:
    """What the configuration asks that this Slurm cannot give, each naming the field."""
    out = []
    known = {p.name: p for p in snapshot.partitions}
    limit = deployment.cluster.time_limit_s
    for index, part in enumerate(deployment.cluster.partitions):
        info = known.get(part.name)
        where = f"cluster.partitions[{index}] ({part.name})"
        if info is None:
            out.append(f"{where}: Slurm has no partition {part.name!r}; valid: "
                       f"{', '.join(sorted(known)) or 'none'}")
            continue
        if info.state != "up":
            out.append(f"{where}: partition is {info.state} in Slurm: nothing starts there")
        if info.max_time_s is not None and info.max_time_s < limit:
            out.append(f"{where}: partition MaxTime {info.max_time_s // 60} min "
                       "< cluster.time_limit "
                       f"{limit // 60} min: replicas there run {info.max_time_s // 60} min and "
                       "are rotated before that")
        missing = [t for t in part.gpu_types if t not in info.gpu_types]
        if missing and info.gpu_types:
            out.append(f"{where}: gpu_types {missing} not on any node of the partition "
                       f"(Slurm has {list(info.gpu_types)})")
    return out


def preemptible_partitions(deployment: Deployment, snapshot: ClusterSnapshot) -> dict[str, str]:
    """Configured partitions whose jobs may be preempted → why, in words:

    - ``cluster.partitions[].preemptible: true`` (the site says so);
    - PreemptType=preempt/partition_prio as Slurm shows it: the partition's PreemptMode is not
      OFF and a partition of a higher PriorityTier shares a node with it (scontrol does not show
      PreemptType; on a preempt/qos site whose partitions differ in tier this reads as
      preemption too: set ``preemptible: false`` there to say it is not);
    - the partition's own QOS is in another QOS's Preempt list (preempt/qos).
    """
    known = {p.name: p for p in snapshot.partitions}
    preempted_by = snapshot.limits.qos_preempted_by if snapshot.limits else {}
    out = {}
    for index, part in enumerate(deployment.cluster.partitions):
        info = known.get(part.name)
        if part.preemptible is False:
            continue
        if part.preemptible:
            out[part.name] = f"cluster.partitions[{index}].preemptible"
            continue
        if info is None:
            continue
        if info.preempt_mode not in ("off", ""):
            nodes = set(info.nodes)
            above = sorted(q.name for q in snapshot.partitions
                           if q.priority_tier > info.priority_tier and nodes & set(q.nodes))
            if above:
                out[part.name] = (f"PreemptMode {info.preempt_mode.upper()}, PriorityTier "
                                  f"{info.priority_tier} below {', '.join(above)} on shared nodes")
                continue
        if info.qos and preempted_by.get(info.qos):
            out[part.name] = (f"partition QOS {info.qos} is preempted by QOS "
                              f"{', '.join(preempted_by[info.qos])}")
    return out


def with_preemption(deployment: Deployment, snapshot: ClusterSnapshot,
                    cluster: Cluster) -> tuple[Cluster, list[str]]:
    """``cluster`` with its preemptible partitions marked (Stage 2 then puts a model's
    replicas there only beside one that is not: never its only replica), and a warning per
    preemptible partition and for a job QOS others may preempt (every replica at risk: planned,
    the risk stated). A partition's placements in a reservation are not marked: only the
    reservation's jobs run on its nodes."""
    why = preemptible_partitions(deployment, snapshot)
    partitions = tuple(replace(p, preemptible=p.name in why) for p in cluster.partitions)
    return replace(cluster, partitions=partitions), preemption_warnings(deployment, snapshot)


def preemption_warnings(deployment: Deployment, snapshot: ClusterSnapshot) -> list[str]:
    """A line per preemptible partition (and why), and one when the deployment's own QOS is
    one another QOS may preempt."""
    warnings = [f"partition {name}: preemptible ({reason}): a model's replicas go there only "
                "beside one elsewhere; preempted ones are resubmitted" for name, reason in
                sorted(preemptible_partitions(deployment, snapshot).items())]
    limits = snapshot.limits
    if limits is not None and limits.qos and limits.qos_preempted_by.get(limits.qos):
        warnings.append(f"QOS {limits.qos} (this deployment's jobs) is preempted by QOS "
                        f"{', '.join(limits.qos_preempted_by[limits.qos])}: every replica may "
                        "be preempted (resubmitted when it is); set cluster.qos to one that "
                        "is not")
    return warnings


def time_limit_for(deployment: Deployment, snapshot: ClusterSnapshot | None,
                   partitions: Iterable[str]) -> int:
    """The replica job time limit: the configured one, clipped to the tightest MaxTime of the
    partitions the replica's stages run in (Slurm would refuse, or hold, a longer job), and to
    what is left of a reservation a stage runs in (``partition@reservation``)."""
    limit = deployment.cluster.time_limit_s
    if snapshot is None:
        return limit
    partitions = tuple(partitions)
    by_name = {p.name: p for p in snapshot.partitions}
    for name in partitions:
        info = by_name.get(split_placement(name)[0])
        if info is not None and info.max_time_s is not None:
            limit = min(limit, info.max_time_s)
    return reservation_time_limit(snapshot, partitions, limit)


def probe_shapes(deployment: Deployment, snapshot: ClusterSnapshot,
                 library: Mapping[str, list[Template]]) -> list[JobShape]:
    """One job shape per (partition, GPU type, TP, nodes) a homogeneous template of the library
    could be submitted as, smallest first (cheap to start, most likely to fit soon)."""
    cfg = deployment.cluster
    known = {p.name: p for p in snapshot.partitions}
    models = {m.name: m for m in deployment.models}
    wanted = set()
    for model, templates in library.items():
        config = models.get(model)
        for template in templates:
            if template.heterogeneous:
                continue
            gpu = template.stages[0].gpu_type
            for part in cfg.partitions:
                info = known.get(part.name)
                if info is None or info.state != "up" or gpu not in info.gpu_types:
                    continue
                if part.gpu_types and gpu not in part.gpu_types:
                    continue
                if config is not None and config.partitions and part.name not in config.partitions:
                    continue
                wanted.add((part.name, gpu, template.tp, template.pp))
    shape = job_shape(deployment, snapshot)
    shapes = []
    for partition, gpu, tp, nodes in sorted(wanted, key=lambda w: (w[3] * w[2], w[3], w[0], w[1])):
        limit = time_limit_for(deployment, snapshot, [partition])
        shapes.append(JobShape(partition=partition, gpus_per_node=tp, gpu_type=gpu, nodes=nodes,
                               cpus_per_gpu=shape.cpus_per_gpu, mem_per_gpu_gb=shape.mem_per_gpu_gb,
                               time_limit_s=limit, account=cfg.account, qos=cfg.qos))
    return shapes


def _wait_bucket(wait_s: float) -> float:
    """Waits to the minute (Slurm's estimates are not finer), so nodes group into few classes."""
    return float(math.ceil(wait_s / 60.0) * 60)


def own_queue_options(snapshot: ClusterSnapshot) -> list[QueueOption]:
    """Where our own replicas already wait: per PENDING job of one shape (not a hetjob) with
    Slurm's expected start (squeue --start), a queue option marked ``held``."""
    out = []
    for job in snapshot.jobs:
        if (job.state != "PENDING" or job.expected_start is None or job.components
                or not job.gpu_type):
            continue
        nodes = max(job.num_nodes, 1)
        out.append(QueueOption(job.partition, job.gpu_type, max(job.gpus // nodes, 1), nodes,
                               max(0.0, job.expected_start - snapshot.observed_at), held=True))
    return out


def with_estimates(cluster: Cluster, estimates: Iterable[ShapeEstimate],
                   horizon_s: float, held: Iterable[QueueOption] = ()) -> Cluster:
    """``cluster`` with Slurm's start estimates folded in.

    A node named by an estimate that starts within the horizon offers that shape's GPUs per
    node after that wait (when that is more than it offers now): it moves into a node group of
    its own kind with ``wait_s``. Every estimate Slurm answered becomes a queue option, and so
    does each shape a replica of ours already waits in (``held``, :func:`own_queue_options`)."""
    offer: dict[str, tuple[int, float]] = {}
    options = []
    for est in estimates:
        wait = est.wait_s
        if wait is None or est.gpu_type is None:
            continue
        options.append(QueueOption(est.partition, est.gpu_type, est.gpus_per_node, est.nodes,
                                   float(wait), tuple(est.node_names)))
        if wait > horizon_s or wait <= 0:
            continue
        for node in est.node_names:
            gpus, best_wait = offer.get(node, (0, math.inf))
            if est.gpus_per_node > gpus or (est.gpus_per_node == gpus and wait < best_wait):
                offer[node] = (est.gpus_per_node, _wait_bucket(wait))
    groups: list[NodeGroup] = []
    renamed: dict[str, list[str]] = {}
    for group in cluster.node_groups:
        keep_nodes, keep_free = [], []
        later: dict[tuple[int, float], list[str]] = {}
        for node, free in zip(group.nodes, group.free):
            gpus, wait = offer.get(node, (0, 0.0))
            if gpus > free:
                later.setdefault((min(gpus, group.gpus_per_node), wait), []).append(node)
            else:
                keep_nodes.append(node)
                keep_free.append(free)
        names = []
        if keep_nodes:
            groups.append(replace(group, nodes=tuple(keep_nodes), free=tuple(keep_free)))
            names.append(group.name)
        for (gpus, wait), nodes in sorted(later.items()):
            name = f"{group.name}-in{int(wait // 60)}m-{gpus}"
            groups.append(replace(group, name=name, nodes=tuple(nodes),
                                  free=(gpus,) * len(nodes), wait_s=wait))
            names.append(name)
        renamed[group.name] = names
    partitions = tuple(
        replace(p, node_groups=tuple(n for g in p.node_groups for n in renamed.get(g, [g])))
        for p in cluster.partitions)
    return replace(cluster, node_groups=tuple(groups), partitions=partitions,
                   queue_options=tuple(held) + tuple(options))


def with_unknown_starts(cluster: Cluster, shapes: Iterable[JobShape],
                        estimates: Iterable[ShapeEstimate] = ()) -> Cluster:
    """``cluster`` with a queue option of unknown start (``start_known`` False) for each job
    shape Slurm gave no estimate for (none saved, ``sbatch --test-only`` refused or
    rate-limited) and that the partition's nodes could hold were they free: a busy site
    without estimates still gets its replicas queued, after every shape with a known start.
    A shape Slurm refused among ``estimates`` that it answered for others (no node could run
    it, a limit forbids it) is not queued: sbatch would refuse it too."""
    known: set[tuple[str, str | None, int, int]] = {
        (q.partition, q.gpu_type, q.gpus_per_node, q.nodes) for q in cluster.queue_options}
    estimates = tuple(estimates)
    if any(e.start is not None for e in estimates):
        known |= {(e.partition, e.gpu_type, e.gpus_per_node, e.nodes) for e in estimates
                  if e.start is None and e.reservation is None}
    groups = {g.name: g for g in cluster.node_groups}
    options = []
    for shape in shapes:
        if shape.gpu_type is None:
            continue
        key = (shape.partition, shape.gpu_type, shape.gpus_per_node, shape.nodes)
        if key in known:
            continue
        part = next((p for p in cluster.partitions if p.name == shape.partition), None)
        if part is None or not part.usable:
            continue
        nodes = sum(len(groups[g].nodes) for g in part.node_groups if g in groups
                    and groups[g].gpu_type == shape.gpu_type
                    and groups[g].gpus_per_node >= shape.gpus_per_node)
        if nodes < shape.nodes:
            continue
        known.add(key)
        options.append(QueueOption(shape.partition, shape.gpu_type, shape.gpus_per_node,
                                   shape.nodes, wait_s=0.0, start_known=False))
    if not options:
        return cluster
    return replace(cluster, queue_options=cluster.queue_options + tuple(options))


def job_limits(deployment: Deployment, snapshot: ClusterSnapshot) -> JobLimits:
    """Per-job and jobs-at-once site limits: partition MaxNodes and its QOS's MaxTRES, the
    account's association/QOS MaxTRES, MaxJobs and MaxSubmit (with this user's other jobs)."""
    limits = snapshot.limits
    configured = {p.name for p in deployment.cluster.partitions}
    max_nodes, max_gpus = {}, {}
    for info in snapshot.partitions:
        if info.name not in configured:
            continue
        caps = [c for c in (info.max_nodes,
                            limits.max_nodes_per_job if limits else None,
                            info.qos_limits.max_nodes_per_job if info.qos_limits else None)
                if c is not None]
        if caps:
            max_nodes[info.name] = min(caps)
        if info.qos_limits is not None and info.qos_limits.max_gpus_per_job is not None:
            max_gpus[info.name] = info.qos_limits.max_gpus_per_job
    return JobLimits(
        max_gpus_per_job=limits.max_gpus_per_job if limits else None,
        max_gpus_per_job_by_type=dict(limits.max_gpus_per_job_by_type) if limits else {},
        max_nodes_by_partition=max_nodes,
        max_gpus_per_job_by_partition=max_gpus,
        max_jobs=limits.max_jobs if limits else None,
        max_submit=limits.max_submit_jobs if limits else None,
        other_jobs=other_jobs_counted(deployment, snapshot),
    )


def other_jobs_counted(deployment: Deployment, snapshot: ClusterSnapshot) -> int:
    """This user's live jobs, not this deployment's, that count against MaxJobs/MaxSubmit: with
    ``cluster.account`` set, those charged to that account (squeue's Account; the limits are
    the user's association in it, so jobs in the user's other accounts do not count), plus
    any whose account squeue did not say (counted, to be safe); without, all of them (they
    share the user's default association as far as coral-hpc can tell). Other users' jobs in
    the account are not seen (squeue is asked for this user only): a GrpJobs they fill is
    Slurm's to enforce (the job pends with AssocGrpJobsLimit)."""
    account = deployment.cluster.account
    by_account = snapshot.other_user_jobs_by_account
    if not account or not by_account:
        return snapshot.other_user_jobs
    return by_account.get(account, 0) + by_account.get("", 0)


def environment_groups(deployment: Deployment) -> tuple[tuple[str, ...], ...]:
    """See :meth:`coral_hpc.config.Deployment.environment_groups`."""
    return deployment.environment_groups()


def site_quotas(snapshot: ClusterSnapshot) -> list[Quota]:
    """Quotas from the partitions' own QOS (GrpTRES and MaxTRESPU, over that partition)."""
    out = []
    for info in snapshot.partitions:
        q = info.qos_limits
        if q is None:
            continue
        if q.grp_gpus is not None:
            out.append(Quota(f"partition {info.name} QOS {info.qos} GrpTRES/MaxTRESPU gres/gpu",
                             q.grp_gpus, partitions=(info.name,)))
        for gpu, cap in sorted(q.grp_gpus_by_type.items()):
            out.append(Quota(f"partition {info.name} QOS {info.qos} gres/gpu:{gpu}", cap,
                             partitions=(info.name,), gpu_types=(gpu,)))
    return out


def with_site_rules(deployment: Deployment, snapshot: ClusterSnapshot, cluster: Cluster) -> Cluster:
    """``cluster`` with the site's limits (per job, jobs at once, partition QOS quotas) and the
    engine-environment groups a pipeline must stay within."""
    return replace(cluster, job_limits=job_limits(deployment, snapshot),
                   quotas=cluster.quotas + tuple(site_quotas(snapshot)),
                   environment_groups=environment_groups(deployment))


def start_label(wait_s: float, queued: bool = False, start_known: bool = True) -> str:
    """``now``, ``expected in N min`` (within the horizon), ``queued`` (beyond it: submitted
    where Slurm expects to start it first; ``binding`` says where and when) or ``start
    unknown`` (queued where Slurm gave no start estimate) for a plan row."""
    if not start_known:
        return "start unknown"
    if queued:
        return "queued"
    if wait_s <= 0:
        return "now"
    return f"expected in {math.ceil(wait_s / 60)} min"


def environment_warnings(deployment: Deployment) -> list[str]:
    """``policy.heterogeneous`` on while no two partitions may serve one pipeline: say so, and
    how to get such pipelines (one environment, ``compatible_with``) or turn them off."""
    if not deployment.policy.heterogeneous or len(deployment.cluster.partitions) < 2:
        return []
    if any(len(group) > 1 for group in deployment.environment_groups()):
        return []
    return [("policy.heterogeneous: no two cluster.partitions share an engine environment, so "
             "no pipeline spans partitions; give them one environment both GPU generations run, "
             "declare compatible_with, or set heterogeneous: false (INSTALL.md, section 4)")]
