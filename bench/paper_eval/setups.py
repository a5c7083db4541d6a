"""The Coral paper's evaluation setups (arXiv 2605.04357, §6) as data, rebuilt for this solver.

What could be checked here and what is a reconstruction (every choice is printed with the results):

* **Paper figures** quoted by issue 13 (read from the paper by the issue's author): cost ratios
  core default 1.62x vs Homo / 1.60x vs Cauchy, extended default 3.14x / 2.66x, Large-Heavy
  extended 2.79x, Small-Heavy core ~1.1x; 6 models, 20 GPU configurations; 10 req/s per model in
  the core setting, 25 in the extended one; 30-minute runs, re-plans every 6 minutes; default and
  scarce availability (25 % / 75 % above demand); traces Azure code, Azure conversation, BurstGPT.
* **Not obtainable here**: the paper's Table 1 (GPU types, relative prices) and Table 3 (models,
  SLOs, trace per model) — only the paper's abstract is in the stored corpus. So: the GPU types
  are five the catalogue has and the issue names (H100, A100-80GB, L40S, A10G, L4), x node shapes
  {1, 2, 4, 8} = 20 configurations; prices are per-GPU on-demand list prices (see ``PRICES``);
  the six models are the catalogue's paper models (Qwen3-8B/32B/235B-A22B, gpt-oss-20b/120b,
  Llama-3.1-70B); SLOs scale with model size (``MODELS``); BurstGPT is not obtainable
  (../shared/data/traces/burstgpt/README.md), so its models replay the Azure conversation trace
  from another offset (its request lengths are chat-like, like BurstGPT's).
* **Availability** "m above demand": of every GPU type, (1 + m) x what the cheapest plan for the
  run's peak 6-minute demand uses on unlimited GPUs, split evenly over the two regions, plus one
  8-GPU node per type and region (so all 20 configurations are offered); m = 75 % (default) or
  25 % (scarce). Reading: the issue writes "default and scarce availability (25 % / 75 % above
  demand)"; we take the larger margin as the default (the scarce setting must be the tighter).
* **Regions** are separate locality domains: GPU types carry a region suffix (``h100@east``) and
  Stage 1 runs per region, so no template spans two regions.
"""

from __future__ import annotations

from dataclasses import dataclass

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

#: Node shapes the paper offers: GPUs per node (instance).
NODE_SHAPES = (1, 2, 4, 8)
#: Two regions; each is its own locality domain.
REGIONS = ("east", "west")

#: Trace of each model: (trace, row offset). "burstgpt->conv" marks BurstGPT's stand-in.
TRACES = {
    "azure-code": "Azure LLM 2023 code",
    "azure-conv": "Azure LLM 2023 conversation",
    "burstgpt->conv": "BurstGPT (not obtainable) -> Azure LLM 2023 conversation, other offset",
}


@dataclass(frozen=True)
class PaperModel:
    """One served model: catalogue arch, trace, SLOs, and its size class for the demand skews."""

    name: str
    arch: str
    trace: str  #: key of TRACES
    offset_s: float  #: where in the trace its 30-minute slice starts (seconds from the first row)
    ttft_s: float
    tpot_s: float
    size: str  #: "small" | "medium" | "large"


#: TTFT / TPOT by size (reconstruction): small 1.0 s / 50 ms, medium 2.0 s / 80 ms,
#: large 3.0 s / 100 ms.
MODELS = {
    "qwen3-8b": PaperModel("qwen3-8b", "qwen3-8b", "azure-conv", 0.0, 1.0, 0.05, "small"),
    "qwen3-32b": PaperModel("qwen3-32b", "qwen3-32b", "azure-code", 0.0, 2.0, 0.08, "medium"),
    "llama-3.1-70b": PaperModel(
        "llama-3.1-70b", "llama-3.1-70b", "burstgpt->conv", 1500.0, 3.0, 0.10, "large"
    ),
    "gpt-oss-20b": PaperModel(
        "gpt-oss-20b", "gpt-oss-20b", "azure-code", 1200.0, 1.0, 0.05, "small"
    ),
    "gpt-oss-120b": PaperModel(
        "gpt-oss-120b", "gpt-oss-120b", "burstgpt->conv", 600.0, 2.0, 0.08, "medium"
    ),
    "qwen3-235b": PaperModel(
        "qwen3-235b", "qwen3-235b-a22b", "azure-conv", 1800.0, 3.0, 0.10, "large"
    ),
}

#: Demand skews: multiplier per size class (total over a setup's models stays about the same).
DEMAND_SKEWS = {
    "default": {"small": 1.0, "medium": 1.0, "large": 1.0},
    "large-heavy": {"small": 0.5, "medium": 1.0, "large": 1.5},
    "small-heavy": {"small": 1.5, "medium": 1.0, "large": 0.5},
}

#: Availability margins above demand (see the module doc).
AVAILABILITY = {"default": 0.75, "scarce": 0.25}


@dataclass(frozen=True)
class Setting:
    """Core or extended: which models, which GPU types, the mean rate per model."""

    name: str
    models: tuple[str, ...]
    gpu_types: tuple[str, ...]
    rate_rps: float


SETTINGS = {
    "core": Setting(
        "core", ("qwen3-8b", "qwen3-32b", "llama-3.1-70b"), ("h100", "a100-80g", "l40s"), 10.0
    ),
    "extended": Setting("extended", tuple(MODELS), tuple(PRICES), 25.0),
}


@dataclass(frozen=True)
class Setup:
    """One table of the results: setting x demand skew x availability."""

    setting: Setting
    demand: str  #: key of DEMAND_SKEWS
    availability: str  #: key of AVAILABILITY

    @property
    def name(self) -> str:
        return f"{self.setting.name} / {self.demand} / {self.availability}"

    def rate_of(self, model: str) -> float:
        """Mean requests/s of ``model`` over the run."""
        return self.setting.rate_rps * DEMAND_SKEWS[self.demand][MODELS[model].size]


#: The setups the paper reports (and the issue lists): both settings at default demand with
#: both availabilities, Large-Heavy and Small-Heavy with default availability.
SETUPS = tuple(
    Setup(SETTINGS[s], d, a)
    for s, d, a in (
        ("core", "default", "default"),
        ("core", "default", "scarce"),
        ("core", "large-heavy", "default"),
        ("core", "small-heavy", "default"),
        ("extended", "default", "default"),
        ("extended", "default", "scarce"),
        ("extended", "large-heavy", "default"),
        ("extended", "small-heavy", "default"),
    )
)

#: The paper's cost ratios (Coral's cost advantage) as quoted in issue 13; None = not quoted.
PAPER_RATIOS: dict[tuple[str, str, str], dict[str, float]] = {
    ("core", "default", "default"): {"homo": 1.62, "cauchy": 1.60},
    ("extended", "default", "default"): {"homo": 3.14, "cauchy": 2.66},
    ("extended", "large-heavy", "default"): {"best baseline": 2.79},
    ("core", "small-heavy", "default"): {"best baseline": 1.1},
}


def regional(gpu: str, region: str) -> str:
    """The GPU type name of ``gpu`` in ``region`` (its own locality domain)."""
    return f"{gpu}@{region}"


def base_gpu(gpu_type: str) -> str:
    """The catalogue GPU name of a regional GPU type (``h100@east`` -> ``h100``)."""
    return gpu_type.split("@", 1)[0]


def nodes_for(gpus: int) -> list[int]:
    """Node sizes holding ``gpus`` GPUs: as many 8-GPU nodes as fit, the rest in 4/2/1 shapes."""
    out = []
    left = gpus
    for size in sorted(NODE_SHAPES, reverse=True):
        while left >= size:
            out.append(size)
            left -= size
    return out
