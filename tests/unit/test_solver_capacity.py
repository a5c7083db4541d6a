"""coral_solver.capacity: the most replicas GPUs could ever hold, against answers worked out
by hand on small cases."""

from __future__ import annotations

from coral_solver.capacity import minimums_fit, most_replicas
from coral_solver.types import Stage, Template


def template(model: str, tp: int, *gpus: str) -> Template:
    return Template(model, tp, tuple(Stage(g, 10) for g in gpus), throughput=1.0)


def test_each_gpu_type_over_its_smallest_layout():
    # a100: 1 GPU each → 8; v100: 2 GPUs each (TP 2, or 2 stages of TP 1) → 8 // 2 = 4
    templates = [template("m", 1, "a100"), template("m", 2, "v100"),
                 template("m", 1, "v100", "v100")]
    assert most_replicas(templates, {"a100": 8, "v100": 8}) == 12
    assert most_replicas(templates, {"v100": 8}) == 4
    assert most_replicas(templates, {"v100": 1}) == 0  # no layout fits one v100
    assert most_replicas(templates, {"h100": 8}) == 0  # no layout on that type at all
    assert most_replicas([], {"a100": 8}) == 0


def test_a_pipeline_across_types_counts_the_gpus_of_each():
    # only a100+v100 pipelines (one GPU of each): as many as the scarcer type has GPUs
    pipeline = [template("m", 1, "a100", "v100")]
    assert most_replicas(pipeline, {"a100": 3, "v100": 8}) == 3
    # with homogeneous v100 (4 GPUs each) too: 3 pipelines use 3 v100, the other 5 hold one
    both = pipeline + [template("m", 4, "v100")]
    assert most_replicas(both, {"a100": 3, "v100": 8}) == 4


def test_minimums_together():
    a = [template("a", 1, "a100")]
    b = [template("b", 1, "a100"), template("b", 2, "v100")]
    gpus = {"a": {"a100": 8}, "b": {"a100": 8, "v100": 4}}
    union = {"a100": 8, "v100": 4}
    # a takes all 8 a100; b's 2 fit on the 4 v100
    assert minimums_fit({"a": 8, "b": 2}, {"a": a, "b": b}, gpus, union)
    # a third b needs an a100 that a holds
    assert not minimums_fit({"a": 8, "b": 3}, {"a": a, "b": b}, gpus, union)
    # b alone may use only its own GPUs: no v100 for b, so 3 of b do not fit beside a's 6
    gpus_a100_only = {"a": {"a100": 8}, "b": {"a100": 8}}
    assert not minimums_fit({"a": 6, "b": 3}, {"a": a, "b": b}, gpus_a100_only, union)
    assert minimums_fit({"a": 6, "b": 2}, {"a": a, "b": b}, gpus_a100_only, union)
