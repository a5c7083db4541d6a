"""The site of the scale run: 1,000 GPU nodes of five types in overlapping partitions, and 50
models drawn from the catalogue — as a Slurm snapshot and a ``models.yaml`` the daemon's own
planner reads.

Every choice is data here, printed with the results:

* **Nodes** (:data:`NODE_CLASSES`): 120 H100x8, 180 A100-80GBx8, 200 L40Sx4, 200 A10Gx4 and
  300 L4x8 nodes (6,400 GPUs). A made-up but ordinary mix: a few big-GPU nodes for large models,
  many small-GPU nodes. Each node has 16 CPUs and 128 GB per GPU, so the replica job shape
  (4 CPUs, 32 GB per GPU, the config default) never binds before the GPUs do.
* **Partitions** overlap as on real sites: one per big GPU type (``h100``, ``a100``, ``l40s``),
  ``small`` for A10G + L4, and ``gpu`` over every H100, A100 and L40S node. Prices are per-GPU
  on-demand list prices in USD (:data:`PRICES`, those the paper evaluation used before it took
  the paper's relative costs), the same in every partition holding a type.
* **Models** (:func:`draw_models`): 50 names ``<arch>-t<NN>`` (tenants' fine-tunes), their
  architectures drawn (seeded) from the catalogue's nine real ones by size class — half small
  (≤ 21 B), 30 % medium (32-120 B), 20 % large (70 B dense, 235 B MoE) — with an SLO per size
  class (:data:`SLO_BY_SIZE`). Popularity is Zipf (exponent 1) over a seeded shuffle: the
  busiest model has ~8x the mean rate, the quietest ~0.2x.
* **Traces** per model (:func:`draw_models`): Azure LLM 2023 conversation or code, or Mooncake
  conversation (long prompts) — Mooncake only for the 128k-context architectures, since its
  prompts run to 126k tokens.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from coral_hpc.config import Deployment, parse_deployment
from coral_hpc.demand import deployment_demand
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.slurm.build import build_node_groups
from coral_hpc.slurm.snapshot import ClusterSnapshot, NodeInfo, PartitionInfo
from coral_solver import catalog

#: Site name: the deployment name and the node-name prefix.
SITE = "scale"
CPUS_PER_GPU_ON_NODE = 16
MEM_GB_PER_GPU_ON_NODE = 128


@dataclass(frozen=True)
class NodeClass:
    """``count`` identical nodes."""

    gpu_type: str
    gpus_per_node: int
    count: int
    partitions: tuple[str, ...]


NODE_CLASSES: tuple[NodeClass, ...] = (
    NodeClass("h100", 8, 120, ("h100", "gpu")),
    NodeClass("a100-80g", 8, 180, ("a100", "gpu")),
    NodeClass("l40s", 4, 200, ("l40s", "gpu")),
    NodeClass("a10g", 4, 200, ("small",)),
    NodeClass("l4", 8, 300, ("small",)),
)

#: Architectures by size class (the catalogue's real models).
ARCHS_BY_SIZE: dict[str, tuple[str, ...]] = {
    "small": ("llama-3.1-8b", "qwen3-8b", "phi-4", "gpt-oss-20b"),
    "medium": ("qwen3-32b", "mixtral-8x7b", "gpt-oss-120b"),
    "large": ("llama-3.1-70b", "qwen3-235b-a22b"),
}
SIZE_SHARES = {"small": 0.5, "medium": 0.3, "large": 0.2}
#: TTFT / TPOT per size class, s: the scale run's own choice (the values the paper evaluation
#: used before it had the paper's Table 3, kept so the scale run's site stays the one reported).
SLO_BY_SIZE: dict[str, tuple[float, float]] = {
    "small": (1.0, 0.05),
    "medium": (2.0, 0.08),
    "large": (3.0, 0.10),
}
#: Per-GPU on-demand prices, USD per GPU-hour (AWS us-east-1 list prices, per GPU of the instance
#: named). g5.xlarge $1.006/h is confirmed by a stored page (factualminds.com, "Amazon EC2
#: On-Demand Pricing ... 2026"); the others are AWS list prices as published by AWS in 2025
#: [not re-checked here: the price pages are not in the stored corpus].
PRICES: dict[str, float] = {
    "h100": 55.04 / 8,  # p5.48xlarge, 8x H100-SXM (after AWS's June 2025 price cut)
    "a100-80g": 40.966 / 8,  # p4de.24xlarge, 8x A100-80GB
    "l40s": 1.861,  # g6e.xlarge, 1x L40S
    "a10g": 1.006,  # g5.xlarge, 1x A10G
    "l4": 0.805,  # g6.xlarge, 1x L4
}
PRICE_SOURCE = (
    "AWS on-demand us-east-1 list prices per GPU (p5.48xlarge/8, p4de.24xlarge/8, "
    "g6e.xlarge, g5.xlarge, g6.xlarge); only g5.xlarge re-checked here"
)
TRACES = ("azure-conv", "azure-code", "mooncake")
#: Mooncake's prompts reach 126k tokens: only architectures that take 128k contexts serve it.
LONG_CONTEXT = 131072


@dataclass(frozen=True)
class SiteModel:
    """One served model: catalogue architecture, size class, trace, where its day starts in the
    trace (fraction of the trace's span) and its mean rate over the day."""

    name: str
    arch: str
    size: str
    trace: str
    phase: float
    mean_rps: float

    @property
    def slo(self) -> tuple[float, float]:
        return SLO_BY_SIZE[self.size]


def draw_models(n: int, total_rps: float, seed: int = 0) -> list[SiteModel]:
    """``n`` models whose mean rates sum to ``total_rps`` (see the module doc)."""
    if n < 1 or total_rps <= 0:
        raise ValueError(f"need n ≥ 1 models and total_rps > 0, got {n} and {total_rps}")
    rng = np.random.default_rng(seed)
    sizes = list(SIZE_SHARES)
    weights = 1.0 / np.arange(1, n + 1)
    popularity = rng.permutation(weights / weights.sum() * total_rps)
    out = []
    for i in range(n):
        size = sizes[rng.choice(len(sizes), p=list(SIZE_SHARES.values()))]
        arch = ARCHS_BY_SIZE[size][rng.integers(len(ARCHS_BY_SIZE[size]))]
        traces = [t for t in TRACES
                  if t != "mooncake" or catalog.model_arch(arch).max_context >= LONG_CONTEXT]
        out.append(SiteModel(f"{arch}-t{i:02d}", arch, size, traces[rng.integers(len(traces))],
                             float(rng.uniform()), float(popularity[i])))
    _check_models(out, n, total_rps)
    return out


def _check_models(models: list[SiteModel], n: int, total_rps: float) -> None:
    """What the run's report assumes of the drawn models; RuntimeError naming what broke (a
    change to the drawing, not bad input)."""
    if len({m.name for m in models}) != n:
        raise RuntimeError(f"draw_models: {n} models drawn with duplicate names")
    if abs(sum(m.mean_rps for m in models) - total_rps) > 1e-6 * total_rps:
        raise RuntimeError(f"draw_models: rates sum to {sum(m.mean_rps for m in models)}, "
                           f"not {total_rps}")
    short = [m.name for m in models if m.trace == "mooncake"
             and catalog.model_arch(m.arch).max_context < LONG_CONTEXT]
    if short:
        raise RuntimeError(f"draw_models: Mooncake's long prompts given to {short}, whose "
                           f"context is under {LONG_CONTEXT}")


def partitions() -> dict[str, tuple[str, ...]]:
    """Partition name → its GPU types, in first-seen order."""
    out: dict[str, list[str]] = {}
    for cls in NODE_CLASSES:
        for part in cls.partitions:
            out.setdefault(part, [])
            if cls.gpu_type not in out[part]:
                out[part].append(cls.gpu_type)
    return {name: tuple(types) for name, types in out.items()}


def snapshot(observed_at: float = 0.0) -> ClusterSnapshot:
    """The site as the daemon's observe step would see it with every node idle: all GPUs free
    (the replicas that go on serving count theirs as available either way)."""
    nodes = []
    for cls in NODE_CLASSES:
        memory = catalog.gpu_memory_gb(cls.gpu_type)
        for i in range(cls.count):
            nodes.append(NodeInfo(
                name=f"{cls.gpu_type}-{i:04d}", state="idle", slurm_state="IDLE", reason=None,
                partitions=cls.partitions, gpu_type=cls.gpu_type, gpus_total=cls.gpus_per_node,
                gpus_alloc=0, gpus_free=cls.gpus_per_node, gpu_memory_gb=memory,
                cpus=CPUS_PER_GPU_ON_NODE * cls.gpus_per_node, cpus_alloc=0,
                mem_gb=float(MEM_GB_PER_GPU_ON_NODE * cls.gpus_per_node), mem_alloc_gb=0.0))
    parts = tuple(
        PartitionInfo(name=name, state="up",
                      nodes=tuple(n.name for n in nodes if name in n.partitions),
                      gpu_types=types, max_time_s=None, billing_weights={})
        for name, types in partitions().items())
    nodes_t = tuple(nodes)
    return ClusterSnapshot(slurm_version="virtual", observed_at=observed_at, deployment=SITE,
                           backend="virtual", nodes=nodes_t, partitions=parts,
                           node_groups=build_node_groups(nodes_t, parts), jobs=())


def deployment(models: list[SiteModel], mixes: dict[str, tuple[int, int]],
               policy: dict) -> Deployment:
    """The site's ``models.yaml``: every partition priced per GPU-hour, every model with
    ``demand: auto`` (measured at the gateway, as the daemon meters it) and ``mix`` its trace's
    mean lengths (used until the first requests are measured)."""
    doc = {
        "deployment": SITE,
        "state_dir": "/nonexistent/scale-state",
        "db_path": "/nonexistent/scale.db",
        "cluster": {
            "slurm": {"backend": "cli"},
            "partitions": [{"name": name, "gpu_types": list(types),
                            "price": {g: PRICES[g] for g in types}}
                           for name, types in partitions().items()],
        },
        "engine": {"kind": "sim"},
        "policy": policy,
        "models": [{
            "name": m.name, "source": f"site/{m.name}", "architecture": m.arch,
            "mix": {"input_tokens": mixes[m.name][0], "output_tokens": mixes[m.name][1]},
            "demand": "auto", "slo": {"ttft_s": m.slo[0], "tpot_s": m.slo[1]},
        } for m in models],
    }
    return parse_deployment(yaml.safe_dump(doc, sort_keys=False), "<scale site>")


def check_site(site: Deployment) -> None:
    """The site as the daemon's planner reads it (its inputs, as ``serve`` builds them) is
    :data:`NODE_CLASSES`: every node once, every GPU free, each partition priced as
    :data:`PRICES` says, the catch-all ``gpu`` partition over the typed ones. RuntimeError naming
    what differs, before a day is run on a site other than the one reported."""
    request = PlanRequest(site, snapshot(), deployment_demand(site, []), (), frozenset(),
                          frozenset(), site.policy.startup_time_s)
    _, cluster, _ = Planner().inputs(request)
    nodes = [n for g in cluster.node_groups for n in g.nodes]
    groups = {g.name: g for g in cluster.node_groups}
    parts = {p.name: p for p in cluster.partitions}
    members = {name: {n for g in p.node_groups for n in groups[g].nodes}
               for name, p in parts.items()}
    problems = []
    if len(nodes) != len(set(nodes)) or len(nodes) != total_nodes():
        problems.append(f"{len(nodes)} nodes ({len(set(nodes))} distinct), not {total_nodes()}")
    free = sum(sum(g.free) for g in cluster.node_groups)
    if free != total_gpus():
        problems.append(f"{free} free GPUs, not {total_gpus()}")
    for name, types in partitions().items():
        for gpu in types:
            if not math.isclose(parts[name].gpu_hour_cost(gpu), PRICES[gpu]):
                problems.append(f"partition {name} prices {gpu} at "
                                f"{parts[name].gpu_hour_cost(gpu)}, not {PRICES[gpu]}")
    typed = {p for cls in NODE_CLASSES if "gpu" in cls.partitions for p in cls.partitions} - {"gpu"}
    if not all(members[p] < members["gpu"] for p in typed):
        problems.append(f"the catch-all gpu partition does not hold all of {sorted(typed)}")
    if problems:
        raise RuntimeError("the planner reads another site than NODE_CLASSES: "
                           + "; ".join(problems))


def total_nodes() -> int:
    return sum(c.count for c in NODE_CLASSES)


def total_gpus() -> int:
    return sum(c.count * c.gpus_per_node for c in NODE_CLASSES)


def traces_folder(given: str | None, script: str) -> Path:
    """``--traces``, ``$CORAL_TRACES_DIR``, or ../shared/data/traces beside the checkout (or a
    worktree of it); ``script`` names the caller in the error when none is found."""
    for candidate in (given, os.environ.get("CORAL_TRACES_DIR")):
        if candidate:
            return Path(candidate)
    root = Path(__file__).resolve().parents[2]
    for base in (root.parent, root.parents[1]):
        if (base / "shared/data/traces").is_dir():
            return base / "shared/data/traces"
    raise SystemExit(f"{script}: ../shared/data/traces was not found beside the checkout; "
                     "pass --traces DIR or set CORAL_TRACES_DIR")
