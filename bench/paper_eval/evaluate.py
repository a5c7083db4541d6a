"""Trace-driven, event-based evaluation of one setup: re-plan every 6 minutes, serve every request.

One run (the paper's): 30 minutes, a re-plan at the start of every 6-minute epoch with that epoch's
demand (requests in the window / 360 s: an oracle forecast, the same for every method). Each plan
is re-verified by the independent checker (:mod:`coral_solver.check`). Then every request of the
epoch is served in virtual time by the replica it is routed to:

* **Routing**: a model's requests go to its plan rows in proportion to their planned capacity
  (smooth weighted round robin, as the gateway's weights), and round robin over a row's replicas.
  When a plan serves less than the demand, the gateway admits that share of the requests (evenly
  spread) and refuses the rest: refused requests count as missed.
* **Replica**: the sim engine's own scheduler (``coral_replica_sim.batching``: continuous batching,
  whole prompts in a step, KV-cache limit, preemption) and step times from :mod:`coral_solver.perf`,
  driven in virtual time (:mod:`coral_hpc.simulate.serve`). Replicas of one row receive
  statistically identical shares, so one per row is simulated and its figures count ``count``
  times. Each epoch's replicas start empty (the 6-minute epochs dwarf the warm-up).
* **Goodput**: output tokens per second of the requests that met both SLOs (TTFT and mean TPOT).
* **Cost per hour** (in the unit of :data:`.setups.PRICES`): provisioning (Σ replicas x price over
  each epoch) + amortised start-up: each replica that was not running in the previous epoch pays
  its price for ``STARTUP_S`` more, amortised over ``AMORTISE_S`` (the paper's 60 minutes: a
  tenth of it falls in the 6-minute epoch).

Because replica latencies come from the planner's own performance model, the SLO figures show
that plans keep their promises under the trace's burstiness (self-consistency), not that vLLM
would: that is for the real engine (issue 13 item 5).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from bench.paper_eval.setups import (
    MODELS,
    PRICES,
    Setup,
    base_gpu,
    nodes_for,
    regional,
    regional_types,
)
from bench.paper_eval.workload import RUN_S, ModelWorkload, model_workload
from coral_hpc.simulate.serve import _SERVED, Served
from coral_hpc.simulate.serve import serve_window as _serve_window
from coral_solver import baselines, perf
from coral_solver.allocate import allocate
from coral_solver.catalog import gpu_memory_gb
from coral_solver.check import check_plan
from coral_solver.templates import PerfThroughput, build_library
from coral_solver.types import (
    Cluster,
    ModelSpec,
    NodeGroup,
    Partition,
    Plan,
    Policy,
    RunningReplica,
    Template,
)

#: Re-plan interval, seconds (the paper's 6 minutes).
EPOCH_S = 360.0
#: Submit -> ready of a new replica, seconds: coral-hpc's configured default until it has learnt
#: its own (coral_hpc/config/policy.py ``startup_time_s``); the paper's start-up times are not
#: known here ("several minutes", PAPER.md §1).
STARTUP_S = 180.0
#: The interval the paper amortises initialization cost over, seconds (PAPER.md §5.3: 60
#: minutes, "i.e. divided by 10"): K = STARTUP_S / AMORTISE_S in Stage 2, and a replica's start
#: adds STARTUP_S x its price x EPOCH_S / AMORTISE_S to the run's cost.
AMORTISE_S = 3600.0
#: Nodes per (GPU type, region) of the "unlimited" cluster that prices C* (never binding).
UNLIMITED_NODES = 24
#: GPUs of every type offered in every region whatever the reference plan uses (one 8-GPU node).
FLOOR_GPUS = 8


class RegionalThroughput(PerfThroughput):
    """The performance model for regional GPU types (``h100@east`` is an H100); catalogue
    look-ups memoised (Stage 1 asks for them 10^4-10^5 times)."""

    def __init__(self) -> None:
        super().__init__()
        self._gpus: dict[str, object] = {}
        self._archs: dict[str, object] = {}

    def _gpu(self, gpu_type: str):
        if gpu_type not in self._gpus:
            self._gpus[gpu_type] = super()._gpu(base_gpu(gpu_type))
        return self._gpus[gpu_type]

    def _arch(self, model: ModelSpec):
        if model.arch not in self._archs:
            self._archs[model.arch] = super()._arch(model)
        return self._archs[model.arch]


# --------------------------------------------------------------------------- inputs


def workloads(setup: Setup, seed: int, folder) -> dict[str, ModelWorkload]:
    """Every model's 30 minutes of requests (seeded per model)."""
    out = {}
    for i, name in enumerate(setup.setting.models):
        pm = MODELS[name]
        out[name] = model_workload(
            name, pm.trace, pm.offset_s, setup.rate_of(name), seed + i, folder
        )
    return out


def model_specs(
    setup: Setup,
    loads: dict[str, ModelWorkload],
    demand: dict[str, float],
    disaggregation: str = "off",
) -> list[ModelSpec]:
    """The planner's view of the models: mix = the run's mean lengths, the epoch's demand."""
    out = []
    for name in setup.setting.models:
        pm = MODELS[name]
        n_in, n_out = loads[name].mean_mix()
        out.append(
            ModelSpec(
                name,
                pm.arch,
                n_in,
                n_out,
                pm.ttft_s,
                pm.tpot_s,
                demand_rps=round(demand[name], 4),
                disaggregation=disaggregation,
            )
        )
    return out


def regional_gpu_types(setup: Setup, region: str) -> dict[str, tuple[int, float]]:
    """Stage 1's GPU types of one region (those it offers): (largest node, GPU memory GB)."""
    return {
        regional(g, region): (max(8, 1), gpu_memory_gb(g) or 16.0)
        for g in setup.setting.region_gpus(region)
    }


def library_for(
    models: list[ModelSpec],
    setup: Setup,
    policy: Policy,
    tm: RegionalThroughput,
    use_cache: bool = True,
) -> dict[str, list[Template]]:
    """Stage 1 per region (no template spans two), united."""
    library: dict[str, list[Template]] = {m.name: [] for m in models}
    for region in setup.setting.regions:
        part = build_library(
            models, regional_gpu_types(setup, region), policy, tm, use_cache=use_cache
        )
        for name, templates in part.items():
            library[name].extend(templates)
    for templates in library.values():
        for t in templates:
            regions = {s.gpu_type.split("@")[1] for s in t.stages}
            if len(regions) != 1:  # Stage 1 is run per region: a template spans one
                raise RuntimeError(f"template {t.id} spans the regions {sorted(regions)}")
    return library


def cluster_for(
    setup: Setup, gpus: dict[str, int], running: tuple[RunningReplica, ...] = ()
) -> Cluster:
    """Node groups (one per regional GPU type and node shape) holding ``gpus`` GPUs per regional
    type; one partition per regional type, priced per GPU-hour."""
    groups, partitions = [], []
    for gpu_type, count in sorted(gpus.items()):
        gpu = base_gpu(gpu_type)
        names = []
        for size, n in sorted(Counter(nodes_for(count)).items()):
            name = f"{gpu_type}-x{size}"
            groups.append(
                NodeGroup(
                    name,
                    gpu_type,
                    size,
                    gpu_memory_gb(gpu) or 16.0,
                    tuple(f"{name}-{i:03d}" for i in range(n)),
                    (size,) * n,
                )
            )
            names.append(name)
        if names:
            partitions.append(Partition(gpu_type, tuple(names), prices={gpu_type: PRICES[gpu]}))
    return Cluster(tuple(groups), tuple(partitions), (), running)


def unlimited_cluster(setup: Setup) -> Cluster:
    """Every regional GPU type of the setting with ``UNLIMITED_NODES`` 8-GPU nodes (never
    binding): what prices the plans that size the availability."""
    return cluster_for(setup, {t: UNLIMITED_NODES * 8 for t in regional_types(setup.setting)})


def gpus_used(plan: Plan) -> Counter:
    """GPUs of each regional type in ``plan`` (each stage is one node of TP GPUs)."""
    used: Counter = Counter()
    for row in plan.rows:
        for stage in row.template.stages:
            used[stage.gpu_type] += row.count * row.template.tp
    return used


def availability(setup: Setup, reference: Plan, plans: dict[str, Plan] | None = None
                 ) -> dict[str, int]:
    """GPUs per regional type (the module doc of :mod:`.setups`). Default: the most any plan of
    ``plans`` (each method's plan for the run's peak demand on unlimited GPUs; ``reference``
    alone when None) uses of that regional type, plus one 8-GPU node. Scarce: (1 + the setting's
    margin) x what ``reference`` (the cheapest plan for the peak demand) uses of each GPU type,
    split evenly over the regions offering it."""
    types = regional_types(setup.setting)
    if setup.availability == "default":
        most: Counter = Counter()
        for plan in (plans or {"reference": reference}).values():
            most |= gpus_used(plan)
        return {t: FLOOR_GPUS + most[t] for t in types}
    per_gpu: Counter = Counter()
    for gpu_type, n in gpus_used(reference).items():
        per_gpu[base_gpu(gpu_type)] += n
    regions = Counter(base_gpu(t) for t in types)
    return {t: math.ceil((1.0 + setup.scarce_margin) * per_gpu[base_gpu(t)]
                         / regions[base_gpu(t)] - 1e-9)
            for t in types}


# --------------------------------------------------------------------------- methods

Method = Callable[[list[ModelSpec], dict[str, list[Template]], Cluster, Policy], Plan]


def _strategy(template: Template) -> tuple:
    """A template's layout with the region taken off (the same strategy in either region)."""
    return (template.tp, tuple((base_gpu(s.gpu_type), s.layers) for s in template.stages))


def _homo_strict(models, library, cluster, policy):
    return baselines.paper_homo(models, library, cluster, policy, strategy=_strategy)


@dataclass(frozen=True)
class MethodSpec:
    """How a method plans: its planner, whether it is told which replicas run (only Coral prices
    churn), and the models' disaggregation policy (``auto``: prefill/decode templates exist)."""

    plan: Method
    told_running: bool
    disaggregation: str = "off"
    #: True: plan on Stage 1 with the other PP accounting of prompts than the model's
    #: (``perf.PROMPTS_STALL_RING`` flipped): a what-if on that term; single-node templates are
    #: the same either way
    other_pp: bool = False

    @property
    def library(self) -> tuple[str, bool]:
        """Key of the Stage-1 library this method plans on."""
        return (self.disaggregation, not self.other_pp)


#: The paper's Homo ("per model the homogeneous strategy with the best goodput per cost,
#: greedily") read two ways: "homo" adds replicas of the best strategy that still fits, falling
#: back to the next when one runs out (= coral_solver.baselines.cauchy); "homo-strict" keeps one
#: strategy per model and stops when it fits no more. Cauchy's adaptation ranks per phase; with
#: no prefill/decode-only templates (disaggregation off) it is "homo". "+disagg": the same
#: method when every model may be disaggregated (Stage 1 builds prefill and decode templates).
#: WHAT_IF: Coral planning on the other PP accounting of prompts (``coral-no-ring-stall`` while
#: the model says prompts stall the pipeline ring, ``coral-ring-stall`` while it says they do
#: not), its replicas served by the same sim scheduler: how much that one term decides.
WHAT_IF = "coral-no-ring-stall" if perf.PROMPTS_STALL_RING else "coral-ring-stall"
#: what the what-if assumes, in words
WHAT_IF_TEXT = ("prompts did not stall the ring" if perf.PROMPTS_STALL_RING
                else "prompts stalled the ring")
METHODS: dict[str, MethodSpec] = {
    "coral": MethodSpec(allocate, True),
    "homo": MethodSpec(baselines.cauchy, False),
    "homo-strict": MethodSpec(_homo_strict, False),
    "cauchy": MethodSpec(baselines.cauchy_adapted, False),
    "homo-ilp": MethodSpec(baselines.homo, False),
    "melange-ilp": MethodSpec(baselines.melange, False),
    "coral+disagg": MethodSpec(allocate, True, "auto"),
    "cauchy+disagg": MethodSpec(baselines.cauchy_adapted, False, "auto"),
    WHAT_IF: MethodSpec(allocate, True, "off", other_pp=True),
}
PAPER_BASELINES = ("homo", "homo-strict", "cauchy")
ILP_BASELINES = ("homo-ilp", "melange-ilp")


# --------------------------------------------------------------------------- serving


def serve_window(plan: Plan, model: ModelSpec, load: ModelWorkload, start: float, sim_s: float,
                 warmup_s: float = 0.0) -> Served:
    """:func:`coral_hpc.simulate.serve.serve_window` (the one ``coral-hpc simulate`` serves
    with) with the paper's admission rule and its regional GPU types."""
    return _serve_window(plan, model, load, start, sim_s, warmup_s=warmup_s, admission=True,
                         gpu_of=base_gpu)


# --------------------------------------------------------------------------- one run


@dataclass
class MethodRun:
    """One method's run over a setup: per-epoch plans and what they served."""

    method: str
    cost_units: float = 0.0  # provisioning + start-up over the run (PRICES' unit x hours)
    startup_units: float = 0.0
    requests: Counter = field(default_factory=Counter)
    good: Counter = field(default_factory=Counter)
    good_tokens: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    missed_ttft: Counter = field(default_factory=Counter)  # served, over the TTFT
    missed_tpot: Counter = field(default_factory=Counter)  # served, over the TPOT
    plan_seconds: list[float] = field(default_factory=list)
    checker_problems: int = 0
    statuses: Counter = field(default_factory=Counter)
    #: cost-weighted shares of the plans: heterogeneous, multi-node, uncalibrated templates
    cost_hetero: float = 0.0
    cost_multinode: float = 0.0
    cost_uncalibrated: float = 0.0
    cost_disaggregated: float = 0.0
    plan_cost: float = 0.0
    templates: Counter = field(default_factory=Counter)  # template id -> replica-epochs
    #: provisioning per model over the run (PRICES' unit x hours): the per-model ratios
    model_cost: Counter = field(default_factory=Counter)

    def hourly_cost(self, run_s: float) -> float:
        return self.cost_units * 3600.0 / run_s


def _count(load: ModelWorkload, start: float) -> int:
    """Requests of ``load`` arriving in the epoch starting at ``start``."""
    window = load.window(start, start + EPOCH_S)
    return window.stop - window.start


#: The window of the burst figure, seconds: well under a TTFT-scale queue's drain time.
BURST_S = 10.0


def burstiness(load: ModelWorkload, epochs: int) -> float:
    """The highest ``BURST_S``-second arrival rate in an epoch ÷ that epoch's mean rate, over
    the run's epochs: how far above the planned (epoch-mean) demand the trace's bursts go."""
    worst = 0.0
    for e in range(epochs):
        start = e * EPOCH_S
        window = load.window(start, start + EPOCH_S)
        if window.stop == window.start:
            continue
        bins = np.histogram(load.at[window], bins=np.arange(start, start + EPOCH_S + 1e-9,
                                                            BURST_S))[0]
        worst = max(worst, bins.max() / BURST_S / ((window.stop - window.start) / EPOCH_S))
    return worst


def peak_demand(loads: dict[str, ModelWorkload]) -> dict[str, float]:
    """Each model's highest epoch demand over the run, requests/s."""
    return {
        name: max(_count(load, e * EPOCH_S) for e in range(int(RUN_S // EPOCH_S))) / EPOCH_S
        for name, load in loads.items()
    }


def reference_plan(setup: Setup, loads, library, policy, disaggregation: str = "off") -> Plan:
    """The cheapest plan (Coral's, on ``library`` built for ``disaggregation``) for the run's
    peak epoch demand on unlimited GPUs."""
    models = model_specs(setup, loads, peak_demand(loads), disaggregation)
    return allocate(models, library, unlimited_cluster(setup), policy)


def peak_plans(setup: Setup, methods: list[str], loads, libraries: dict[tuple[str, bool], dict],
               policy: Policy) -> dict[str, Plan]:
    """Each method's plan for the run's peak demand on unlimited GPUs (what sizes the default
    availability: every method must have a feasible plan)."""
    out = {}
    for method in methods:
        spec = METHODS[method]
        models = model_specs(setup, loads, peak_demand(loads), spec.disaggregation)
        out[method] = spec.plan(models, libraries[spec.library], unlimited_cluster(setup), policy)
    return out


def run_setup(
    setup: Setup,
    methods: list[str],
    loads,
    libraries: dict[tuple[str, bool], dict],
    policy,
    gpus: dict[str, int],
    tm,
    sim_s: float,
    epochs: int,
    log=print,
) -> dict[str, MethodRun]:
    """Every method over the same epochs, demand and availability; ``libraries`` by
    :attr:`MethodSpec.library` key."""
    _SERVED.clear()
    runs = {}
    for method in methods:
        spec = METHODS[method]
        library = libraries[spec.library]
        run = MethodRun(method)
        previous: Counter = Counter()
        running: tuple[RunningReplica, ...] = ()
        for e in range(epochs):
            start = e * EPOCH_S
            demand = {name: _count(load, start) / EPOCH_S for name, load in loads.items()}
            models = model_specs(setup, loads, demand, spec.disaggregation)
            cluster = cluster_for(setup, gpus, running if spec.told_running else ())
            began = time.perf_counter()
            plan = spec.plan(models, library, cluster, policy)
            run.plan_seconds.append(time.perf_counter() - began)
            run.statuses[plan.status] += 1
            # the what-if library disagrees with the shipped model by design: there the checker
            # re-verifies placement, prices, demand and limits, not the templates' throughput
            run.checker_problems += len(
                check_plan(plan, models, replace(cluster, running=()),
                           None if spec.other_pp else library, None if spec.other_pp else tm)
            )
            now = Counter()
            for row in plan.rows:
                now[(row.template.id, row.partitions)] += row.count
            new_cost = sum(
                max(0, row.count - previous[(row.template.id, row.partitions)]) * row.cost_per_hour
                for row in plan.rows
            )
            run.startup_units += new_cost * STARTUP_S / 3600.0 * EPOCH_S / AMORTISE_S
            run.cost_units += plan.cost_per_hour * EPOCH_S / 3600.0
            for row in plan.rows:
                c = row.count * row.cost_per_hour
                run.plan_cost += c
                run.cost_hetero += c * row.template.heterogeneous
                run.cost_multinode += c * (row.template.pp > 1)
                run.cost_uncalibrated += c * (not row.template.calibrated)
                run.cost_disaggregated += c * (row.role != "both")
                run.templates[row.template.id] += row.count
                run.model_cost[row.template.model] += c * EPOCH_S / 3600.0
            previous = now
            running = tuple(RunningReplica(tid, parts, n) for (tid, parts), n in now.items())
            for model in models:
                load = loads[model.name]
                # the sample: sim_s seconds in the middle of the epoch, extrapolated to all of
                # the epoch's requests and output tokens (not by time: the rate varies)
                sample = serve_window(plan, model, load, start + (EPOCH_S - sim_s) / 2, sim_s)
                epoch = load.window(start, start + EPOCH_S)
                n, tokens = epoch.stop - epoch.start, int(load.output[epoch].sum())
                run.requests[model.name] += n
                if sample.requests:
                    run.good[model.name] += n * sample.good / sample.requests
                    run.refused[model.name] += n * sample.refused / sample.requests
                    run.missed_ttft[model.name] += n * sample.missed_ttft / sample.requests
                    run.missed_tpot[model.name] += n * sample.missed_tpot / sample.requests
                if sample.output_tokens:
                    run.good_tokens[model.name] += (
                        tokens * sample.good_output_tokens / sample.output_tokens
                    )
            log(
                f"    {method:12s} epoch {e}: {plan.status:8s} {plan.cost_per_hour:8.2f}/h "
                f"plan {run.plan_seconds[-1]:.2f}s"
            )
        run.cost_units += run.startup_units
        runs[method] = run
    _SERVED.clear()
    return runs


def library_classes(
    library: dict[str, list[Template]], models: list[ModelSpec], role: str | None = None
) -> dict[str, dict[str, float]]:
    """Per model, the best requests/s per unit of cost of its templates by class (single-node
    homogeneous, multi-node homogeneous, heterogeneous), over the library (``role``: only the
    templates of that role, "both", "prefill" or "decode"): why Coral picks what it picks."""
    out = {}
    for model in models:
        best = {"single-node": 0.0, "multi-node": 0.0, "heterogeneous": 0.0}
        for t in library.get(model.name, []):
            if role is not None and t.role != role:
                continue
            cost = sum(PRICES[base_gpu(s.gpu_type)] * t.tp for s in t.stages)
            key = (
                "heterogeneous"
                if t.heterogeneous
                else ("multi-node" if t.pp > 1 else "single-node")
            )
            best[key] = max(best[key], t.throughput / cost)
        out[model.name] = best
    return out


def library_other_pp(
    models: list[ModelSpec], setup: Setup, policy: Policy
) -> dict[str, list[Template]]:
    """Stage 1 on the other PP accounting of prompts (``perf.PROMPTS_STALL_RING`` flipped): how
    much that term decides (not cached: the flag is no file)."""
    saved = perf.PROMPTS_STALL_RING
    perf.PROMPTS_STALL_RING = not saved
    perf.configure()
    try:
        return library_for(models, setup, policy, RegionalThroughput(), use_cache=False)
    finally:
        perf.PROMPTS_STALL_RING = saved
        perf.configure()


def summary(setup: Setup, runs: dict[str, MethodRun], run_s: float) -> dict:
    """JSON-ready figures of one setup's runs."""
    out = {}
    for name, run in runs.items():
        requests = sum(run.requests.values())
        out[name] = {
            "cost_per_hour": round(run.hourly_cost(run_s), 3),
            "startup_per_hour": round(run.startup_units * 3600.0 / run_s, 3),
            "goodput_tok_s": round(sum(run.good_tokens.values()) / run_s, 1),
            "slo_attainment": round(sum(run.good.values()) / requests, 4) if requests else 0.0,
            "refused_share": round(sum(run.refused.values()) / requests, 4) if requests else 0.0,
            "per_model": {
                m: {
                    "cost_per_hour": round(run.model_cost[m] * 3600.0 / run_s, 3),
                    **{key: round(c[m] / run.requests[m], 4) if run.requests[m] else 0.0
                       for key, c in (("refused_share", run.refused),
                                      ("ttft_missed_share", run.missed_ttft),
                                      ("tpot_missed_share", run.missed_tpot))},
                    "goodput_tok_s": round(run.good_tokens[m] / run_s, 1),
                    "slo_attainment": round(run.good[m] / run.requests[m], 4)
                    if run.requests[m]
                    else 0.0,
                }
                for m in setup.setting.models
            },
            "plan_seconds_max": round(max(run.plan_seconds), 3),
            "statuses": dict(run.statuses),
            "checker_problems": run.checker_problems,
            "share_heterogeneous": round(run.cost_hetero / run.plan_cost, 4)
            if run.plan_cost
            else 0.0,
            "share_multinode": round(run.cost_multinode / run.plan_cost, 4)
            if run.plan_cost
            else 0.0,
            "share_uncalibrated": round(run.cost_uncalibrated / run.plan_cost, 4)
            if run.plan_cost
            else 0.0,
            "share_disaggregated": (
                round(run.cost_disaggregated / run.plan_cost, 4) if run.plan_cost else 0.0
            ),
            "templates": dict(run.templates.most_common(8)),
        }
    return out


def cost_per_goodput(s: dict) -> float:
    """$ per hour per (goodput token/s): the figure that stays fair when goodputs differ."""
    return s["cost_per_hour"] / s["goodput_tok_s"] if s["goodput_tok_s"] > 0 else float("inf")


__all__ = [
    "EPOCH_S",
    "METHODS",
    "STARTUP_S",
    "RegionalThroughput",
    "availability",
    "cluster_for",
    "library_classes",
    "library_for",
    "library_other_pp",
    "WHAT_IF",
    "WHAT_IF_TEXT",
    "model_specs",
    "reference_plan",
    "run_setup",
    "summary",
    "workloads",
]
