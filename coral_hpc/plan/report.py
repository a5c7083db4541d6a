"""The ``coral-hpc plan --json`` and ``--export-templates`` documents of a :class:`PlanOutcome`,
and the lines saying why no plan exists (``plan`` and ``serve`` exit 2 with them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coral_hpc.config import Deployment, field_line
from coral_hpc.demand import ModelDemand, demand_basis
from coral_hpc.plan.availability import start_label
from coral_hpc.plan.capacity import Shortfall
from coral_hpc.plan.figures import figures_used
from coral_hpc.plan.layout import layout_of
from coral_hpc.plan.planner import PlanOutcome, Solved


def _solved(outcome: PlanOutcome) -> Solved:
    if outcome.solved is None:
        raise ValueError("this outcome carries no solver objects (not made by Planner.solve)")
    return outcome.solved


def plan_json(outcome: PlanOutcome,
              demand: Mapping[str, ModelDemand] | None = None) -> dict[str, Any]:
    """The ``coral-hpc plan --json`` document (demand and throughput in requests/s of each
    model's mix; cost per hour in the deployment's unit). Each replica row's layout is the one
    ``serve`` would launch (:class:`~coral_hpc.types.ReplicaLayout`). With the request's
    ``demand`` each model also says its mean rate, the rate sized for and why."""
    solved = _solved(outcome)
    basis = demand_basis((demand or {}).values())
    plan = solved.plan
    return {
        "mode": plan.status,
        # the replicas that start within the horizon; the queued ones add queued_cost_per_hour
        # once Slurm starts them
        "cost_per_hour": plan.cost_per_hour,
        "queued_cost_per_hour": sum(r.count * r.cost_per_hour for r in plan.queued),
        "cost_unit": solved.unit,
        "solve_seconds": {"stage1": solved.stage1_s, "stage2": solved.stage2_s},
        # policy.solver: "highs", or "pyomo:<name>" (Stage 2 built through Pyomo)
        "solver": solved.solver,
        "gap": plan.gap if plan.gap != float("inf") else None,
        "models": [{"name": m.name, "demand": m.demand_rps, "served": plan.served[m.name],
                    "capacity": plan.capacity[m.name],
                    **({"mean_rps": basis[m.name]["mean_rps"],
                        "sized_rps": basis[m.name]["sized_rps"],
                        "planned_for": basis[m.name]["basis"]} if m.name in basis else {})}
                   for m in solved.models],
        "replicas": _replica_rows(solved),
        "binding": list(plan.binding),
        "checker_problems": list(outcome.problems),
        "warnings": list(solved.warnings),
    }


def _replica_rows(solved: Solved) -> list[dict[str, Any]]:
    """``plan --json``'s replica rows: those that start within the horizon, then the queued."""
    plan = solved.plan
    arch = {m.name: m.arch for m in solved.models}
    replicas = []
    for row, queued in [(r, False) for r in plan.rows] + [(r, True) for r in plan.queued]:
        layout = layout_of(row.template, row.partitions, arch[row.model])
        replicas.append({
            "model": row.model,
            "template": row.template.id,
            "partition": ",".join(dict.fromkeys(row.partitions)),
            "count": row.count,
            "throughput": row.throughput,
            "cost_per_hour": row.cost_per_hour,
            "tp": row.template.tp,
            "pp": row.template.pp,
            "layer_partition": layout.layer_partition,
            "dtype": layout.dtype,
            "role": layout.role,
            "calibrated": row.template.calibrated,
            "figures": figures_used(row.template, arch[row.model]),
            "stages": [{"gpu_type": s.gpu_type, "gpus": layout.tp, "layers": s.layers,
                        "partition": s.partition, "reservation": s.reservation}
                       for s in layout.stages],
            # Slurm may preempt it (a preemptible partition): the model has a replica elsewhere
            "preemptible": bool(set(row.partitions) & solved.cluster.preemptible()),
            "nodes": [list(n) for n in row.nodes],
            # Slurm's estimate when the replica starts: now, within the horizon, or queued;
            # queued without an estimate: start unknown (expected_wait_s null)
            "expected_wait_s": row.wait_s if row.start_known else None,
            "start": start_label(row.wait_s, queued, row.start_known),
            "start_known": row.start_known,
            "queued": queued,
        })
    return replicas


def templates_json(outcome: PlanOutcome) -> dict[str, Any]:
    """The Stage-1 library for ``--export-templates``: per template its model, GPUs used per
    configuration (GPU type and GPUs on one node → stages), throughput and price per partition
    where every stage could run, so anyone can re-solve Stage 2 independently."""
    solved = _solved(outcome)
    partitions = [p for p in solved.cluster.partitions if p.usable]
    out = []
    for model in solved.models:
        for t in solved.library.get(model.name, []):
            price = {}
            for p in partitions:
                costs = [p.stage_cost(s.gpu_type, t.tp) for s in t.stages]
                if all(c is not None for c in costs):
                    price[p.name] = sum(c for c in costs if c is not None)
            out.append({
                "id": t.id, "model": t.model, "tp": t.tp, "pp": t.pp,
                "usage": [{"gpu_type": g, "gpus": tp, "stages": n}
                          for (g, tp), n in sorted(t.usage().items())],
                "stages": [{"gpu_type": s.gpu_type, "layers": s.layers} for s in t.stages],
                "layer_partition": t.layer_partition,
                "throughput": t.throughput,
                "calibrated": t.calibrated,
                "price_per_hour": price,
            })
    return {"cost_unit": solved.unit,
            "models": [{"name": m.name, "demand": m.demand_rps, "architecture": m.arch}
                       for m in solved.models],
            "templates": out}


def infeasible_problems(path: str, deployment: Deployment, done: str = "nothing was submitted",
                        shortfalls: Sequence[Shortfall] = ()) -> list[str]:
    """Why no plan exists, as invalid input: only ``min_replicas`` is a hard demand on the
    cluster, so each model that sets it is named with its file, line and field — with the
    GPUs it needs and the cluster's total when the whole cluster could never hold it
    (``shortfalls``, :mod:`coral_hpc.plan.capacity`), else as not placeable now."""
    lines = []
    for shortfall in shortfalls:
        for index in shortfall.models:
            loc = ("models", index, "min_replicas")
            hint = ("name Slurm's partitions in cluster.partitions" if shortfall.no_partition
                    else "lower min_replicas or widen its partitions / gpu_types")
            lines.append(f"{path}:{field_line(path, loc)}: models[{index}].min_replicas: "
                         f"{shortfall.refusal(deployment, index)}; {hint}")
    if lines:
        return lines + [f"{path}: no feasible plan; {done}"]
    for index, model in enumerate(deployment.models):
        if model.min_replicas:
            loc = ("models", index, "min_replicas")
            lines.append(
                f"{path}:{field_line(path, loc)}: models[{index}].min_replicas: "
                f"{model.min_replicas} replica(s) of {model.name} cannot all be placed on the "
                "GPUs available now; lower min_replicas or widen its partitions / gpu_types"
            )
    if not lines:
        lines.append(f"{path}: no plan satisfies the deployment's quotas and limits")
    return lines + [f"{path}: no feasible plan; {done}"]
