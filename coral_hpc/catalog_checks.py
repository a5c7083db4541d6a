"""Checks of a deployment against the performance model's catalogue (read-only solver data).

A ``models.yaml`` can be well-formed and still name an architecture or GPU type the performance
model does not know, or ask for an SLO no layout can meet; ``plan`` and ``serve`` would then fail
(or serve nothing) later. These checks need no Slurm: only ``profiles/`` through
:mod:`coral_solver.catalog` and :mod:`coral_solver.perf`. Checks that need Slurm (a partition Slurm
lacks, capacity for ``min_replicas``) live with the cluster snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping

from coral_hpc.config import Deployment

#: Largest TP degree considered, as Stage 1 does (coral_solver.types.Policy.max_tp).
MAX_TP = 8


def _gpu_problems(deployment: Deployment, known: Mapping[str, object]) -> list[str]:
    from coral_solver.catalog import canonical_gpu_name, catalogue_files

    names = ", ".join(sorted(known))
    problems = []

    def check(loc: tuple, gpu: str) -> None:
        if canonical_gpu_name(gpu) is None:
            problems.append(deployment.problem(
                loc, f"GPU type {gpu!r} is not in the performance model's catalogue "
                     f"({catalogue_files()}); known: {names}"))

    for index, part in enumerate(deployment.cluster.partitions):
        for gpu in part.gpu_types:
            check(("cluster", "partitions", index, "gpu_types"), gpu)
        if isinstance(part.price, dict):
            for gpu in part.price:
                if gpu not in part.gpu_types:
                    check(("cluster", "partitions", index, "price"), gpu)
    for gpu in deployment.cluster.gpu_quotas:
        check(("cluster", "gpu_quotas"), gpu)
    for index, model in enumerate(deployment.models):
        for gpu in model.gpu_types:
            check(("models", index, "gpu_types"), gpu)
    return problems


def candidate_gpus(deployment: Deployment, model_index: int) -> list[str]:
    """Canonical GPU types a model's replicas could use, as far as the file says: the types its
    allowed partitions list (every catalogued type when one of them leaves it to Slurm), within
    the model's own ``gpu_types``."""
    from coral_solver.catalog import canonical_gpu_name, load_gpus

    model = deployment.models[model_index]
    parts = [p for p in deployment.cluster.partitions
             if not model.partitions or p.name in model.partitions]
    if any(not p.gpu_types for p in parts):
        types = set(load_gpus())
    else:
        types = {name for p in parts for g in p.gpu_types
                 if (name := canonical_gpu_name(g)) is not None}
    if model.gpu_types:
        types &= {name for g in model.gpu_types if (name := canonical_gpu_name(g)) is not None}
    return sorted(types)


def slo_feasible(arch, gpus: list[str], slo, mix, n_max: int) -> bool:
    """Whether any layout on ``gpus`` could meet ``slo`` for ``mix``: some GPU type, TP degree
    and stage count S whose stage holding ceil(L/S) layers sustains a positive rate.

    Exact as a refusal: every layout of S stages has a stage holding at least ceil(L/S) layers,
    its rate is at most that of the best GPU type holding ceil(L/S) (a stage's rate never grows
    with more layers), and a pipeline's rate is that of its slowest stage. So when this is False,
    Stage 1 finds no template either."""
    from coral_solver import catalog, perf

    for gpu_name in gpus:
        gpu = catalog.gpu_spec(gpu_name)
        for tp in perf.valid_tp_degrees(arch, MAX_TP):
            for stages in range(1, min(n_max, arch.layers) + 1):
                layers = -(-arch.layers // stages)
                if perf.stage_throughput(arch, gpu, tp, layers, stages, slo, mix) > 0:
                    return True
    return False


def pooling_feasible(arch, gpus: list[str], latency_s: float, input_tokens: int) -> bool:
    """Whether one node of some allowed GPU type and TP degree answers an embedding request
    of ``input_tokens`` within ``latency_s`` (:mod:`coral_solver.perf_pooling`; embedding
    replicas are one stage)."""
    from coral_solver import catalog, perf
    from coral_solver.perf_pooling import pooling_throughput

    for gpu_name in gpus:
        gpu = catalog.gpu_spec(gpu_name)
        for tp in perf.valid_tp_degrees(arch, MAX_TP):
            if pooling_throughput(arch, gpu, tp, arch.layers, 1, latency_s, input_tokens) > 0:
                return True
    return False


def catalog_problems(deployment: Deployment) -> list[str]:
    """Every catalogue problem of ``deployment``, one line each (file, line, field, what's valid):
    unknown GPU types, unknown architectures, and SLOs no layout on the allowed GPUs can meet."""
    from coral_solver import catalog, perf

    known_gpus = catalog.load_gpus()
    problems = _gpu_problems(deployment, known_gpus)
    known_archs = ", ".join(sorted(catalog.load_models()))
    for index, model in enumerate(deployment.models):
        try:
            arch = catalog.model_arch(model.arch_key)
        except KeyError:
            problems.append(deployment.problem(
                ("models", index, "architecture"),
                f"{model.arch_key!r} is not in the performance model's catalogue "
                f"({catalog.catalogue_files()}); known: {known_archs}"))
            continue
        gpus = candidate_gpus(deployment, index)
        if not gpus:
            continue  # every allowed type is unknown: reported above
        runs, excluded = gpu_exclusions(deployment, index)
        if not runs:
            problems.append(deployment.problem(
                ("models", index, "gpu_types" if model.gpu_types else "source"),
                f"no allowed GPU type can run {arch.name}: "
                + "; ".join(f"{gpu}: {why}" for gpu, why in sorted(excluded.items()))
                + "; allow other GPU types or partitions, or serve another checkpoint"))
            continue
        if model.embedding:
            if not pooling_feasible(arch, gpus, model.slo.first_answer_s,
                                    model.mix.input_tokens):
                problems.append(deployment.problem(
                    ("models", index, "slo"),
                    f"no layout answers a {model.mix.input_tokens}-token embedding request of "
                    f"{arch.name} within {model.slo.first_answer_s * 1000:g} ms on "
                    f"{', '.join(gpus)} (performance model: one node, TP ≤ {MAX_TP}); loosen "
                    "the SLO or allow other GPUs"))
            continue
        slo = perf.Slo(ttft_s=model.slo.first_answer_s, tpot_s=model.slo.per_token_s)
        mix = perf.Mix(input_tokens=model.mix.input_tokens, output_tokens=model.mix.output_tokens)
        if not slo_feasible(arch, gpus, slo, mix, deployment.policy.n_max):
            problems.append(deployment.problem(
                ("models", index, "slo"),
                f"no layout meets TTFT {model.slo.first_answer_s:g} s and TPOT "
                f"{model.slo.per_token_s:g} s "
                f"for {arch.name} at {model.mix.input_tokens}/{model.mix.output_tokens} tokens "
                f"in/out on {', '.join(gpus)} (performance model: TP ≤ {MAX_TP}, ≤ "
                f"{deployment.policy.n_max} pipeline stages); loosen the SLO or allow other GPUs"))
    return problems


def gpu_exclusions(deployment: Deployment, model_index: int) -> tuple[dict[str, str],
                                                                       dict[str, str]]:
    """(GPU type -> vLLM ``--dtype`` it serves the model in, GPU type -> why it cannot) over the
    model's candidate GPU types (:func:`candidate_gpus`)."""
    from coral_solver import catalog, perf

    model = deployment.models[model_index]
    arch = catalog.model_arch(model.arch_key)
    derived = catalog.derived_model(model.arch_key)
    runs: dict[str, str] = {}
    excluded: dict[str, str] = {}
    for name in candidate_gpus(deployment, model_index):
        gpu = catalog.gpu_spec(name)
        if derived is not None and derived.arch == arch:
            support = derived.support(gpu.compute_capability)
            if support.ok and support.dtype:
                runs[name] = support.dtype + (f" ({support.reason})" if support.reason else "")
            else:
                excluded[name] = support.reason
            continue
        dtype = perf.engine_dtype(arch, gpu)
        if dtype is None:
            excluded[name] = (f"vLLM has no kernels for {arch.quantization}"
                              f"{' MoE' if arch.is_moe else ''} on compute capability "
                              f"{gpu.compute_capability:g}")
        else:
            runs[name] = dtype
    return runs, excluded


def _derived_from(deployment: Deployment, name: str, architecture: str | None,
                  arch_name: str) -> str:
    """Where a model's figures come from: its config.json, its ``architecture:`` (and the site
    catalogue that defines it), or the shipped catalogue."""
    from coral_hpc.model_archs import derivation
    from coral_solver import catalog

    found = derivation(deployment, name)
    if found is not None and found.config_path is not None:
        return str(found.config_path)
    if architecture is not None:
        site = catalog.site_catalog()
        return f"architecture: {arch_name}" + (
            f" (site catalogue {site.path})" if site is not None and arch_name in site.models
            else "")
    return f"catalogue entry {arch_name} (no config.json found)"


def model_facts(deployment: Deployment) -> list[dict]:
    """Per model, what the performance model knows of it and where from: layers, weights, KV
    bytes per token, dtype, and which candidate GPU types run it (in which dtype) or not (why).
    ``estimate``: ``family`` (a config.json of a known family), ``generic`` (a config.json of
    an unknown model_type: a dense estimate from its standard fields) or ``catalogue``."""
    from coral_solver import catalog

    facts = []
    for index, model in enumerate(deployment.models):
        try:
            arch = catalog.model_arch(model.arch_key)
        except KeyError:
            continue  # reported by catalog_problems
        derived = catalog.derived_model(model.arch_key)
        origin = _derived_from(deployment, model.name, model.architecture, arch.name)
        runs, excluded = gpu_exclusions(deployment, index)
        context = model.mix.input_tokens + model.mix.output_tokens
        sliding = derived.sliding_layers if derived is not None else 0
        facts.append({
            "name": model.name,
            "source": model.source,
            "derived_from": origin,
            "model_type": derived.model_type if derived is not None else None,
            "estimate": ("catalogue" if derived is None
                         else "generic" if derived.generic else "family"),
            "layers": arch.layers,
            # a mixture of experts: routed experts per MoE layer, and how many each token uses
            "experts": arch.experts,
            "active_experts": arch.active_experts if arch.experts else 0,
            "task": "embed" if model.embedding else "generate",
            "params_b": round(arch.params_b, 6),
            "active_params_b": round(arch.active_params_b, 6),
            "weight_gb": round(arch.weight_bytes / 1e9, 2),
            "kv_bytes_per_token": arch.kv_bytes_per_token,
            "attention": ("MLA" if derived is not None and derived.mla
                          else "MHA" if arch.kv_heads == arch.q_heads else "GQA"),
            "sliding_window": derived.sliding_window if derived is not None else None,
            "sliding_layers": sliding,
            # what the KV capacity charges per token of this model's mix (sliding layers hold
            # at most their window: coral_solver.perf.kv_tokens_at)
            "kv_bytes_per_token_at_mix": (round(derived.kv_bytes_per_token_at(context))
                                          if derived is not None and sliding
                                          else arch.kv_bytes_per_token),
            "mix_tokens": context,
            "dtype": derived.dtype if derived is not None else arch.quantization,
            "quantization": arch.quantization,
            "max_context": arch.max_context,
            "gpu_dtypes": runs,
            "excluded_gpus": excluded,
        })
    return facts
