"""Queue like a person would: a model that got no replica still gets its best one queued.

On a busy cluster nothing may start within the horizon (``policy.max_queue_wait_s``), so Stage 2
places nothing for some models. A person would still submit one job where the scheduler says it
will start first; :func:`queue_unplaced` does the same from Slurm's start estimates per job
shape (``Cluster.queue_options``): for each model with no replica in the plan and something to
serve (demand or ``min_replicas``), the template and shape with the earliest expected start,
then the least cost per request served. A queued replica is one Slurm job of one homogeneous
shape (``pp`` nodes of ``tp`` GPUs of one type in one partition): exactly the shape Slurm
estimated. Queued replicas hold nothing yet, so they count in neither capacity nor cost, but
they do count against quotas and MaxSubmit, which bind pending jobs too.

Without an estimate (none saved, ``sbatch --test-only`` refused or rate-limited) a person would
still queue: shapes the site could run but Slurm gave no start for are queue options with
``start_known`` False. They rank after every shape with a known start, then by cost per
request served; the queued row says ``start_known`` False ("start unknown").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from coral_solver.allocate_model import job_cap
from coral_solver.types import Cluster, ModelSpec, Plan, PlanRow, QueueOption, Template

#: a queued replica of ours moves to another shape only when that one is expected to start at
#: least this much sooner: Slurm's estimates move by minutes as jobs end early, and a job that
#: moves starts again at the back of the queue (its priority's age factor restarts)
MOVE_MARGIN_S = 300.0


def _fits(option: QueueOption, template: Template, model: ModelSpec, cluster: Cluster) -> bool:
    gpu = template.stages[0].gpu_type
    if template.heterogeneous or option.gpu_type != gpu or option.gpus_per_node != template.tp:
        return False
    if template.role != "both":
        return False  # a prefill- or decode-only replica alone serves no request
    if option.nodes != template.pp:
        return False
    if not model.allows_partition(option.partition) or not model.allows_gpu(gpu):
        return False
    if (template.id, gpu, option.partition) in cluster.excluded_stages:
        return False
    if option.partition in cluster.preemptible():
        return False  # a queued replica is the model's only one: never a preemptible one
    cap = cluster.job_limits.max_nodes_by_partition.get(option.partition)
    return cap is None or template.pp <= cap


def _cost(cluster: Cluster, partition: str, template: Template) -> float | None:
    for part in cluster.partitions:
        if part.name == partition and part.usable:
            costs = [part.stage_cost(s.gpu_type, template.tp) for s in template.stages]
            known = [c for c in costs if c is not None]
            return None if len(known) < len(costs) else float(sum(known))
    return None


def queue_unplaced(plan: Plan, models: list[ModelSpec], library: dict[str, list[Template]],
                   cluster: Cluster) -> Plan:
    """``plan`` with one queued replica per model that has none and needs one (see the module
    docstring); unchanged when every model has a replica or Slurm gave no estimate."""
    if not cluster.queue_options:
        return plan
    placed: Counter[str] = Counter()
    for row in plan.rows:
        placed[row.model] += row.count      # replicas, not rows: a row may start several
    quota_use: Counter[str] = Counter()
    for row in plan.rows:
        for stage, p in zip(row.template.stages, row.partitions):
            for quota in cluster.quotas:
                if quota.matches(p, stage.gpu_type):
                    quota_use[quota.name] += row.count * row.template.tp
    cap = job_cap(cluster.job_limits)
    jobs = plan.replicas()
    # nodes this plan already gives to other replicas: an estimate for them no longer holds
    planned_nodes = {n for row in plan.rows for placed in row.nodes for n in placed}
    queued: list[PlanRow] = []
    notes: list[str] = []
    for model in sorted(models, key=lambda m: (-m.priority, m.name)):
        # one replica for a model with none that has something to serve, and as many as
        # min_replicas asks beyond what the plan starts
        wanted = max(model.min_replicas - placed[model.name],
                     1 if not placed[model.name] and model.demand_rps > 0 else 0)
        if model.max_replicas is not None:
            wanted = min(wanted, model.max_replicas - placed[model.name])
        if wanted <= 0:
            continue
        best = _best_queue_choice(model, library.get(model.name, []), cluster, quota_use,
                                  planned_nodes)
        if best is None:
            notes.append(f"model {model.name}: nothing to queue (no Slurm estimate for a shape "
                         "of its templates)")
            continue
        if cap is not None and jobs + wanted > cap:
            wanted = cap - jobs
            if wanted <= 0:
                notes.append(f"model {model.name}: not queued, MaxJobs/MaxSubmit reached")
                continue
        key, template, option, cost = best
        gpu = template.stages[0].gpu_type
        for quota in cluster.quotas:
            if quota.matches(option.partition, gpu):
                quota_use[quota.name] += template.gpus * wanted
        jobs += wanted
        nodes = tuple(option.node_names[:template.pp]) if len(option.node_names) >= template.pp \
            else ("?",) * template.pp
        wait = float(option.wait_s) if option.start_known else 0.0
        queued.append(PlanRow(template, (option.partition,) * template.pp, wanted, cost,
                              (nodes,) * wanted, (wait,) * wanted,
                              start_known=option.start_known))
        notes.append(_queued_note(model.name, wanted, option, contended=key[1]))
    if not queued and not notes:
        return plan
    return replace(plan, queued=plan.queued + tuple(queued), binding=plan.binding + tuple(notes))


def _best_queue_choice(model: ModelSpec, templates: list[Template], cluster: Cluster,
                       quota_use: Counter[str], planned_nodes: set[str]
                       ) -> tuple[tuple, Template, QueueOption, float] | None:
    """The (sort key, template, queue option, cost per hour) to queue ``model`` with, or None
    when no template's shape has an option that fits, is priced and stays within the quotas."""
    best = None
    for template in templates:
        for option in cluster.queue_options:
            if not _fits(option, template, model, cluster):
                continue
            cost = _cost(cluster, option.partition, template)
            if cost is None:
                continue
            gpu = template.stages[0].gpu_type
            over = [q for q in cluster.quotas if q.matches(option.partition, gpu)
                    and quota_use[q.name] + template.gpus > q.max_gpus]
            if over:
                continue
            served = min(template.throughput, model.demand_rps) or template.throughput
            contended = bool(planned_nodes & set(option.node_names))
            # an estimate on nodes the plan gives others last; then the earliest start (to
            # the minute: estimates are not finer), the cheapest per request served, the
            # larger replica
            wait = option.wait_s - (MOVE_MARGIN_S if option.held else 0.0)
            minutes = round(wait / 60.0) if option.start_known else 0
            key = (not option.start_known, contended, minutes, not option.held,
                   cost / served, -template.throughput, template.id)
            if best is None or key < best[0]:
                best = (key, template, option, cost)
    return best


def _queued_note(model: str, wanted: int, option: QueueOption, contended: bool) -> str:
    """Why ``model`` is queued on ``option`` and when Slurm expects it to start."""
    if not option.start_known:
        return (f"model {model}: nothing starts now and Slurm gave no start estimate for its "
                f"shapes; {wanted} replica(s) queued on {option.partition}, start unknown")
    if contended:
        when = (f"after this plan's replicas on {', '.join(option.node_names)} (Slurm's "
                f"estimate before them: {option.wait_s / 60:.0f} min)")
    else:
        when = f"expected in {option.wait_s / 60:.0f} min"
    return (f"model {model}: nothing starts within the horizon; {wanted} replica(s) queued on "
            f"{option.partition}, {when}")
