"""The paper evaluation's parts (bench/paper_eval): regions stay apart, availability follows the
reference plan."""

from __future__ import annotations

from bench.paper_eval import setups
from bench.paper_eval.evaluate import (
    RegionalThroughput,
    availability,
    cluster_for,
    library_for,
    model_specs,
)
from coral_solver.types import Policy


class _Load:
    def __init__(self, mix):
        self._mix = mix

    def mean_mix(self):
        return self._mix


def test_no_template_spans_two_regions():
    setup = setups.SETUPS[0]
    loads = {m: _Load((512, 128)) for m in setup.setting.models}
    models = model_specs(setup, loads, {m: 1.0 for m in loads})[:1]
    library = library_for(models, setup, Policy(n_max=3), RegionalThroughput())
    templates = [t for ts in library.values() for t in ts]
    assert any(t.heterogeneous for t in templates) and any(t.pp > 1 for t in templates)
    for t in templates:
        assert len({s.gpu_type.split("@")[1] for s in t.stages}) == 1, t.id
    assert {s.gpu_type.split("@")[1] for t in templates for s in t.stages} == set(setups.REGIONS)


def test_availability_is_the_reference_plans_use_plus_margin_and_a_node_per_type():
    setup = setups.SETUPS[1]  # core / default / scarce: 25 % above
    loads = {m: _Load((512, 128)) for m in setup.setting.models}
    models = model_specs(setup, loads, {m: 2.0 for m in loads})
    library = library_for(models, setup, Policy(n_max=2), RegionalThroughput())
    unlimited = cluster_for(
        setup, {f"{g}@{r}": 64 for g in setup.setting.gpu_types for r in setups.REGIONS}
    )
    from coral_solver.allocate import allocate

    plan = allocate(models, library, unlimited, Policy(n_max=2))
    gpus = availability(setup, plan)
    used: dict[str, int] = {}
    for row in plan.rows:
        for stage in row.template.stages:
            base = stage.gpu_type.split("@")[0]
            used[base] = used.get(base, 0) + row.count * row.template.tp
    for g in setup.setting.gpu_types:
        per_region = [gpus[f"{g}@{r}"] for r in setups.REGIONS]
        assert sum(per_region) >= 1.25 * used.get(g, 0) + 16 - 1e-9
        assert max(per_region) - min(per_region) == 0
