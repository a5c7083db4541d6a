"""Stage 1: exact best layouts, dominance, vLLM layout rules, cache, progress."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from coral_solver.joint import TableThroughput, random_instance
from coral_solver.templates import best_layouts, build_library, drop_dominated, model_templates
from coral_solver.types import ModelSpec, Policy, Stage, Template


def _brute_best(tm, model, types, tp, counts, layers):
    """Best bottleneck throughput over every stage order and every split of the layers."""
    stage_types = [g for g, n in zip(types, counts) for _ in range(n)]
    S = len(stage_types)
    best = 0.0
    for cuts in itertools.combinations(range(1, layers), S - 1):
        split = [b - a for a, b in zip((0,) + cuts, cuts + (layers,))]
        for order in set(itertools.permutations(stage_types)):
            speed = min(tm.throughput(model, g, tp, l, S) for g, l in zip(order, split))
            best = max(best, speed)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_every_template_is_the_exact_best_layout_of_its_node_multiset(seed):
    inst = random_instance(seed)
    tm = inst.throughput
    gpu_types = inst.cluster.gpu_types()
    for model in inst.models:
        templates = model_templates(tm, model, gpu_types, inst.policy)
        assert templates, "a model with fitting GPUs gets templates"
        found = {}
        for t in templates:
            counts = t.stage_counts()
            key = (t.tp, tuple(sorted(counts.items())))
            found[key] = t
            types = sorted(counts)
            best = _brute_best(tm, model, types, t.tp, [counts[g] for g in types], tm.layers(model))
            assert t.throughput == pytest.approx(best, rel=1e-12), t.id
            # the layout reported really sustains it
            assert sum(s.layers for s in t.stages) == tm.layers(model)
            assert min(tm.throughput(model, s.gpu_type, t.tp, s.layers, t.pp) for s in t.stages) \
                == pytest.approx(t.throughput)
        # every feasible multiset is either a template or dominated by one
        types = sorted(g for g in gpu_types if tm.runs_on(model, g))
        for tp in tm.tp_degrees(model, inst.policy.max_tp):
            usable = [g for g in types if gpu_types[g][0] >= tp]
            for S in range(1, inst.policy.n_max + 1):
                for combo in itertools.combinations_with_replacement(usable, S):
                    counts = {g: combo.count(g) for g in set(combo)}
                    best = _brute_best(tm, model, sorted(counts), tp,
                                       [counts[g] for g in sorted(counts)], tm.layers(model))
                    if best <= 0:
                        continue
                    assert any(
                        t.tp == tp and t.throughput >= best - 1e-12
                        and all(t.stage_counts().get(g, 0) <= counts.get(g, 0)
                                for g in t.stage_counts())
                        for t in templates
                    ), (tp, counts, best)


def test_best_layouts_picks_an_uneven_split_when_stages_differ():
    # a fast and a slow GPU type, 10 layers: the fast stage should take more layers
    table = [[100.0 / l for l in range(1, 10)], [40.0 / l for l in range(1, 10)]]
    import numpy as np

    throughput, per_type = best_layouts(np.array(table), np.array([[1, 1]]), 10)
    # fast holds 7 (100/7≈14.3), slow 3 (40/3≈13.3): best bottleneck = 40/3
    assert throughput[0] == pytest.approx(40 / 3)
    assert per_type[0][0] >= 7 and per_type[0][1] == 3


def test_no_template_is_dominated_and_layouts_follow_vllm_rules():
    inst = random_instance(3)
    lib = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        use_cache=False)
    for templates in lib.values():
        for a in templates:
            assert a.pp <= inst.policy.n_max
            assert a.layer_partition == ",".join(str(s.layers) for s in a.stages)
            assert all(s.layers >= 1 for s in a.stages)
            for b in templates:
                if a is b:
                    continue
                ua, ub = a.usage(), b.usage()
                dominated = all(ub.get(c, 0) <= n for c, n in ua.items()) and set(ub) <= set(ua) \
                    and b.throughput >= a.throughput
                assert not dominated, (a.id, b.id)


def test_drop_dominated_keeps_the_better_of_two_and_both_of_incomparable():
    one = Template("m", 1, (Stage("a", 4),), 2.0)
    two = Template("m", 1, (Stage("a", 2), Stage("a", 2)), 1.5)  # more nodes, less throughput
    other = Template("m", 1, (Stage("b", 4),), 1.0)  # another GPU type: incomparable
    faster_pair = Template("m", 1, (Stage("a", 3), Stage("b", 1)), 3.0)
    kept = drop_dominated([one, two, other, faster_pair])
    assert {t.id for t in kept} == {one.id, other.id, faster_pair.id}


def test_heterogeneous_off_gives_single_type_templates_only():
    inst = random_instance(5)
    policy = Policy(n_max=3, rho=math.inf, heterogeneous=False, max_tp=2)
    lib = build_library(inst.models, inst.cluster.gpu_types(), policy, inst.throughput, use_cache=False)
    assert all(not t.heterogeneous for ts in lib.values() for t in ts)
    on = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, inst.throughput,
                       use_cache=False)
    assert any(t.heterogeneous for ts in on.values() for t in ts)


def test_memory_filter_rho_limits_template_gpu_memory():
    inst = random_instance(2)
    tm = inst.throughput
    gpu_types = inst.cluster.gpu_types()
    policy = Policy(n_max=3, rho=2.0, max_tp=2)
    for model in inst.models:
        for t in model_templates(tm, model, gpu_types, policy):
            memory = sum(t.tp * gpu_types[s.gpu_type][1] for s in t.stages)
            assert memory <= 2.0 * tm.weight_gb(model) + 1e-9


class _Counting:
    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def throughput(self, *args):
        self.calls += 1
        return self.inner.throughput(*args)


def test_library_is_cached_by_input_hash_and_reports_progress(tmp_path):
    inst = random_instance(7)
    counting = _Counting(inst.throughput)
    seen = []
    first = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, counting,
                          cache_dir=tmp_path, progress=lambda *a: seen.append(a))
    assert counting.calls > 0
    assert seen[-1][1] == seen[-1][2] == len(inst.models)
    assert len(list(tmp_path.glob("*.json"))) == len(inst.models)
    counting.calls = 0
    again = build_library(inst.models, inst.cluster.gpu_types(), inst.policy, counting,
                          cache_dir=tmp_path)
    assert counting.calls == 0 and again == first
    # another SLO is another key: rebuilt
    changed = [ModelSpec(**{**m.__dict__, "tpot_s": m.tpot_s / 2}) for m in inst.models]
    build_library(changed, inst.cluster.gpu_types(), inst.policy, counting, cache_dir=tmp_path)
    assert counting.calls > 0
    assert len(list(tmp_path.glob("*.json"))) == 2 * len(inst.models)


def test_models_alike_but_for_their_name_share_one_entry_and_one_search(tmp_path):
    from coral_solver.templates import PerfThroughput

    gpus = {"a100": (8, 80.0), "l4": (4, 24.0)}
    policy = Policy(n_max=2)
    base = ModelSpec("q8", "qwen3-8b", 1024, 256, 2.0, 0.08)
    twins = [base, replace(base, name="twin", priority=5.0, partitions=("other",))]
    counting = _Counting(PerfThroughput())
    lib = build_library(twins, gpus, policy, counting, cache_dir=tmp_path)
    once = counting.calls
    assert once > 0 and len(list(tmp_path.glob("*.json"))) == 1  # one entry for both names
    alone = build_library([base], gpus, policy, counting, use_cache=False)
    assert counting.calls == 2 * once  # the pair cost what one model costs
    # the same templates, each named after its own model (ids differ by name only)
    assert lib["q8"] == alone["q8"] and lib["twin"]
    assert {t.model for t in lib["twin"]} == {"twin"}
    assert [replace(t, model="q8") for t in lib["twin"]] == lib["q8"]
    assert [t.id.removeprefix("twin.") for t in lib["twin"]] == \
        [t.id.removeprefix("q8.") for t in lib["q8"]]
    # read back in a later call: still named per model, nothing computed
    counting.calls = 0
    again = build_library(list(reversed(twins)), gpus, policy, counting, cache_dir=tmp_path)
    assert counting.calls == 0 and again == lib
    # another SLO or architecture is another entry
    build_library([replace(base, name="strict", tpot_s=0.04),
                   replace(base, name="big", arch="qwen3-32b")], gpus, policy, counting,
                  cache_dir=tmp_path)
    assert counting.calls > 0 and len(list(tmp_path.glob("*.json"))) == 3


def test_a_throughput_model_keyed_by_name_keeps_one_library_per_name(tmp_path):
    inst = random_instance(7)  # TableThroughput: its tables are per model name
    model = inst.models[0]
    build_library([model], inst.cluster.gpu_types(), inst.policy, inst.throughput,
                  cache_dir=tmp_path)
    renamed = replace(model, name="other")
    inst.throughput.layer_count["other"] = inst.throughput.layer_count[model.name]
    inst.throughput.weights_gb["other"] = inst.throughput.weights_gb[model.name]
    inst.throughput.tps["other"] = inst.throughput.tps[model.name]
    lib = build_library([renamed], inst.cluster.gpu_types(), inst.policy, inst.throughput,
                        cache_dir=tmp_path)
    assert lib["other"] == []  # no table rows under that name: not another name's library
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_model_too_big_for_every_layout_gets_no_templates():
    tm = TableThroughput({"m": 4}, {"m": 100.0}, {"m": [1]},
                         {("m", "a", 1, s): [0.0] * 4 for s in range(1, 4)})
    model = ModelSpec("m", "m", 10, 10, 1.0, 0.1)
    assert model_templates(tm, model, {"a": (4, 16.0)}, Policy(n_max=3, rho=math.inf)) == []


def _min_layer_instance():
    """A 12-layer model, two GPU types: 'big' is infeasible below 5 layers (a stage with a
    minimum layer count), 'small' holds at most 4 layers."""
    from coral_solver.joint import TableThroughput

    model = ModelSpec("m", "m", 512, 128, 2.0, 0.1)
    big = [0.0] * 4 + [60.0 / l for l in range(5, 12)]
    small = [30.0 / l for l in range(1, 5)] + [0.0] * 7
    tm = TableThroughput(layer_count={"m": 12}, weights_gb={"m": 10.0}, tps={"m": [1]},
                         table={("m", "big", 1, s): big for s in (1, 2, 3)}
                         | {("m", "small", 1, s): small for s in (1, 2, 3)})
    return model, tm


def test_a_stage_with_a_minimum_layer_count_keeps_its_table():
    import numpy as np

    from coral_solver.templates import _stage_tables

    model, tm = _min_layer_instance()
    table = _stage_tables(tm, model, ["big", "small"], 1, 2, 12)
    # big is feasible only from 5 layers on: those entries survive (they used to be cut at l=1)
    assert (table[0, :4] == 0).all() and table[0, 4] == pytest.approx(12.0)
    assert np.all(np.diff(table[0, 4:]) <= 0)


def test_templates_with_a_minimum_layer_stage_are_the_exact_best_layouts():
    model, tm = _min_layer_instance()
    templates = model_templates(tm, model, {"big": (1, 80.0), "small": (1, 80.0)},
                                Policy(n_max=3, rho=100.0, heterogeneous=True))
    by_counts = {tuple(sorted(t.stage_counts().items())): t for t in templates}
    # one big + one small: big takes 8 (60/8 = 7.5), small 4 (30/4 = 7.5)
    mixed = by_counts[(("big", 1), ("small", 1))]
    assert mixed.throughput == pytest.approx(7.5)
    assert {(s.gpu_type, s.layers) for s in mixed.stages} == {("big", 8), ("small", 4)}
    for t in templates:
        counts = t.stage_counts()
        types = sorted(counts)
        assert t.throughput == pytest.approx(
            _brute_best(tm, model, types, t.tp, [counts[g] for g in types], 12), rel=1e-12)
        # every stage of big holds at least its minimum
        assert all(s.layers >= 5 for s in t.stages if s.gpu_type == "big")
        assert sum(s.layers for s in t.stages) == 12


@pytest.fixture
def ring_stall():
    """The model with prompts stalling the pipeline ring (the shipped accounting, measured in
    bench/results/paper_pp.md), whatever PROMPTS_STALL_RING says when this test runs."""
    from coral_solver import perf

    saved = perf.PROMPTS_STALL_RING
    perf.PROMPTS_STALL_RING = True
    perf.configure()
    yield
    perf.PROMPTS_STALL_RING = saved
    perf.configure()


def test_qwen3_235b_on_two_4xh100_stages_gets_a_template_with_the_azure_code_mix(ring_stall):
    """Under the ring accounting, with this prompt-heavy mix, the two-stage split is found and
    rated by its bottleneck stage. (It asserted a stage of few layers infeasible and 47 layers
    feasible: the old tail surge failed the lone sequence a small stage's search started from, a
    figure that rose with the step's cost; now fewer layers never serve less.)"""
    from coral_solver.templates import PerfThroughput, _stage_tables

    model = ModelSpec("q235", "qwen3-235b-a22b", 2048, 28, 4.0, 0.2)
    tm = PerfThroughput()
    table = _stage_tables(tm, model, ["h100"], 4, 2, 94)
    # fewer layers never serve less (tests/unit/test_perf_monotone.py: monotone in step cost)
    assert all(a >= b for a, b in zip(table[0, :-1], table[0, 1:])) and table[0, 46] > 0
    templates = model_templates(tm, model, {"h100": (8, 80.0)}, Policy(n_max=2))
    two = [t for t in templates if t.tp == 4 and t.pp == 2]
    assert two and [s.layers for s in two[0].stages] == [47, 47]
    assert min(tm.throughput(model, s.gpu_type, 4, s.layers, 2) for s in two[0].stages) \
        == pytest.approx(two[0].throughput)
