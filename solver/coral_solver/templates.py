"""Stage 1: the library of serving templates per model, found exactly.

A template is a vLLM-runnable layout: ``S`` pipeline stages, each on one node, one TP degree ``t``
for all stages, layers split (unevenly where it helps) so the slowest stage is as fast as possible.
For a model and its SLO, every candidate node multiset — counts ``n_g`` of stages per GPU type
(identical nodes aggregated, so no symmetric copies), ``S = Σ n_g ≤ N_max`` and GPU memory
``t · Σ n_g · mem_g ≤ ρ · weights`` — gets its best layout exactly:

    throughput(n) = max T  s.t.  Σ_g n_g · ℓ_g(T) ≥ L,  ℓ_g(T) ≥ 1 for every used g,

where ``ℓ_g(T)`` is the most layers one stage of type ``g`` holds while sustaining ``T`` requests/s
within TTFT/S and TPOT/S (stage throughput is non-increasing in layers). The optimum is one of the
finitely many tabulated stage throughputs, so all multisets of one (t, S) are solved at once as a
matrix product over those candidate values: exact, with no solver call per multiset. Templates
dominated by another (no more stages of every configuration, at least the throughput) are dropped.
The library is cached on disk by a hash of everything it depends on — the architecture, mix,
SLO, allowed GPU types and roles, not the model's name — so models that share those share one
entry (50 models of a site drawn from a few architectures need a few Stage-1 runs, not 50).

With ``Policy.capacity`` ``simulated`` the same search picks layer splits on mean-only stage
figures and each candidate is then rated by simulating its whole replica
(:mod:`coral_solver.templates_sim`, :mod:`coral_solver.simcap`): one end-to-end definition of
what a template serves instead of its bottleneck stage's share of an evenly split SLO.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from coral_solver.catalog import derived_model
from coral_solver.lazy_layouts import LazyStageTable
from coral_solver.roles import phase_templates, roles_for, supports_phases
from coral_solver.throughput_model import PerfThroughput, ThroughputModel
from coral_solver.types import ModelSpec, Policy, Stage, Template

#: progress(model name, models done, models total)
Progress = Callable[[str, int, int], None]

#: 2: the key no longer holds the model's name (entries are shared between models);
#: 3: prefill-only and decode-only stages must hold one ``max_model_len`` request's KV too;
#: 4: a template may always use one GPU (:func:`memory_budget`), so small models' libraries grew;
#: 5: under ``capacity: simulated`` prefill-only and decode-only templates are simulated too
#: (:mod:`coral_solver.simcap_roles`), no longer rated analytically;
#: 6: the analytic capacity is monotone in step cost and its tail TPOT sums over output lengths
#: (:mod:`coral_solver.perf_tail`, issue 24 item 3): every analytic figure moved
CACHE_VERSION = 6


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/coral-hpc/templates`` (``~/.cache/coral-hpc/templates``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coral-hpc" / "templates"


# --------------------------------------------------------------------------- exact best layout


def _stage_tables(
    tm: ThroughputModel, model: ModelSpec, types: list[str], tp: int, stages: int, layers: int
) -> np.ndarray:
    """``table[g, l-1]`` = throughput of a stage of type g holding l layers (1 ≤ l ≤ L-S+1).

    A stage may need a minimum layer count: the model can call a stage with few layers
    infeasible and one with more feasible (e.g. Qwen3-235B on 4×H100 in 2 stages with a
    prompt-heavy mix: nothing below 10 layers). So every layer count is asked; entries before the
    first feasible one stay 0, and from it on the table is forced non-increasing (a stage never
    gets faster by holding more layers), so the feasible layer counts at any throughput form one
    interval [:func:`_least_layers`, most].
    """
    longest = layers - stages + 1
    table = np.zeros((len(types), longest))
    for gi, gpu in enumerate(types):
        for l in range(1, longest + 1):
            value = tm.throughput(model, gpu, tp, l, stages)
            table[gi, l - 1] = value if value > 0 else 0.0
    least = _least_layers(table)
    for gi in range(len(types)):
        start = least[gi] - 1
        if start < longest:
            table[gi, start:] = np.minimum.accumulate(table[gi, start:])
    return table


def _least_layers(table: np.ndarray) -> np.ndarray:
    """Per stage type, the fewest layers at which its stage is feasible (L-S+2 when never)."""
    positive = table > 0
    return np.where(positive.any(axis=1), positive.argmax(axis=1) + 1, table.shape[1] + 1)


def _multisets(n_types: int, stages: int, heterogeneous: bool) -> np.ndarray:
    """All count vectors over ``n_types`` summing to ``stages`` (one per multiset)."""
    if not heterogeneous:
        return stages * np.eye(n_types, dtype=np.int64)
    rows = []
    for combo in itertools.combinations_with_replacement(range(n_types), stages):
        row = np.zeros(n_types, dtype=np.int64)
        for gi in combo:
            row[gi] += 1
        rows.append(row)
    return np.array(rows, dtype=np.int64).reshape(-1, n_types)


def best_layouts(
    table: np.ndarray, counts: np.ndarray, layers: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact best bottleneck throughput for every multiset row of ``counts``.

    ``table`` as :func:`_stage_tables` makes it: per type, zeros up to its fewest feasible layers,
    then non-increasing. At a target T a stage of type g holds any layer count in
    [least_g, most_g(T)], so a multiset reaches T iff Σ n_g·least_g ≤ L ≤ Σ n_g·most_g(T).
    Returns (throughput per row (0 = no layout), most layers per stage type at that throughput).
    """
    candidates = np.unique(table[table > 0])[::-1]  # descending
    if candidates.size == 0:
        return np.zeros(len(counts)), np.zeros_like(counts)
    least = _least_layers(table)
    # most layers a stage of type g holds at throughput ≥ T: [T, g]
    most = (table[None, :, :] >= candidates[:, None, None]).sum(axis=2)
    most = np.where(most >= 1, most + (least[None, :] - 1), 0)
    # a used type that cannot hold even one layer makes the target infeasible
    big = layers * (counts.sum(axis=1).max() + 1)
    capped = np.where(most >= 1, most, -big)
    capacity = counts @ capped.T  # [multiset, candidate], non-decreasing as T falls
    ok = (capacity >= layers) & ((counts @ least) <= layers)[:, None]
    first = ok.argmax(axis=1)
    feasible = ok[np.arange(len(counts)), first]
    throughput = np.where(feasible, candidates[first], 0.0)
    per_type = np.where(feasible[:, None], most[first], 0)
    return throughput, per_type


def _split(per_type: np.ndarray, counts: np.ndarray, layers: int,
           least: np.ndarray | None = None) -> list[tuple[int, int]]:
    """A concrete split: (type index, layers) per stage, each within [least, cap], summing to L.

    Takes layers off the stages holding the most first (among those above their type's least),
    which keeps the split balanced. ``least`` None: every type may go down to one layer."""
    floor = np.ones(len(counts), dtype=np.int64) if least is None else least
    stages = [[gi, int(per_type[gi])] for gi in range(len(counts)) for _ in range(int(counts[gi]))]
    excess = sum(l for _, l in stages) - layers
    while excess > 0:
        # one layer at a time off the fullest stage that may still shrink keeps the split
        # balanced; best_layouts guaranteed Σ least ≤ L, so one always may
        largest = max((i for i in range(len(stages)) if stages[i][1] > floor[stages[i][0]]),
                      key=lambda i: (stages[i][1], -i))
        stages[largest][1] -= 1
        excess -= 1
    return [(gi, l) for gi, l in stages]


def memory_budget(tm: ThroughputModel, model: ModelSpec,
                  gpu_types: Mapping[str, tuple[int, float]], policy: Policy,
                  usable: Iterable[str]) -> float:
    """GPU memory (GB) one template may use: ``rho`` times the model's weights, and never less
    than one GPU of the smallest usable type. ``rho`` prunes layouts that waste memory; it must
    not leave a small model with none: a 2B model (5 GB) where every GPU has 80 GB would have no
    template at all (12 x 5 GB < 80 GB)."""
    one_gpu = min((gpu_types[g][1] for g in usable if g in gpu_types), default=0.0)
    return max(policy.rho * tm.weight_gb(model), one_gpu)


def model_templates(
    tm: ThroughputModel,
    model: ModelSpec,
    gpu_types: Mapping[str, tuple[int, float]],
    policy: Policy,
    tps: Iterable[int] | None = None,
) -> list[Template]:
    """Every non-dominated template of one model (exact best layout per node multiset).

    ``gpu_types``: GPU type → (most GPUs on one node, GPU memory GB). ``tps``: only these TP
    degrees (a shard of the work, :mod:`coral_solver.stage1`; dominance never crosses TP degrees,
    since a template uses configurations of its own TP only, so shards concatenate exactly).
    With ``policy.capacity`` ``simulated`` each template's throughput is its whole replica's,
    simulated (:func:`coral_solver.templates_sim.simulated_templates`).
    """
    if policy.capacity == "simulated":
        from coral_solver.templates_sim import simulated_templates

        out = simulated_templates(tm, model, gpu_types, policy, tps)
    else:
        out = searched_templates(tm, model, gpu_types, policy, tps)
    if policy.measured_only:
        out = _measured_only(tm, model, out)
    return drop_dominated(_with_measured_pipelines(tm, model, gpu_types, policy, out))


def searched_templates(
    tm: ThroughputModel,
    model: ModelSpec,
    gpu_types: Mapping[str, tuple[int, float]],
    policy: Policy,
    tps: Iterable[int] | None = None,
) -> list[Template]:
    """The best layout of every node multiset (TP degree, stages, GPU types) that ``tm.
    throughput`` rates above 0, each rated by its bottleneck stage; dominated ones included."""
    layers = tm.layers(model)
    usable = sorted(g for g in gpu_types if model.allows_gpu(g) and tm.runs_on(model, g))
    budget = memory_budget(tm, model, gpu_types, policy, usable)
    out: list[Template] = []
    wanted = None if tps is None else set(tps)
    for tp in tm.tp_degrees(model, policy.max_tp):
        if wanted is not None and tp not in wanted:
            continue
        types = [g for g in usable if gpu_types[g][0] >= tp]
        if not types:
            continue
        memory = np.array([tp * gpu_types[g][1] for g in types])
        for stages in range(1, min(policy.n_max, layers) + 1):
            counts = _multisets(len(types), stages, policy.heterogeneous)
            counts = counts[counts @ memory <= budget + 1e-9]
            if counts.size == 0:
                continue
            value, least, throughput, per_type = _layouts(tm, model, types, tp, stages, layers,
                                                          counts)
            for row in np.nonzero(throughput > 0)[0]:
                split = _split(per_type[row], counts[row], layers, least)
                stage_list = tuple(Stage(types[gi], l) for gi, l in split)
                actual = min(value(gi, l) for gi, l in split)
                out.append(
                    Template(
                        model=model.name,
                        tp=tp,
                        stages=stage_list,
                        throughput=float(actual),
                        calibrated=all(tm.calibrated(model, s.gpu_type) for s in stage_list),
                    )
                )
    return out


def _layouts(tm: ThroughputModel, model: ModelSpec, types: list[str], tp: int, stages: int,
             layers: int, counts: np.ndarray
             ) -> tuple[Callable[[int, int], float], np.ndarray | None, np.ndarray, np.ndarray]:
    """The best layout of every multiset row of ``counts`` (:func:`best_layouts`): (the stage
    figure of type index g at l layers, the fewest layers per type (None: one), throughput per
    row, most layers per type per row). A throughput model that is ``monotone_in_layers``
    is asked only the figures the search needs (:mod:`coral_solver.lazy_layouts`), any other
    for its whole table."""
    if getattr(tm, "monotone_in_layers", False):
        lazy = LazyStageTable(lambda g, l: tm.throughput(model, types[g], tp, l, stages),
                              len(types), layers - stages + 1)
        throughput, per_type = lazy.best_layouts(counts, layers)
        return lazy.value, None, throughput, per_type
    table = _stage_tables(tm, model, types, tp, stages, layers)
    throughput, per_type = best_layouts(table, counts, layers)
    return (lambda g, l: float(table[g, l - 1])), _least_layers(table), throughput, per_type


def _with_measured_pipelines(tm: ThroughputModel, model: ModelSpec,
                             gpu_types: Mapping[str, tuple[int, float]], policy: Policy,
                             templates: list[Template]) -> list[Template]:
    """``templates`` with every measured pipeline (``coral-hpc profile --pp N`` or
    ``--stages``) of the model taking its measured replica figure: the template of the same
    stages gets it in place of the per-stage model's, and a measured layout the model did not
    produce is added. A measurement is the engine's real pipeline accounting; the model's
    per-stage figure only estimates it."""
    measured_of = getattr(tm, "measured_pipelines", None)
    if measured_of is None:
        return templates
    kv_fits = getattr(tm, "kv_fits", lambda *_: True)
    out = list(templates)
    usable = [g for g in gpu_types if model.allows_gpu(g) and tm.runs_on(model, g)]
    budget = memory_budget(tm, model, gpu_types, policy, usable)
    for tp in tm.tp_degrees(model, policy.max_tp):
        for stage_gpus, split, rps in measured_of(model, tp):
            if len(split) > policy.n_max or (
                    len(set(stage_gpus)) > 1 and not policy.heterogeneous):
                continue
            if any(g not in gpu_types or not model.allows_gpu(g) or gpu_types[g][0] < tp
                   for g in stage_gpus):
                continue
            memory = sum(tp * gpu_types[g][1] for g in stage_gpus)
            if memory > budget + 1e-9:
                continue
            if not all(kv_fits(model, g, tp, n) for g, n in zip(stage_gpus, split)):
                continue
            stages = tuple(Stage(g, n) for g, n in zip(stage_gpus, split))
            out = [t for t in out if not (t.tp == tp and t.stages == stages)]
            out.append(Template(model=model.name, tp=tp, stages=stages, throughput=float(rps),
                                calibrated=True))
    return out


def _measured_only(tm: ThroughputModel, model: ModelSpec, templates: list[Template]
                   ) -> list[Template]:
    """The one-stage templates whose figure is a measurement (policy ``measured_only``); the
    measured pipelines are added after (:func:`_with_measured_pipelines`)."""
    measured = getattr(tm, "measured", None)
    if measured is None:
        return []
    return [t for t in templates if t.pp == 1 and measured(model, t.stages[0].gpu_type, t.tp)]


def library_templates(
    tm: ThroughputModel,
    model: ModelSpec,
    gpu_types: Mapping[str, tuple[int, float]],
    policy: Policy,
) -> list[Template]:
    """The model's templates for every role its disaggregation policy allows
    (:func:`coral_solver.roles.roles_for`): aggregated from :func:`model_templates`, prefill and
    decode from :func:`coral_solver.roles.phase_templates`."""
    roles = roles_for(model)
    out = model_templates(tm, model, gpu_types, policy) if "both" in roles else []
    phases = [r for r in roles if r != "both"]
    if not phases:
        return out
    if not supports_phases(tm):
        raise ValueError(f"model {model.name}: disaggregation {model.disaggregation} needs a "
                         "throughput model that prices prefill and decode apart")
    for role in phases:
        out += phase_templates(tm, model, gpu_types, policy, role)
    return out


def drop_dominated(templates: list[Template]) -> list[Template]:
    """Keep templates no other beats: another dominates when it uses no more stages of every
    configuration and serves at least as much (ties keep the first)."""
    configs = sorted({c for t in templates for c in t.usage()})
    index = {c: i for i, c in enumerate(configs)}
    order = sorted(range(len(templates)), key=lambda i: (-templates[i].throughput, templates[i].pp, i))
    kept: list[int] = []
    kept_usage = np.zeros((0, len(configs)), dtype=np.int64)
    for i in order:
        usage = np.zeros(len(configs), dtype=np.int64)
        for config, count in templates[i].usage().items():
            usage[index[config]] = count
        # kept ones all have throughput ≥ this one (sorted), so usage decides
        if kept and (kept_usage <= usage).all(axis=1).any():
            continue
        kept.append(i)
        kept_usage = np.vstack([kept_usage, usage])
    return [templates[i] for i in sorted(kept)]


# --------------------------------------------------------------------------- library + cache


def _cache_key(
    tm: ThroughputModel, model: ModelSpec, gpu_types: Mapping[str, tuple[int, float]],
    policy: Policy, fingerprint: str | None = None,
) -> str:
    """The hash of everything a model's library depends on. Not its name when the throughput
    model answers by architecture (``answers_by_architecture``): two models of one
    architecture, mix, SLO and allowed GPU types then get the same templates (only
    :attr:`Template.model` differs, which :func:`_named` sets on reading). Partitions are Stage 2's
    business and not part of it; so are the model's observed lengths under analytic capacity
    (only a simulated capacity reads them). ``fingerprint``: ``tm.fingerprint()`` when already
    computed (it hashes every profile file)."""
    named = [] if getattr(tm, "answers_by_architecture", False) else [model.name]
    # an architecture read from a config.json is named by its path or id, whose file may change:
    # its derived figures are part of the key, so an edited config.json is planned afresh
    derived = derived_model(model.arch)
    if derived is not None:
        named = named + [repr(derived)]
    material = {
        "version": CACHE_VERSION,
        "model": named + [model.arch, model.input_tokens, model.output_tokens,
                          model.ttft_s, model.tpot_s, sorted(model.gpu_types),
                          model.max_model_len] + (["pooling"] if model.pooling else []),
        "roles": list(roles_for(model)),
        "gpus": sorted([g, list(v)] for g, v in gpu_types.items()),
        "policy": [policy.n_max, policy.rho, policy.heterogeneous, policy.max_tp,
                   policy.measured_only]
        + ([policy.capacity, policy.slo_attainment] if policy.capacity != "analytic" else []),
        # observed lengths only move simulated figures: analytic libraries stay shared
        **({"lengths": model.lengths.digest()}
           if model.lengths is not None and policy.capacity != "analytic" else {}),
        "throughput": tm.fingerprint() if fingerprint is None else fingerprint,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def _named(templates: Iterable[Template], name: str) -> list[Template]:
    """``templates`` (of a model with the same cache key) as templates of model ``name``."""
    return [t if t.model == name else replace(t, model=name) for t in templates]


#: cache entries already read in this process, by key (the key holds the throughput model's
#: fingerprint, so an entry never goes stale): a daemon re-plans every few minutes with the same
#: models, and parsing every model's JSON again each time is most of a warm Stage 1
_LOADED: OrderedDict[str, tuple[Template, ...]] = OrderedDict()
_LOADED_MAX = 512


def _remember(key: str, templates: Iterable[Template]) -> None:
    _LOADED[key] = tuple(templates)
    _LOADED.move_to_end(key)
    while len(_LOADED) > _LOADED_MAX:
        _LOADED.popitem(last=False)


def _to_json(templates: Iterable[Template]) -> list[dict]:
    return [asdict(t) for t in templates]


def _from_json(items: list[dict]) -> list[Template]:
    return [
        Template(
            model=item["model"],
            tp=int(item["tp"]),
            stages=tuple(Stage(s["gpu_type"], int(s["layers"])) for s in item["stages"]),
            throughput=float(item["throughput"]),
            calibrated=bool(item.get("calibrated", True)),
            role=item.get("role", "both"),
            kv_bytes_per_request=float(item.get("kv_bytes_per_request", 0.0)),
        )
        for item in items
    ]


def build_library(
    models: Iterable[ModelSpec],
    gpu_types: Mapping[str, tuple[int, float]],
    policy: Policy | None = None,
    throughput: ThroughputModel | None = None,
    cache_dir: Path | str | None = None,
    progress: Progress | None = None,
    use_cache: bool = True,
) -> dict[str, list[Template]]:
    """Stage 1 for every model: model name → its non-dominated templates.

    ``gpu_types`` maps each GPU type present to (most GPUs on one node, GPU memory GB), e.g. from
    :meth:`coral_solver.types.Cluster.gpu_types`. Results are cached in ``cache_dir`` (default
    :func:`default_cache_dir`) under a hash of the model's architecture, SLO and mix, the GPU
    types, the policy and the throughput model's fingerprint — models alike in all of these share
    one entry (and one search within a call); ``use_cache=False`` neither reads nor writes it.
    """
    policy = policy if policy is not None else Policy()
    tm = throughput if throughput is not None else PerfThroughput()
    models = list(models)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fingerprint = tm.fingerprint()
    built: dict[str, list[Template]] = {}  # this call's libraries by key: shared, not rebuilt
    library: dict[str, list[Template]] = {}
    for done, model in enumerate(models):
        if progress:
            progress(model.name, done, len(models))
        key = _cache_key(tm, model, gpu_types, policy, fingerprint)
        if key in built:
            library[model.name] = _named(built[key], model.name)
            continue
        path = folder / f"{key}.json"
        if use_cache and key in _LOADED and path.is_file():
            built[key] = list(_LOADED[key])
            library[model.name] = _named(built[key], model.name)
            continue
        if use_cache and path.is_file():
            try:
                built[key] = _from_json(json.loads(path.read_text()))
                _remember(key, built[key])
                library[model.name] = _named(built[key], model.name)
                continue
            except (ValueError, KeyError, TypeError):
                pass  # a damaged cache entry is rebuilt below
        templates = library_templates(tm, model, gpu_types, policy)
        built[key] = templates
        library[model.name] = templates
        if use_cache:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(_to_json(templates)))
            tmp.replace(path)  # atomic: a concurrent reader never sees half a file
            _remember(key, templates)
    if progress:
        progress("", len(models), len(models))
    return library
