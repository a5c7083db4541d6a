"""A plan row's :class:`~coral_hpc.types.ReplicaLayout`: the one place a replica's layout, and
its vLLM dtype, are derived from the solver's template."""

from __future__ import annotations

from collections.abc import Sequence

from coral_hpc.types import ReplicaLayout, StageLayout, split_placement
from coral_solver import catalog, perf
from coral_solver.types import Template


def layout_dtype(arch: str, gpu_types: Sequence[str]) -> str:
    """vLLM ``--dtype`` for ``arch`` on these stages, from the solver's own rule
    (:func:`coral_solver.perf.engine_dtype`): ``half`` when any stage's GPU lacks bf16 (V100, T4:
    vLLM refuses bf16 there, and every stage of a pipeline must agree), else ``auto`` (the
    checkpoint's own dtype)."""
    model = catalog.model_arch(arch)
    for gpu in gpu_types:
        if perf.engine_dtype(model, catalog.gpu_spec(gpu)) == "half":
            return "half"
    return "auto"


def layout_of(template: Template, partitions: Sequence[str], arch: str,
              role: str | None = None) -> ReplicaLayout:
    """The layout of ``template`` with stage ``i`` on ``partitions[i]`` (a partition, or a
    placement ``partition@reservation``: that stage runs in the reservation); its role is the
    template's (prefill / decode for a disaggregated model) unless ``role`` says otherwise."""
    role = template.role if role is None else role
    if len(partitions) != len(template.stages):
        raise ValueError(f"{template.id}: {len(template.stages)} stages but partitions "
                         f"{list(partitions)}")
    stages = []
    for stage, placement in zip(template.stages, partitions):
        partition, reservation = split_placement(placement)
        stages.append(StageLayout(partition, stage.gpu_type, int(stage.layers), reservation))
    return ReplicaLayout(int(template.tp), tuple(stages),
                         layout_dtype(arch, [s.gpu_type for s in template.stages]), role)
