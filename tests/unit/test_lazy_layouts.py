"""Stage 1 asking only the figures its search needs (coral_solver.lazy_layouts) finds what the
whole table finds: on random non-increasing tables, and on the real throughput model, whose
templates must not move."""

from __future__ import annotations

import random

import numpy as np
import pytest

from coral_solver import templates
from coral_solver.lazy_layouts import LazyStageTable
from coral_solver.templates import PerfThroughput, _multisets, _split, best_layouts
from coral_solver.types import ModelSpec, Policy


def _random_table(rng: random.Random, n_types: int, longest: int) -> np.ndarray:
    """Rows non-increasing in layers, some ending in zeros (a stage whose KV no longer fits),
    with ties (equal figures at neighbouring layer counts)."""
    table = np.zeros((n_types, longest))
    for g in range(n_types):
        value = rng.uniform(1.0, 100.0)
        for k in range(longest):
            table[g, k] = value
            if rng.random() < 0.7:
                value *= rng.uniform(0.6, 1.0)
        cut = rng.randint(0, longest)
        if rng.random() < 0.3:
            table[g, cut:] = 0.0
    return table


@pytest.mark.parametrize("seed", range(40))
def test_the_lazy_search_finds_what_the_whole_table_finds(seed):
    rng = random.Random(seed)
    n_types, stages = rng.randint(1, 4), rng.randint(1, 5)
    layers = rng.randint(stages, 60)
    longest = layers - stages + 1
    table = _random_table(rng, n_types, longest)
    counts = _multisets(n_types, stages, heterogeneous=True)
    lazy = LazyStageTable(lambda g, n: table[g, n - 1], n_types, longest)
    got, got_most = lazy.best_layouts(counts, layers)
    want, want_most = best_layouts(table, counts, layers)
    assert got.tolist() == want.tolist()
    for row in np.nonzero(want > 0)[0]:
        used = counts[row] > 0
        assert got_most[row][used].tolist() == want_most[row][used].tolist()
        split = _split(got_most[row], counts[row], layers)
        assert min(table[g, n - 1] for g, n in split) == want[row]
    assert lazy.asked <= table.size


def test_a_row_with_no_positive_figure_makes_its_multisets_infeasible():
    table = np.array([[5.0, 4.0, 3.0], [0.0, 0.0, 0.0]])
    counts = _multisets(2, 2, heterogeneous=True)  # (2, 0), (1, 1), (0, 2)
    lazy = LazyStageTable(lambda g, n: table[g, n - 1], 2, 3)
    got, _ = lazy.best_layouts(counts, 4)
    assert got.tolist() == best_layouts(table, counts, 4)[0].tolist() == [4.0, 0.0, 0.0]


def test_the_real_model_gives_the_same_templates_asking_fewer_figures(monkeypatch):
    gpus = {"a100": (8, 80.0), "l4": (4, 24.0), "h100": (8, 80.0)}
    policy = Policy(n_max=3, max_tp=2)
    model = ModelSpec("q", "qwen3-8b", 1024, 256, 2.0, 0.08)

    class Counting(PerfThroughput):
        asked = 0

        def throughput(self, *args):
            Counting.asked += 1
            return super().throughput(*args)

    lazy = templates.searched_templates(Counting(), model, gpus, policy)
    asked_lazy, Counting.asked = Counting.asked, 0
    monkeypatch.setattr(Counting, "monotone_in_layers", False)
    whole = templates.searched_templates(Counting(), model, gpus, policy)
    assert lazy == whole and lazy
    assert asked_lazy < Counting.asked


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_prefill_and_decode_templates_are_the_same_asked_lazily(monkeypatch, role):
    """The phase figures (coral_solver.perf_roles) are monotone in layers too: a role's
    templates found lazily are the whole table's."""
    from coral_solver.roles import phase_templates

    gpus = {"a100": (8, 80.0), "l4": (4, 24.0)}
    policy = Policy(n_max=3, max_tp=2)
    model = ModelSpec("q", "qwen3-8b", 1024, 256, 2.0, 0.08, disaggregation="on")
    lazy = phase_templates(PerfThroughput(), model, gpus, policy, role)
    monkeypatch.setattr(PerfThroughput, "monotone_in_layers", False)
    whole = phase_templates(PerfThroughput(), model, gpus, policy, role)
    assert lazy == whole and lazy
