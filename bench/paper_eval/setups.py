"""The Coral paper's evaluation setups (arXiv 2605.04357v1, §6) as data: ../shared/PAPER.md §5.

What is the paper's own (PAPER.md §5.1-§5.3, [P]) and what is still a reconstruction (every
choice is printed with the results):

* **Models and SLOs** (Table 3): Phi-4 14B (1200 ms prefill / 60 ms decode, Azure Conversation),
  GPT-OSS 20B (900 / 30, Azure Code), Qwen3 32B (1600 / 100, BurstGPT) in the core setup; the
  extended one adds Llama3 70B (1500 / 80, BurstGPT), GPT-OSS 120B (1000 / 40, Azure
  Conversation) and Qwen3 235B (1800 / 120, Azure Code). The prefill SLO is read as TTFT and the
  decode SLO as TPOT (PAPER.md marks this reading [I]). Llama3 70B is the catalogue's
  ``llama-3.1-70b``: the same layer shapes as Llama-3-70B (80 layers, hidden 8192, 64/8 heads,
  FFN 28672, vocab 128256; Hugging Face config.json of both), only a longer context.
* **BurstGPT is not obtainable** (../shared/data/traces/burstgpt/README.md): its models replay
  the Azure LLM 2023 conversation trace from another offset (chat-like lengths, as BurstGPT's).
  The 30-minute slice of each trace (``offset_s``) is ours: the paper does not say which.
* **GPUs and prices** (Table 1): core = {L40S, L4, A10G} x {1, 2, 4, 8} GPUs per node (12
  configurations); extended adds {H100, A100} x {1, 2, 4, 8} (20). Table 1's A100 is the 80 GB
  one (catalogue ``a100-80g``). Prices are Table 1's **relative costs** (L4 = 1.0, the mean hourly
  price over AWS, GCP and RunPod): the paper prices nodes at real regional rates but tabulates
  only these, so every cost here is in L4-GPU-hours per hour and the same in every region.
  Cost ratios are unaffected by the unit; absolute costs are not comparable with the paper's.
* **Regions** (§5.2): core = AWS US-East-2 and AP-Northeast-2; extended adds GCP US-Central-1.
  Each is a separate locality domain (GPU types carry a region suffix, ``l40s@us-east-2``, and
  Stage 1 runs per region). GCP offers no L40S or A10G (Table 1's A/G/R columns), so the GCP
  region offers H100, A100 and L4 only (our reading of Table 1, not a sentence of the paper).
* **Load** (§5.3): every model 10 req/s (core) or 25 req/s (extended) on average. Large-Heavy:
  the top third of the models by size gets 80 % of the requests (core: Qwen3 32B; extended:
  Qwen3 235B + GPT-OSS 120B, split equally); Small-Heavy: the bottom third gets 80 % (core:
  Phi-4; extended: Phi-4 + GPT-OSS 20B). Ours: the total rate stays the default's and the other
  20 % is split equally over the other models (the paper gives only the 80 %).
* **Availability** follows Alibaba's GPU-cluster trace in the paper; its per-type availability
  over time is not obtainable here (../shared/data/traces/alibaba-derived/README.md: only static
  capacities). So: **default** = the GPUs of each regional type that the most demanding method
  uses when it plans the run's peak demand on unlimited GPUs, plus one 8-GPU node per type and
  region (every configuration offered): every method has a feasible plan, as the paper's default
  is defined. **Scarce** = (1 + m) x what the cheapest plan (Coral's) for the peak demand uses of
  each GPU type, split evenly over the regions offering it, with m = 25 % (core) and 75 %
  (extended), the paper's margins above estimated demand (the paper: "tight but feasible").
* **Run** (§5.3): 30 minutes, a re-plan every 6 minutes; the initialization cost is amortised
  over 60 minutes (K = start-up time / 60 min, and a start pays a tenth of its start-up cost).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Table 1 relative cost per GPU (mean hourly price on AWS/GCP/RunPod, normalized to L4 = 1.0).
PRICES: dict[str, float] = {
    "h100": 7.6,
    "a100-80g": 3.5,
    "l40s": 2.2,
    "l4": 1.0,
    "a10g": 1.2,
}
PRICE_UNIT = "L4-hours/h"
PRICE_SOURCE = (
    "Table 1 relative costs (mean hourly price over AWS, GCP and RunPod, L4 = 1.0), per GPU; "
    "the paper does not tabulate its regional $/h rates, so costs here are in L4-GPU-hours per "
    "hour, the same in every region"
)

#: Node shapes the paper offers: GPUs per node.
NODE_SHAPES = (1, 2, 4, 8)
CORE_GPUS = ("l40s", "l4", "a10g")
EXTENDED_GPUS = ("h100", "a100-80g", "l40s", "l4", "a10g")
#: GPU types each region offers (Table 1's A/G/R columns: GCP has no L40S or A10G).
REGION_GPUS: dict[str, tuple[str, ...]] = {
    "us-east-2": EXTENDED_GPUS,  # AWS
    "ap-northeast-2": EXTENDED_GPUS,  # AWS
    "us-central-1": ("h100", "a100-80g", "l4"),  # GCP
}

TRACES = {
    "azure-code": "Azure LLM 2023 code",
    "azure-conv": "Azure LLM 2023 conversation",
    "burstgpt->conv": "BurstGPT (not obtainable) -> Azure LLM 2023 conversation, other offset",
}


@dataclass(frozen=True)
class PaperModel:
    """One served model of Table 3: catalogue arch, trace, SLOs, its parameters (for the
    demand skews, which rank the models by size)."""

    name: str
    arch: str
    trace: str  #: key of TRACES
    offset_s: float  #: where in the trace its 30-minute slice starts (ours, not the paper's)
    ttft_s: float  #: Table 3 prefill SLO
    tpot_s: float  #: Table 3 decode SLO
    params_b: float  #: the size in the model's name (Table 3)


#: Table 3.
MODELS = {
    "phi-4-14b": PaperModel("phi-4-14b", "phi-4", "azure-conv", 0.0, 1.2, 0.060, 14),
    "gpt-oss-20b": PaperModel("gpt-oss-20b", "gpt-oss-20b", "azure-code", 0.0, 0.9, 0.030, 20),
    "qwen3-32b": PaperModel("qwen3-32b", "qwen3-32b", "burstgpt->conv", 1500.0, 1.6, 0.100, 32),
    "llama3-70b": PaperModel("llama3-70b", "llama-3.1-70b", "burstgpt->conv", 600.0, 1.5, 0.080,
                             70),
    "gpt-oss-120b": PaperModel("gpt-oss-120b", "gpt-oss-120b", "azure-conv", 1200.0, 1.0, 0.040,
                               120),
    "qwen3-235b": PaperModel("qwen3-235b", "qwen3-235b-a22b", "azure-code", 1800.0, 1.8, 0.120,
                             235),
}

#: Share of all requests the heavy third of the models gets (§5.3, Large-/Small-Heavy).
HEAVY_SHARE = 0.8
DEMANDS = ("default", "large-heavy", "small-heavy")
#: Scarce availability: margin above estimated demand per setting (§5.3).
SCARCE_MARGIN = {"core": 0.25, "extended": 0.75}
AVAILABILITIES = ("default", "scarce")


@dataclass(frozen=True)
class Setting:
    """Core or extended: models, GPU types, regions, the mean rate per model."""

    name: str
    models: tuple[str, ...]
    gpu_types: tuple[str, ...]
    regions: tuple[str, ...]
    rate_rps: float

    def region_gpus(self, region: str) -> tuple[str, ...]:
        """The setting's GPU types that ``region`` offers."""
        return tuple(g for g in self.gpu_types if g in REGION_GPUS[region])

    def configurations(self) -> int:
        """Distinct (GPU type, GPUs per node) configurations over the setting's regions."""
        types = {g for r in self.regions for g in self.region_gpus(r)}
        return len(types) * len(NODE_SHAPES)

    def heavy(self, demand: str) -> tuple[str, ...]:
        """The third of the models that gets ``HEAVY_SHARE`` of the requests: the largest
        (``large-heavy``) or the smallest (``small-heavy``) by parameters."""
        ranked = sorted(self.models, key=lambda m: MODELS[m].params_b)
        third = len(ranked) // 3
        return tuple(ranked[-third:] if demand == "large-heavy" else ranked[:third])


SETTINGS = {
    "core": Setting("core", ("phi-4-14b", "gpt-oss-20b", "qwen3-32b"), CORE_GPUS,
                    ("us-east-2", "ap-northeast-2"), 10.0),
    "extended": Setting("extended", tuple(MODELS), EXTENDED_GPUS,
                        ("us-east-2", "ap-northeast-2", "us-central-1"), 25.0),
}


@dataclass(frozen=True)
class Setup:
    """One table of the results: setting x demand skew x availability."""

    setting: Setting
    demand: str  #: one of DEMANDS
    availability: str  #: one of AVAILABILITIES

    @property
    def name(self) -> str:
        return f"{self.setting.name} / {self.demand} / {self.availability}"

    def rate_of(self, model: str) -> float:
        """Mean requests/s of ``model`` over the run (§5.3; the total is the default's)."""
        rate = self.setting.rate_rps
        if self.demand == "default":
            return rate
        total = rate * len(self.setting.models)
        heavy = self.setting.heavy(self.demand)
        if model in heavy:
            return HEAVY_SHARE * total / len(heavy)
        return (1.0 - HEAVY_SHARE) * total / (len(self.setting.models) - len(heavy))

    @property
    def scarce_margin(self) -> float:
        return SCARCE_MARGIN[self.setting.name]


#: The setups the paper reports (§5.5): both settings at default demand with both
#: availabilities, Large-Heavy and Small-Heavy with default availability.
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

#: The paper's cost ratios, baseline hourly cost / Coral's (§5.5 table). Scarce rows compare at
#: unequal goodput: core scarce Homo is "same cost, 1.24x goodput" (ratio 1.0), extended scarce
#: Homo is 1.52x *more expensive* for Coral (ratio 1 / 1.52) at 7.64x goodput.
PAPER_RATIOS: dict[tuple[str, str, str], dict[str, float]] = {
    ("core", "default", "default"): {"homo": 1.62, "cauchy": 1.60},
    ("core", "default", "scarce"): {"homo": 1.0, "cauchy": 1.51},
    ("core", "large-heavy", "default"): {"homo": 1.82, "cauchy": 1.78},
    ("core", "small-heavy", "default"): {"homo": 1.1},
    ("extended", "default", "default"): {"homo": 3.14, "cauchy": 2.66},
    ("extended", "default", "scarce"): {"homo": round(1 / 1.52, 2), "cauchy": 1.25},
    ("extended", "large-heavy", "default"): {"homo": 2.79, "cauchy": 3.47},
    ("extended", "small-heavy", "default"): {"homo": 2.34, "cauchy": 1.64},
}
#: The paper's per-model ratios (§5.5): Qwen3 32B in core default, Qwen3 235B in extended default.
PAPER_MODEL_RATIOS: dict[tuple[str, str, str], dict[str, dict[str, float]]] = {
    ("core", "default", "default"): {"qwen3-32b": {"homo": 2.02, "cauchy": 1.88}},
    ("extended", "default", "default"): {"qwen3-235b": {"homo": 4.93, "cauchy": 4.08}},
}


def regional(gpu: str, region: str) -> str:
    """The GPU type name of ``gpu`` in ``region`` (its own locality domain)."""
    return f"{gpu}@{region}"


def base_gpu(gpu_type: str) -> str:
    """The catalogue GPU name of a regional GPU type (``l4@us-east-2`` -> ``l4``)."""
    return gpu_type.split("@", 1)[0]


def regional_types(setting: Setting) -> list[str]:
    """Every regional GPU type of the setting (a GPU type in a region that offers it)."""
    return [regional(g, r) for r in setting.regions for g in setting.region_gpus(r)]


def nodes_for(gpus: int) -> list[int]:
    """Node sizes holding ``gpus`` GPUs: as many 8-GPU nodes as fit, the rest in 4/2/1 shapes."""
    out = []
    left = gpus
    for size in sorted(NODE_SHAPES, reverse=True):
        while left >= size:
            out.append(size)
            left -= size
    return out
