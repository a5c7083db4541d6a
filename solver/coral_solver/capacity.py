"""Whether replica minimums could ever be held on a cluster's GPUs: an LP bound.

A replica of template ``t`` holds, at once, ``g[t, T]`` GPUs of each GPU type ``T`` (``tp``
per stage on that type). Whatever is placed at once satisfies, for every type,
``Σ_t x_t · g[t, T] ≤ G_T`` over the GPUs ``G_T`` of that type, for each model over the GPUs
it may use and for all models over their union. The linear relaxation of these rows bounds
every real placement, so minimums it cannot meet could never be held. It ignores how GPUs
split over nodes (a stage needs ``tp`` GPUs of one node): sound, not tight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from coral_solver.allocate_highs import HighsSolver
from coral_solver.allocate_model import LinearModel
from coral_solver.types import Template

#: LP tolerance: an optimum within this of an integer counts as that integer
_EPS = 1e-6


def _gpus_of(template: Template, gpu: str) -> int:
    return template.stage_counts().get(gpu, 0) * template.tp


def _model(minimums: Mapping[str, int], templates: Mapping[str, Sequence[Template]],
           gpus: Mapping[str, Mapping[str, int]], union: Mapping[str, int],
           maximise: str | None) -> LinearModel:
    """Replicas per template (continuous), within each model's GPUs per type and the union's;
    either every minimum as a row, or minus ``maximise``'s replicas as the cost."""
    lm = LinearModel()
    columns: list[tuple[Template, int]] = []
    for model, need in minimums.items():
        usable = [t for t in templates.get(model, ())
                  if all(gpus[model].get(gpu, 0) > 0 for gpu in t.stage_counts())]
        cols = lm.add_vars(f"x[{model}]", [(t.id,) for t in usable], 0.0, math.inf,
                           integer=False, cost=-1.0 if model == maximise else 0.0)
        if maximise is None:
            (row,) = lm.add_rows(f"min[{model}]", [(model,)], float(need), math.inf)
            lm.add_terms(row, cols, 1.0)
        for gpu, total in gpus[model].items():
            (row,) = lm.add_rows(f"gpus[{model},{gpu}]", [(model, gpu)], -math.inf, float(total))
            for col, template in zip(cols, usable):
                if _gpus_of(template, gpu):
                    lm.add_terms(row, int(col), float(_gpus_of(template, gpu)))
        columns += [(template, int(col)) for col, template in zip(cols, usable)]
    for gpu, total in union.items():
        (row,) = lm.add_rows(f"gpus[{gpu}]", [(gpu,)], -math.inf, float(total))
        for template, col in columns:
            if _gpus_of(template, gpu):
                lm.add_terms(row, col, float(_gpus_of(template, gpu)))
    return lm


def most_replicas(templates: Sequence[Template], gpus: Mapping[str, int]) -> int:
    """At most this many replicas of these templates (one model) fit on ``gpus`` (GPUs per
    type) at once: the floor of the LP optimum (module docstring)."""
    lm = _model({"m": 0}, {"m": templates}, {"m": gpus}, {}, maximise="m")
    if lm.num_cols == 0:
        return 0
    result = HighsSolver(lm).solve(60.0, 0.0, relax=True)
    if result.x is None:
        return 0
    return int(math.floor(float(np.sum(result.x)) + _EPS))


def minimums_fit(minimums: Mapping[str, int], templates: Mapping[str, Sequence[Template]],
                 gpus: Mapping[str, Mapping[str, int]], union: Mapping[str, int]) -> bool:
    """Whether some LP point holds every model's minimum at once: ``gpus[model]`` are the GPUs
    per type that model may use, ``union`` those of all the models together."""
    lm = _model(minimums, templates, gpus, union, maximise=None)
    if lm.num_rows == 0:
        return True
    result = HighsSolver(lm).solve(60.0, 0.0, relax=True)
    return result.status != "infeasible"
