"""The ``cluster`` section: Slurm partitions (with their engine environments, prices and
quotas), how coral-hpc talks to Slurm, and the shape and time limit of a replica job."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from coral_hpc.config.base import _against_file, _Frozen
from coral_hpc.config.engine_flags import PLANNER_ENV
from coral_hpc.types import slurm_duration_s

_GPU_TYPE_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
#: Slurm partition, account and QOS names: what sacctmgr and slurm.conf accept, and nothing a
#: shell, an #SBATCH line or a comma-separated Slurm list would read differently.
_SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: The longest replica job coral-hpc asks for. Slurm's own limit is INFINITE; a year is beyond
#: every site's MaxTime and keeps the number far from Slurm's 32-bit minute counters.
MAX_TIME_LIMIT_S = 365 * 86400


def parse_slurm_time(value: str | int) -> int:
    """Convert a Slurm time spec (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) or a
    number of minutes to seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a Slurm time such as '04:00:00' or '1-00:00:00'")  # noqa: TRY004 - pydantic reports ValueError
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("must be a positive number of minutes")
        if value * 60 > MAX_TIME_LIMIT_S:
            raise ValueError(f"must be at most {MAX_TIME_LIMIT_S // 60} minutes (365 days)")
        return value * 60
    text = str(value).strip()
    try:
        total = slurm_duration_s(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a Slurm time; use MM, HH:MM:SS or D-HH:MM:SS such as '04:00:00'"
        ) from None
    if total <= 0:
        raise ValueError("must be longer than zero")
    if total > MAX_TIME_LIMIT_S:
        raise ValueError(f"{text!r} is longer than 365 days; give a Slurm time within a year")
    return total


_ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: reach the engine only from their files (gateway.api_keys / hf_token_file), never from config
_SECRET_VARS = frozenset({"VLLM_API_KEY", "HF_TOKEN"})


class _EnvironmentBase(_Frozen):
    """What every engine environment kind shares: extra environment variables for the engine."""

    #: written as a mapping in models.yaml; kept as sorted (name, value) pairs so the frozen
    #: config (and every spec holding it) stays hashable
    env: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="extra environment variables for the engine, a mapping NAME: value "
        "(`env: {VLLM_CPU_KVCACHE_SPACE: \"1\"}`); HF_TOKEN and VLLM_API_KEY are refused: they "
        "come from their files",
        json_schema_extra={"yaml_type": "map of string → string"},
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_pairs(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return tuple(sorted((str(k), str(v)) for k, v in value.items()))
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for name, _ in value:
            if not _ENV_VAR_RE.match(name):
                raise ValueError(f"{name!r} is not an environment variable name (A-Z, 0-9, _)")
            if name in _SECRET_VARS:
                raise ValueError(f"{name} is a secret: it reaches the engine from its file only")
        return value

    @field_validator("env")
    @classmethod
    def _planner_owned_env(cls, value: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for name, _ in value:
            if name in PLANNER_ENV:
                raise ValueError(f"{name} may not be set here: {PLANNER_ENV[name]}")
        return value


class VenvEnvironment(_EnvironmentBase):
    """vLLM installed in a virtual environment on the shared filesystem."""

    kind: Literal["venv"] = Field(default="venv", description="selects this kind: a venv")
    path: str = Field(description="venv directory; its bin/ holds `vllm`")
    modules: tuple[str, ...] = Field(default=(), description="`module load` these first (CUDA)")

    _resolve = field_validator("path")(_against_file)


class ModuleEnvironment(_EnvironmentBase):
    """vLLM provided by environment modules."""

    kind: Literal["module"] = Field(default="module",
                                    description="selects this kind: environment modules")
    modules: tuple[str, ...] = Field(min_length=1, description="`module load` lines, in order")


class ApptainerEnvironment(_EnvironmentBase):
    """vLLM inside an Apptainer/Singularity image (`apptainer exec --nv`)."""

    kind: Literal["apptainer"] = Field(default="apptainer",
                                       description="selects this kind: an Apptainer image")
    image: str = Field(description="path to the .sif image on the shared filesystem")
    binds: tuple[str, ...] = Field(default=(), description="extra --bind specs (model cache)")
    modules: tuple[str, ...] = Field(default=(), description="`module load apptainer` etc.")

    _resolve = field_validator("image")(_against_file)


EngineEnvironment = Annotated[
    VenvEnvironment | ModuleEnvironment | ApptainerEnvironment,
    Field(discriminator="kind"),
]


class PartitionConfig(_Frozen):
    """One Slurm partition coral-hpc may place replicas on."""

    name: str = Field(description="Slurm partition name")
    gpu_types: tuple[str, ...] = Field(
        default=(), description="GPU types to use here; empty = every type Slurm reports"
    )
    price: dict[str, float] | Literal["billing", "catalog"] = Field(
        default="billing",
        description="price per GPU-hour per GPU type, 'billing' for Slurm's billing formula, "
        "or 'catalog' for each type's price_per_gpu_hour in the site catalogue (catalog:)",
    )
    environment: EngineEnvironment | None = Field(
        default=None, description="how to run vLLM on this partition (engine: vllm needs it)"
    )
    max_gpus: int | None = Field(
        default=None, ge=0, le=1_000_000, description="quota: GPUs held here at most"
    )
    compatible_with: tuple[str, ...] = Field(
        default=(),
        description="partitions whose environment runs the same vLLM as this one's (e.g. one "
        "vLLM version built for two CUDA architectures): a pipeline may span them",
    )
    preemptible: bool | None = Field(
        default=None,
        description="jobs here may be preempted (a scavenger partition or QOS); unset = as "
        "Slurm shows it (PreemptMode and a higher PriorityTier on shared nodes, or the "
        "partition's QOS in another QOS's Preempt list). A model's replicas go there only "
        "beside one elsewhere (never its only replica); a preempted one is resubmitted",
    )

    @field_validator("name")
    @classmethod
    def _safe_partition(cls, value: str) -> str:
        return _slurm_name(value, "partition")

    @field_validator("compatible_with")
    @classmethod
    def _safe_compatible(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:  # partition names, like `name`
            _slurm_name(name, "partition")
        return value

    @field_validator("gpu_types")
    @classmethod
    def _safe_gpu_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for gpu in value:
            if not _GPU_TYPE_RE.match(gpu):
                raise ValueError(f"{gpu!r} is not a GPU type such as 'a100' or 'a100-80g'")
        return value

    @field_validator("price")
    @classmethod
    def _positive_prices(cls, value: Any) -> Any:
        if isinstance(value, dict):
            if not value:
                raise ValueError("give at least one 'gpu_type: price per GPU-hour', or 'billing'")
            for gpu, price in value.items():
                if not _GPU_TYPE_RE.match(gpu):
                    raise ValueError(f"{gpu!r} is not a GPU type such as 'a100'")
                if price < 0:
                    raise ValueError(f"price for {gpu!r} must be ≥ 0 per GPU-hour, got {price}")
                if price > MAX_PRICE:
                    raise ValueError(
                        f"price for {gpu!r} is {price:g}; a price per GPU-hour is at most "
                        f"{MAX_PRICE:g}"
                    )
        return value

    @model_validator(mode="after")
    def _prices_name_used_types(self) -> PartitionConfig:
        if isinstance(self.price, dict) and self.gpu_types:
            missing = [g for g in self.gpu_types if g not in self.price]
            if missing:
                raise ValueError(
                    f"price has no entry for GPU type(s) {missing}; price every type in gpu_types"
                )
        return self


#: Highest price per GPU-hour accepted: four orders of magnitude above any list price (an H100
#: rents for a few units an hour); beyond it the Stage-2 objective's coefficients span more than
#: HiGHS's tolerances can tell apart.
MAX_PRICE = 10_000.0


def _slurm_name(value: str, what: str) -> str:
    if not _SLURM_NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a Slurm {what} name: 1–64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


class SlurmSettings(_Frozen):
    """How coral-hpc talks to Slurm."""

    backend: Literal["auto", "cli", "pyslurm"] = Field(
        default="auto", description="auto = pyslurm when importable and version-matched, else CLI"
    )
    command_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="per Slurm command (at most an hour)"
    )
    # One budget for every Slurm command the daemon runs (coral_hpc.slurm.budget): observe
    # reads, sacct/sacctmgr, start-estimate probes and acts. 30 a minute is the goal a site's
    # slurmctld should see from one service (issue 6; bench/results/bigcluster.md measures it).
    calls_per_min: float | None = Field(
        default=None, gt=0, le=600,
        description="Slurm commands in any 60 s at most, all of the daemon's together (observe, "
        "start estimates, limits, acts); the poll interval stretches to keep to it. Default: 30 "
        "at the default 6 s poll, scaled up when policy.poll_interval_s asks to poll faster",
    )
    # sbatch --test-only is one slurmctld RPC per job shape: probes take this share of
    # calls_per_min first, the observe cycle gets the rest
    probe_calls_per_min: float = Field(
        default=6.0, gt=0, le=60,
        description="of calls_per_min, sbatch --test-only start estimates per minute at most "
        "(busy clusters)",
    )

    @model_validator(mode="after")
    def _probes_leave_room_to_observe(self) -> SlurmSettings:
        # an observe cycle is 3 commands: probes must leave at least one cycle a minute
        if self.calls_per_min is not None and self.probe_calls_per_min > self.calls_per_min - 3:
            raise ValueError(
                f"probe_calls_per_min ({self.probe_calls_per_min:g}) must leave at least 3 of "
                f"calls_per_min ({self.calls_per_min:g}) to observe the cluster"
            )
        return self


#: CPUs and memory (GB) a replica job asks per GPU unless models.yaml says otherwise: a modest
#: share (one vLLM worker per GPU needs a few CPU threads and host memory to stage its shard)
#: that common GPU nodes can give for every GPU. The one default: launch, the Slurm probes and
#: pricing by Slurm billing all read these.
DEFAULT_CPUS_PER_GPU = 4
DEFAULT_MEM_PER_GPU_GB = 32


class ClusterConfig(_Frozen):
    """Where and as whom replicas run."""

    account: str | None = Field(default=None, description="Slurm account (-A)")
    qos: str | None = Field(default=None, description="Slurm QOS (--qos)")
    slurm: SlurmSettings = SlurmSettings()
    time_limit: str | int = Field(
        default="04:00:00",
        description="replica job time limit: a Slurm time (HH:MM:SS, D-HH:MM:SS) or minutes",
    )
    partitions: tuple[PartitionConfig, ...] = Field(min_length=1)
    gpu_quotas: dict[str, int] = Field(
        default_factory=dict, description="GPUs held at most per GPU type, over all partitions"
    )
    # A replica job asks for CPUs and memory in proportion to its GPUs; the same shape packs
    # nodes and prices a job under `price: billing`, so plans, jobs and accounting agree. Left
    # out, the partitions' own defaults decide (coral_hpc.slurm.job_shape.replica_shape).
    cpus_per_gpu: int = Field(default=DEFAULT_CPUS_PER_GPU, ge=1, le=1024,
                              description="CPUs requested per GPU; unset: the partitions' "
                              "DefCpuPerGPU, else the default")
    mem_per_gpu_gb: int = Field(default=DEFAULT_MEM_PER_GPU_GB, ge=1, le=65536,
                                description="memory (GB) requested per GPU; unset: the "
                                "partitions' DefMemPerGPU, else DefMemPerCPU × CPUs per GPU, "
                                "else the default")
    gpu_type_map: dict[str, str] = Field(
        default_factory=dict,
        description="site GRES type name (or node feature) -> catalogue GPU type, e.g. "
        "{nvidia_a100_80gb_pcie: a100-80g}; the key 'gpu' types every untyped gpu:N",
    )

    @field_validator("account", "qos")
    @classmethod
    def _slurm_names(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _slurm_name(value, info.field_name or "")

    @field_validator("time_limit")
    @classmethod
    def _valid_time(cls, value: str | int) -> str | int:
        parse_slurm_time(value)
        return value

    @property
    def time_limit_s(self) -> int:
        """The replica job time limit in seconds."""
        return parse_slurm_time(self.time_limit)

    @property
    def price_unit(self) -> Literal["gpu_hour", "billing"]:
        """The one cost unit of this deployment."""
        return "billing" if self.partitions[0].price == "billing" else "gpu_hour"

    @model_validator(mode="after")
    def _one_price_unit(self) -> ClusterConfig:
        names = [p.name for p in self.partitions]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"partition(s) {dupes} listed twice; list each partition once")
        kinds = {("billing" if p.price == "billing" else "per GPU-hour") for p in self.partitions}
        if len(kinds) > 1:
            raise ValueError(
                "partitions mix 'price: billing' with per-GPU-hour prices; one cost unit per "
                "deployment: give every partition a per-GPU-hour price, or 'billing' to all"
            )
        for gpu, quota in self.gpu_quotas.items():
            if not 0 <= quota <= 1_000_000:
                raise ValueError(f"gpu_quotas[{gpu!r}] must be within 0..1,000,000, got {quota}")
        return self
