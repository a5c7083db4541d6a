"""``models.yaml``: one frozen, validated description of a deployment.

:func:`load_deployment` reads the file, validates it with pydantic (unknown keys rejected) and
returns a :class:`Deployment`. Every problem is reported at once, each naming the file, the line,
the field (``models[1].slo.ttft_s``) and what would be valid; see :class:`coral_hpc.errors.ConfigError`.

Units, one meaning everywhere (../shared/ARCHITECTURE.md): demand and throughput are requests per
second of the model's own request mix; token-based demand is converted on load
(output tokens/s ÷ mean output tokens).
"""

from __future__ import annotations

import ipaddress
import os
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from coral_hpc.config_source import SourceError, YamlSource, load_yaml, parse_yaml
from coral_hpc.errors import ConfigError
from coral_hpc.types import slurm_duration_s

#: Names end up in Slurm job names, URLs and file names: keep them to a safe alphabet.
SAFE_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_SAFE_NAME_RE = re.compile(SAFE_NAME)
_GPU_TYPE_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
#: Slurm partition, account and QOS names: what sacctmgr and slurm.conf accept, and nothing a
#: shell, an #SBATCH line or a comma-separated Slurm list would read differently.
_SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: policy.solver besides ``highs``: ``pyomo:`` and a name Pyomo's SolverFactory may know
SOLVER_FORM = re.compile(r"pyomo:[A-Za-z][A-Za-z0-9_.-]{0,63}")
#: The longest replica job coral-hpc asks for. Slurm's own limit is INFINITE; a year is beyond
#: every site's MaxTime and keeps the number far from Slurm's 32-bit minute counters.
MAX_TIME_LIMIT_S = 365 * 86400
#: Unicode categories refused inside any value: control characters (newline, tab, ESC, NUL...)
#: and line/paragraph separators. A newline in a path escaped a comment line of a rendered
#: engine script (issue 16); values are single lines of printable text.
_FORBIDDEN_CATEGORIES = {"Cc", "Zl", "Zp"}


def _control_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            return f"U+{ord(char):04X} {unicodedata.name(char, 'control character')}".strip()
    return None


def _check_text(value: Any) -> None:
    """Refuse control characters in every string, list item and mapping key of a field."""
    if isinstance(value, str):
        found = _control_character(value)
        if found:
            raise ValueError(
                f"contains a control character ({found}, e.g. a newline or tab); "
                "write the value on one line of printable text"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_text(item)


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    if annotation in kinds:
        return True
    return any(_admits(arg, kinds) for arg in getattr(annotation, "__args__", ()) or ())


def _against_file(value: str | None, info: ValidationInfo) -> str | None:
    """A relative path (``~`` expanded) made absolute against the folder of the models.yaml it
    was read from, so the same file means the same paths whatever the working directory."""
    base = (info.context or {}).get("base_dir")
    if value is None or base is None:
        return value  # parsed from text (or from a spec.json): kept as written
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else Path(base) / path)


class _Frozen(BaseModel):
    """Every config section: immutable, unknown keys rejected, numbers finite (no .inf/.nan),
    no yes/no where a number is expected, no control characters in any text."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_yes_no_numbers(cls, data: Any) -> Any:
        # pydantic reads `priority: yes` as 1; a yes/no where a number belongs is a mistake
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if (isinstance(value, bool) and field and _admits(field.annotation, (int, float))
                        and not _admits(field.annotation, (bool,))):
                    raise _FieldError((name,), f"expected a number, got yes/no ({value})")
        return data

    @field_validator("*")
    @classmethod
    def _printable_text(cls, value: Any) -> Any:
        _check_text(value)
        return value


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


# --------------------------------------------------------------------------- cluster section


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
    price: dict[str, float] | Literal["billing"] = Field(
        default="billing",
        description="price per GPU-hour per GPU type, or 'billing' for Slurm's billing formula",
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


#: Slurm calls a minute a daemon polling at the default interval keeps to (issue 6's goal)
DEFAULT_SLURM_CALLS_PER_MIN = 30.0


def slurm_calls_per_min(deployment: Deployment) -> float:
    """The daemon's Slurm call budget: ``cluster.slurm.calls_per_min`` when set, else 30 at the
    default 6 s poll, scaled by how much faster ``policy.poll_interval_s`` asks to poll (a site
    that sets a 2 s poll has asked for three times the calls; the budget then does not stretch
    it back to 6 s)."""
    explicit = deployment.cluster.slurm.calls_per_min
    if explicit is not None:
        return explicit
    default_poll = PolicyConfig.model_fields["poll_interval_s"].default
    return DEFAULT_SLURM_CALLS_PER_MIN * max(1.0, default_poll / deployment.policy.poll_interval_s)


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


# --------------------------------------------------------------------------- planner-owned engine flags

#: Flags the planner or launcher sets on every engine, and why a config may not set them: vLLM's
#: argparse keeps the last value, so one in ``vllm_args`` would silently override the plan.
PLANNER_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "the planner chooses tensor parallelism per layout",
    "--pipeline-parallel-size": "the planner chooses pipeline stages per layout",
    "--sim-layers": "the planner chooses the layers of each pipeline stage",
    "--kv-transfer-config": "the launcher sets it from engine.kv_connector",
    "--served-model-name": "the gateway routes by the model's name, which the launcher sets",
    "--host": "the launcher binds the engine and reports where",
    "--port": "the launcher picks the port and reports it",
    "--uds": "the launcher binds the engine and reports where",
    "--nnodes": "the launcher sets the pipeline's nodes",
    "--node-rank": "the launcher sets the pipeline's nodes",
    "--master-addr": "the launcher sets the pipeline's nodes",
    "--master-port": "the launcher sets the pipeline's nodes",
    "--headless": "the launcher sets the pipeline's nodes",
    "--config": "a vLLM config file can set any planner-owned flag",
    "--api-key": "a secret: the replica key reaches the engine as VLLM_API_KEY, never argv",
    "--hf-token": "a secret: set engine.hf_token_file (it reaches the engine as HF_TOKEN)",
}
#: vLLM's short aliases of planner-owned flags; argparse also takes ``-tp4`` style joined values
_PLANNER_SHORT = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}
#: a word of a flag's name that marks it as carrying a secret (``--hf-token``, ``--ssl-password``);
#: whole words only, so ``--max-num-batched-tokens`` and ``--tokenizer`` stay allowed
_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "secrets", "password", "passwd",
                           "credential", "credentials"})
#: the planner-owned variables of the engine's environment (``environment.env``)
PLANNER_ENV = {"VLLM_PP_LAYER_PARTITION": "the planner chooses the layers of each pipeline stage"}


def engine_flag_problem(arg: str) -> str | None:
    """Why engine argument ``arg`` may not come from a config, or None.

    Both ``--flag value`` and ``--flag=value`` are read, underscores count as dashes (vLLM's
    parser accepts both) and a unique prefix counts as the flag it abbreviates, as argparse's
    ``allow_abbrev`` (on in vLLM) would take it: ``--tensor-parallel`` is ``--tensor-parallel-size``."""
    if not arg.startswith("-") or arg == "--":
        return None
    if not arg.startswith("--"):
        for short, flag in _PLANNER_SHORT.items():
            if arg.split("=", 1)[0].startswith(short):
                return f"{short} is {flag}: {PLANNER_FLAGS[flag]}"
        return None
    name = arg.split("=", 1)[0].replace("_", "-").lower()
    if name in PLANNER_FLAGS:
        return f"{name}: {PLANNER_FLAGS[name]}"
    words = set(name[2:].split("-"))
    if words & _SECRET_WORDS:
        return (f"{name} carries a secret, which would land in argv and in rendered scripts; "
                "secrets reach the engine from files (engine.hf_token_file, the replica key)")
    if len(name) > 2:
        owned = sorted(flag for flag in PLANNER_FLAGS if flag.startswith(name))
        if owned:
            return (f"{name} abbreviates {' or '.join(owned)}, which argparse accepts: "
                    f"{PLANNER_FLAGS[owned[0]]}")
    return None


def engine_args_problems(args: tuple[str, ...]) -> list[tuple[int, str]]:
    """(index, why) of every argument of ``args`` that sets a planner-owned flag or a secret."""
    return [(index, why) for index, arg in enumerate(args)
            if (why := engine_flag_problem(arg)) is not None]


# --------------------------------------------------------------------------- engine, gateway, policy


#: vLLM's KV connectors (``--kv-transfer-config``'s ``kv_connector``) coral-hpc can configure:
#: ExampleConnector moves the KV cache through a shared directory (the local cluster, measured
#: in ../shared/VLLM-CPU.md); the others are vLLM's network connectors for GPU sites.
KV_CONNECTORS = ("ExampleConnector", "NixlConnector", "LMCacheConnectorV1", "MooncakeConnector",
                 "P2pNcclConnector")


class KvConnectorConfig(_Frozen):
    """How a disaggregated model's prefill replicas hand the KV cache to its decode replicas."""

    name: Literal[KV_CONNECTORS] = Field(description="vLLM kv_connector: " + ", ".join(KV_CONNECTORS))
    shared_path: str | None = Field(
        default=None,
        description="ExampleConnector's directory on the shared filesystem; "
                    "default <state_dir>/<deployment>/kv",
    )
    extra_config: dict[str, Any] = Field(
        default_factory=dict, description="kv_connector_extra_config passed to vLLM as is"
    )

    @model_validator(mode="after")
    def _path_for_example_only(self) -> KvConnectorConfig:
        if self.shared_path is not None and self.name != "ExampleConnector":
            raise ValueError(f"shared_path applies to ExampleConnector only, not {self.name}")
        return self

    _resolve = field_validator("shared_path")(_against_file)


class EngineConfig(_Frozen):
    """Which engine replicas run."""

    kind: Literal["vllm", "sim"] = Field(default="vllm", description="sim = no GPU needed")
    args: tuple[str, ...] = Field(
        default=(), description="extra engine args for every model; flags the planner owns "
                                "(TP, PP, host, port, served name, ...) and secrets are refused")
    version: str | None = Field(default=None, description="vLLM version the environments hold")
    kv_connector: KvConnectorConfig | None = Field(
        default=None, description="KV connector of disaggregated models (policy.disaggregation)"
    )
    # model weights (ops): see the "model weights" section below
    hf_token_file: str | None = Field(
        default=None,
        description="file (mode 600, yours) holding a Hugging Face token; it reaches the engine "
                    "and `coral-hpc stage` as HF_TOKEN in their environment only",
    )
    hf_home: str | None = Field(
        default=None,
        description="the site's shared Hugging Face cache (HF_HOME) on the shared filesystem, "
                    "set in every environment kind and bound into Apptainer images "
                    "[default: <state_dir>/huggingface]",
    )

    # resolved first, so the token file checked below is the one beside models.yaml
    _resolve = field_validator("hf_token_file", "hf_home")(_against_file)

    @model_validator(mode="after")
    def _planner_owned_flags(self) -> EngineConfig:
        for index, why in engine_args_problems(self.args)[:1]:
            raise _FieldError(("args", index), f"every model's engine may not set {why}; remove it")
        return self

    @field_validator("hf_token_file")
    @classmethod
    def _private_token_file(cls, value: str | None) -> str | None:
        if value is not None:
            check_private_file(value, "Hugging Face token")
        return value


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; a host name may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GatewayConfig(_Frozen):
    """The one OpenAI-compatible endpoint."""

    listen: str = Field(default="127.0.0.1:8000", description="host:port")
    api_keys_file: str | None = Field(
        default=None, description="file of hashed API keys; required beyond loopback"
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, le=1 << 30,
        description="largest request body accepted, in bytes; a larger one is answered 413",
    )
    tls_cert: str | None = Field(
        default=None, description="PEM certificate (chain) the gateway serves HTTPS with"
    )
    tls_key: str | None = Field(default=None, description="PEM private key of tls_cert; mode 0600")
    behind_tls_proxy: bool = Field(
        default=False,
        description="a TLS-terminating proxy of the site is in front: plain HTTP beyond loopback",
    )

    _resolve = field_validator("api_keys_file", "tls_cert", "tls_key")(_against_file)

    @model_validator(mode="after")
    def _exposure(self) -> GatewayConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set tls_cert and tls_key together (or neither)")
        if is_loopback_host(self.host):
            return self
        # beyond loopback, API keys travel over the network: keys, and TLS to carry them
        if self.api_keys_file is None:
            raise ValueError(
                f"listen {self.listen!r} is reachable from other machines: set api_keys_file "
                "(`coral-hpc keys add FILE NAME`) or listen on 127.0.0.1"
            )
        if self.tls_cert is None and not self.behind_tls_proxy:
            raise ValueError(
                f"listen {self.listen!r} is reachable from other machines and API keys would "
                "cross the network in clear: set tls_cert and tls_key, or behind_tls_proxy: true "
                "when the site's TLS-terminating proxy is in front"
            )
        return self

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not host:port such as '127.0.0.1:8000'")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class PolicyConfig(_Frozen):
    """How the daemon plans and reacts. Every field has a default that suits a real cluster."""

    replan_interval_s: float = Field(
        default=60.0, ge=1, le=86400, description="plan at least this often (1 s .. 1 day)"
    )
    # One observe cycle costs three Slurm calls (nodes, partitions, own jobs): every 6 s that is
    # 30 calls a minute, a load a shared slurmctld tolerates, and still a resubmission within
    # ~10 s of a drain or a failed job (bench/results/reaction.md). At least 1 s: at 0.3 s the
    # daemon sent ~19x the normal calls and submitted nothing, each cycle outrun by the next
    # (issue 16).
    poll_interval_s: float = Field(
        default=6.0, ge=1, le=3600, description="observe Slurm this often (1 s .. 1 h)"
    )
    demand_headroom: float = Field(default=0.2, ge=0, le=5, description="plan for demand × (1+h)")
    demand_change_threshold: float = Field(
        default=0.25, gt=0, le=100, description="re-plan early when demand moves by this fraction"
    )
    pending_timeout_s: float = Field(
        default=600.0, gt=0, le=7 * 86400, description="re-plan a pending replica"
    )
    walltime_lead_s: float = Field(
        default=900.0, ge=0, le=7 * 86400, description="start successors this early"
    )
    startup_time_s: float = Field(
        default=180.0, gt=0, le=86400, description="submit→READY until learnt"
    )
    crash_limit: int = Field(
        default=3, ge=1, le=1000, description="crashes before a template cools down"
    )
    crash_cooldown_s: float = Field(
        default=1800.0, gt=0, le=7 * 86400,
        description="a template with crash_limit crashes within this window is kept out of "
                    "plans this long",
    )
    n_max: int = Field(default=6, ge=1, le=16, description="Stage 1: nodes per template at most")
    rho: float = Field(default=12.0, gt=1, description="Stage 1: GPU memory ≤ ρ × model size")
    heterogeneous: bool = Field(default=True, description="allow stages on different GPU types")
    # At most a week: Slurm's backfill plans 1 day ahead by default (bf_window), so a start
    # estimate much further out is no estimate to plan capacity on.
    max_queue_wait_s: float = Field(
        default=1800.0, ge=0, le=7 * 86400,
        description="horizon: GPUs Slurm expects to give us within this count as available "
                    "(0 .. 7 days)",
    )

    max_tp: int = Field(default=8, ge=1, le=64,
                        description="Stage 1: largest tensor-parallel degree (1: pipelines only)")
    solver_time_limit_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="Stage 2: time one solve may take; the best plan found by then is used",
    )
    solver_mip_gap: float = Field(
        default=1e-4, ge=0, lt=1,
        description="Stage 2: stop when the plan's cost is within this fraction of the optimum",
    )
    # HiGHS through its matrix interface is the fast path and ships with coral-hpc; a site with
    # a licensed solver (Gurobi, CPLEX, SCIP) names it through Pyomo: the same Stage-2 model,
    # built through Pyomo (slower) and solved by that solver (INSTALL.md, "Licensed solvers").
    # Whether the solver is installed here is checked when planning, not on load: `validate`
    # never imports Pyomo.
    solver: str = Field(
        default="highs",
        description="Stage 2's solver: highs (HiGHS, direct), or pyomo:NAME for any solver "
                    "Pyomo's SolverFactory drives (pyomo:gurobi, pyomo:cplex, pyomo:scip, "
                    "pyomo:appsi_highs)",
    )
    # Off by default: prefill and decode replicas need a KV connector the site has set up
    # (engine.kv_connector: a network connector on GPU nodes, or a shared directory) and each
    # request makes two hops; a site opts in. "auto" then lets Stage 2 pick per model whatever
    # is cheaper (aggregated, disaggregated or both); "on" plans prefill + decode replicas only.
    disaggregation: Literal["auto", "on", "off"] = Field(
        default="off", description="split prefill and decode onto separate replicas"
    )
    kv_fabric_gbs: float | None = Field(
        default=None, gt=0,
        description="GB/s the site's fabric carries for KV transfers in total; unset = no limit",
    )
    # An engine the analytic GPU model does not describe (vLLM's CPU build) is planned from
    # `coral-hpc profile`'s measurements alone: a template whose figure would come from the
    # model (a layout nobody measured) is no candidate at all.
    measured_only: bool = Field(
        default=False,
        description="Stage 1: plan only layouts whose throughput was measured (coral-hpc "
                    "profile); others are no candidates",
    )

    @field_validator("solver")
    @classmethod
    def _solver_form(cls, value: str) -> str:
        if value != "highs" and not SOLVER_FORM.fullmatch(value):
            raise ValueError(f"{value!r} is not a solver: give 'highs' or 'pyomo:<name>', "
                             "<name> a Pyomo SolverFactory name (pyomo:gurobi, pyomo:cplex, "
                             "pyomo:scip, pyomo:appsi_highs)")
        return value

    @field_validator("disaggregation", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1 (PyYAML) reads a bare on/off as a boolean: take it as the word it was
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


# --------------------------------------------------------------------------- models


class RequestMix(_Frozen):
    """Mean request shape of a model's traffic."""

    input_tokens: int = Field(gt=0, le=1_048_576, description="mean prompt tokens per request")
    output_tokens: int = Field(gt=0, le=1_048_576,
                               description="mean generated tokens per request")


class Demand(_Frozen):
    """Declared demand: requests/s, or output tokens/s (converted on load)."""

    # Upper bounds far above any deployment (a million requests/s is ~thousands of GPUs per
    # model) that keep the Stage-2 coefficients within what HiGHS's tolerances resolve.
    requests_per_s: float | None = Field(
        default=None, ge=0, le=1e6, description="requests per second of the model's mix"
    )
    output_tokens_per_s: float | None = Field(
        default=None, ge=0, le=1e9,
        description="generated tokens per second; divided by mix.output_tokens on load",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Demand:
        given = [v is not None for v in (self.requests_per_s, self.output_tokens_per_s)]
        if sum(given) != 1:
            raise ValueError(
                "give exactly one of requests_per_s or output_tokens_per_s (or demand: auto)"
            )
        return self


class SLO(_Frozen):
    """Latency targets a template's throughput is measured under."""

    ttft_s: float = Field(gt=0, le=600, description="time to first token, seconds")
    tpot_s: float = Field(gt=0, le=10, description="time per output token, seconds")


class ModelConfig(_Frozen):
    """One served model."""

    name: str = Field(description="safe identifier: job names, URLs, file names")
    source: str = Field(min_length=1, description="Hugging Face id or path on the shared FS")
    architecture: str = Field(description="an architecture in profiles/models.yaml")
    mix: RequestMix
    demand: Demand | Literal["auto"] = Field(
        description="{requests_per_s: N} or {output_tokens_per_s: N}, or `auto`: measured at the "
        "gateway, averaged over about one policy.replan_interval_s, with the measured mix; a "
        "model with no traffic yet gets min_replicas, and its first requests, answered 503, "
        "count as demand",
    )
    slo: SLO
    # priorities weight served demand in the scarce objective: a ratio beyond 10^6 between two
    # models is below the solver's relative tolerance, so it could not be honoured anyway
    priority: float = Field(
        default=1.0, ge=1e-3, le=1000, description="weight when GPUs are scarce (0.001 .. 1000)"
    )
    min_replicas: int = Field(
        default=0, ge=0, le=10_000,
        description="replicas kept whatever the demand (queued when they cannot start now; "
                    "refused when the model's partitions could never hold them)",
    )
    max_replicas: int | None = Field(
        default=None, ge=0, le=10_000,
        description="replicas at most; unset = as many as the demand needs",
    )
    partitions: tuple[str, ...] = Field(default=(), description="allowed partitions; empty = all")
    gpu_types: tuple[str, ...] = Field(default=(), description="allowed GPU types; empty = all")
    max_model_len: int | None = Field(
        default=None, gt=0, le=1 << 24,
        description="context length in tokens (vLLM --max-model-len); only layouts whose KV "
                    "cache holds one such request are planned; unset = the model's own",
    )
    vllm_args: tuple[str, ...] = Field(
        default=(), description="extra vLLM arguments for this model, after engine.args; flags "
                                "the planner owns (TP, PP, host, port, served name, ...) and "
                                "secrets are refused")

    @field_validator("demand", mode="before")
    @classmethod
    def _demand_shape(cls, value: Any) -> Any:
        if not isinstance(value, dict) and value != "auto":
            raise ValueError(
                f"{value!r} is not a demand: use 'auto' (measured at the gateway), "
                "{requests_per_s: N} or {output_tokens_per_s: N}"
            )
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _SAFE_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a safe name: use 1–63 lowercase letters, digits, '.', '_' or "
                "'-', starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _planner_owned_flags(self) -> ModelConfig:
        for index, why in engine_args_problems(self.vllm_args)[:1]:
            raise _FieldError(("vllm_args", index),
                              f"model {self.name!r} may not set {why}; remove it")
        return self

    @model_validator(mode="after")
    def _replica_bounds(self) -> ModelConfig:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})"
            )
        return self

    @property
    def demand_rps(self) -> float | None:
        """Declared demand in requests/s of this model's mix; None when measured (auto)."""
        if self.demand == "auto":
            return None
        if self.demand.requests_per_s is not None:
            return self.demand.requests_per_s
        return self.demand.output_tokens_per_s / self.mix.output_tokens


# --------------------------------------------------------------------------- retention (ops)


class RetentionConfig(_Frozen):
    """What the daemon keeps, and for how long. A daemon runs for months: without limits its
    logs, the replica folders on the shared filesystem and its database only grow."""

    log_max_mb: float = Field(
        default=20.0, gt=0,
        description="rotate the daemon's (serve --log-file) and the gateway's log at this size",
    )
    log_backups: int = Field(
        default=5, ge=1, description="rotated logs kept per log: at most (1 + this) × log_max_mb"
    )
    replica_files_days: float = Field(
        default=14.0, gt=0,
        description="remove an ended replica's folder, logs and rendezvous files after this "
                    "long (two weeks of post-mortems)",
    )
    events_days: float = Field(
        default=90.0, gt=0, description="keep `coral-hpc status` events this long"
    )
    history_days: float = Field(
        default=400.0, gt=0,
        description="keep plans, ended replicas, metered demand and token counts this long: a "
                    "year of `coral-hpc cost` and `report` (booked vs predicted, cost per token)",
    )
    demand_compact_after_days: float = Field(
        default=2.0, gt=0,
        description="merge per-scrape demand intervals older than this into hourly rows",
    )
    prune_interval_s: float = Field(
        default=3600.0, gt=0, description="apply these limits this often"
    )
    access_log_days: float = Field(
        default=90.0, gt=0,
        description="keep the gateway's access log (one file per UTC day under "
                    "<state_dir>/<deployment>/access/) this long",
    )


# --------------------------------------------------------------------------- deployment


class Deployment(_Frozen):
    """The whole of ``models.yaml``."""

    deployment: str = Field(description="name used to tag this deployment's Slurm jobs")
    state_dir: str = Field(description="shared filesystem: endpoint files, logs, scripts")
    db_path: str = Field(description="daemon host's local disk: the SQLite database")
    profiles_dir: str | None = Field(
        default=None,
        description="where `coral-hpc profile` writes measured profiles and plan/serve read "
        "them; default <state_dir>/<deployment>/profiles",
    )
    cluster: ClusterConfig
    engine: EngineConfig = EngineConfig()
    gateway: GatewayConfig = GatewayConfig()
    policy: PolicyConfig = PolicyConfig()
    retention: RetentionConfig = RetentionConfig()
    models: tuple[ModelConfig, ...] = Field(min_length=1)

    # relative paths mean "beside this models.yaml", not "below wherever serve was started"
    _resolve = field_validator("state_dir", "db_path", "profiles_dir")(_against_file)

    @field_validator("deployment")
    @classmethod
    def _safe_deployment(cls, value: str) -> str:
        if not _SAFE_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a safe name: use lowercase letters, digits, '.', '_' or '-'"
            )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Deployment:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model name(s) {dupes} used twice; model names must be unique")
        known = {p.name for p in self.cluster.partitions}
        for index, model in enumerate(self.models):
            unknown = [p for p in model.partitions if p not in known]
            if unknown:
                raise _FieldError(
                    ("models", index, "partitions"),
                    f"partition(s) {unknown} not in cluster.partitions; valid: {sorted(known)}",
                )
        for index, part in enumerate(self.cluster.partitions):
            unknown = [p for p in part.compatible_with if p not in known or p == part.name]
            if unknown:
                raise _FieldError(
                    ("cluster", "partitions", index, "compatible_with"),
                    f"partition(s) {unknown} are not other entries of cluster.partitions; "
                    f"valid: {sorted(known - {part.name})}",
                )

        if self.policy.measured_only and self.policy.disaggregation != "off":
            raise _FieldError(
                ("policy", "measured_only"),
                "measured_only plans from measured profiles, and prefill-only and decode-only "
                f"replicas are never profiled: it needs policy.disaggregation 'off', not "
                f"{self.policy.disaggregation!r}",
            )
        if (self.policy.disaggregation != "off" and self.engine.kind == "vllm"
                and self.engine.kv_connector is None):
            raise _FieldError(
                ("engine", "kv_connector"),
                f"policy.disaggregation {self.policy.disaggregation!r} with engine 'vllm' needs "
                f"engine.kv_connector (name: one of {', '.join(KV_CONNECTORS)})",
            )
        if self.engine.kind == "vllm":
            for index, part in enumerate(self.cluster.partitions):
                if part.environment is None:
                    raise _FieldError(
                        ("cluster", "partitions", index, "environment"),
                        "engine 'vllm' needs an environment per partition "
                        "(kind: venv | module | apptainer)",
                    )
        return self

    #: where the deployment was read from, and the line of every field (for later checks' errors)
    _source: str = PrivateAttr(default="<string>")
    _lines: dict = PrivateAttr(default_factory=dict)

    def problem(self, loc: tuple[str | int, ...], message: str) -> str:
        """A problem line in the format of every config error: ``file:line: field: message``;
        ``loc`` is the field path, e.g. ``("models", 0, "slo")``."""
        return f"{self._source}:{_nearest_line(self._lines, loc)}: {_dotted(loc)}: {message}"

    @property
    def state_path(self) -> Path:
        """This deployment's folder on the shared filesystem."""
        return Path(self.state_dir).expanduser() / self.deployment

    @property
    def measured_profiles_path(self) -> Path:
        """The site's measured profiles (``profiles_dir``, default under the state folder)."""
        if self.profiles_dir:
            return Path(self.profiles_dir).expanduser()
        return self.state_path / "profiles"

    def model(self, name: str) -> ModelConfig:
        """The configured model called ``name``; KeyError if none."""
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)

    def environment_groups(self) -> tuple[tuple[str, ...], ...]:
        """Partitions whose engine environments may serve one pipeline together: the same
        environment, or declared interchangeable (``compatible_with``, either way round), closed
        transitively. The sim engine runs anywhere: one group."""
        parts = self.cluster.partitions
        if self.engine.kind != "vllm":
            return (tuple(sorted(p.name for p in parts)),)
        parent = {p.name: p.name for p in parts}

        def find(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        for a in parts:
            for b in parts:
                if a.name < b.name and a.environment is not None and a.environment == b.environment:
                    parent[find(a.name)] = find(b.name)
            for other in a.compatible_with:
                if other in parent:
                    parent[find(a.name)] = find(other)
        groups: dict[str, list[str]] = {}
        for p in parts:
            groups.setdefault(find(p.name), []).append(p.name)
        return tuple(sorted(tuple(sorted(g)) for g in groups.values()))


class _FieldError(ValueError):
    """A cross-field check that knows exactly which field is wrong."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        self.loc = loc
        super().__init__(message)


# --------------------------------------------------------------------------- loading with line numbers


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-branch tags (``'function-after[...]'``, ``'venv'``) from a location."""
    cleaned = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in ("venv", "module", "apptainer")):
            if "[" in part:
                continue
            # discriminator tag of the engine environment union
            if cleaned and cleaned[-1] == "environment":
                continue
        cleaned.append(part)
    return tuple(cleaned)


def _nearest_line(lines: dict[tuple, int], loc: tuple) -> int:
    # a mapping key written as a number (`1: x`) is indexed by its text
    as_text = tuple(str(part) for part in loc)
    for cut in range(len(loc), -1, -1):
        for key in (loc[:cut], as_text[:cut]):
            if key in lines:
                return lines[key]
    return 1


def _valid_keys_hint(loc: tuple) -> str:
    """For an unknown key, list the keys that section accepts."""
    section = _section_model(loc[:-1])
    if section is None:
        return ""
    return f"; valid keys here: {', '.join(sorted(section.model_fields))}"


def _section_model(loc: tuple) -> type[BaseModel] | None:
    model: Any = Deployment
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _first_model(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _union_field(loc: tuple) -> tuple | None:
    """The location of the union field an error's branch tag (``"literal['auto']"``,
    ``'dict[str,float]'``) sits under, or None when the error is not from a union branch."""
    for index, part in enumerate(loc):
        if isinstance(part, str) and "[" in part:
            return _clean_loc(loc[:index])
    return None


def _one_error_per_union(errors: list[Any]) -> list[Any]:
    """pydantic reports a union field's failure once per branch, so a mapping with one bad
    value also got "Input should be 'auto'" (issue 29d). One error per problem: when the
    value was a mapping or list, the branches that wanted a plain word are dropped (the
    mapping's own errors say what is wrong); when every branch failed on the value itself,
    their expectations become one line ("Input should be a valid dictionary or 'billing'")."""
    by_field: dict[tuple, list[Any]] = {}
    for item in errors:
        field = _union_field(tuple(item["loc"]))
        if field is not None:
            by_field.setdefault(field, []).append(item)
    out = []
    for item in errors:
        field = _union_field(tuple(item["loc"]))
        group = by_field.get(field) if field is not None else None
        if group is None or len(group) < 2:
            out.append(item)
            continue
        if item is not group[0]:
            continue
        structured = [g for g in group if not (g["type"] == "literal_error"
                                              and isinstance(g["input"], (dict, list)))]
        if len(structured) < len(group):
            out.extend(structured)
            continue
        expected = [g["msg"].removeprefix("Input should be ") for g in group]
        merged = dict(group[0], loc=tuple(field),
                      msg="Input should be " + " or ".join(dict.fromkeys(expected)))
        out.append(merged)
    return out


def _problems_from(error: ValidationError, lines: dict[tuple, int], path: str) -> list[str]:
    problems = []
    items = [(item, _clean_loc(tuple(item["loc"])))
             for item in _one_error_per_union(error.errors())]
    for item, loc in items:
        # pydantic adds "too short" for a list whose items failed: the item errors say it all
        if item["type"] == "too_short" and any(
            len(other) > len(loc) and other[: len(loc)] == loc for _, other in items
        ):
            continue
        message = item["msg"]
        ctx_error = (item.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _FieldError):
            loc = loc + tuple(ctx_error.loc)
            message = str(ctx_error)
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if item["type"] == "extra_forbidden":
            message = f"unknown key '{loc[-1]}'{_valid_keys_hint(loc)}"
        elif item["type"] == "missing":
            message = "required field is missing"
        line = _nearest_line(lines, loc)
        problems.append(f"{path}:{line}: {_dotted(loc)}: {message}")
    # pydantic reports each union branch separately; keep each line once, in order
    return list(dict.fromkeys(problems))


def _validated(source: YamlSource, path: str, base_dir: Path | None) -> Deployment:
    data = source.data
    if not isinstance(data, dict):
        raise ConfigError(path, [f"{path}:1: (top level): expected a mapping of settings"])
    context = {"base_dir": base_dir} if base_dir is not None else None
    try:
        deployment = Deployment.model_validate(data, context=context)
    except ValidationError as exc:
        raise ConfigError(path, _problems_from(exc, source.lines, path)) from None
    deployment._source = path
    deployment._lines = source.lines
    return deployment


def parse_deployment(text: str, path: str = "<string>", base_dir: Path | None = None) -> Deployment:
    """Validate the YAML ``text`` of a models.yaml. Raises :class:`ConfigError`.

    With ``base_dir``, relative paths (state_dir, db_path, profiles_dir, api_keys_file, tls_cert,
    tls_key, hf_token_file, hf_home, kv_connector.shared_path, environment paths) are
    made absolute against it; without, they are kept as written."""
    try:
        source = parse_yaml(text, path)
    except SourceError as exc:
        raise ConfigError(path, [exc.problem]) from None
    return _validated(source, path, base_dir)


def load_deployment(path: str | Path) -> Deployment:
    """Read and validate ``models.yaml`` at ``path``. Raises :class:`ConfigError`.

    The file must be a regular file of at most ``config_source.MAX_CONFIG_BYTES`` of UTF-8 YAML;
    anything else is refused before it is read whole (see :mod:`coral_hpc.config_source`).
    Relative paths in it resolve against the file's own folder (absolute, ``~`` expanded).
    """
    try:
        source = load_yaml(path)
    except SourceError as exc:
        raise ConfigError(str(path), [exc.problem]) from None
    return _validated(source, str(path), Path(os.path.abspath(path)).parent)


# --------------------------------------------------------------------------- field lines (ops)


def field_line(path: str | Path, loc: tuple[str | int, ...]) -> int:
    """The 1-based line of field ``loc`` (``("models", 2, "min_replicas")``) in the YAML file at
    ``path``, or of its nearest parent present there; 1 when the file cannot be read. For errors
    found after loading (a plan that cannot meet ``min_replicas``) that must still name a line."""
    try:
        source = load_yaml(path)  # the same bounded reader as load_deployment
    except SourceError:
        return 1
    return _nearest_line(source.lines, tuple(loc))


# --------------------------------------------------------------------------- model weights (ops)


def stat_private_file(file: Path, what: str) -> os.stat_result:
    """The ``stat`` of secret file ``file`` once it may hold a secret: it exists, is this user's,
    and neither group nor others may read it (as ssh refuses a loose private key). ValueError
    says how to fix it; ``what`` names the file."""
    import stat

    try:
        info = file.stat()
    except OSError as exc:
        raise ValueError(f"{what} file {file}: cannot read: {exc.strerror}") from None
    if info.st_uid != os.getuid():
        raise ValueError(f"{what} file {file} is owned by uid {info.st_uid}, not by this user")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"{what} file {file} has mode {stat.S_IMODE(info.st_mode):o}: group or others may "
            f"read it; run `chmod 600 {file}`"
        )
    return info


def check_private_file(path: str, what: str) -> None:
    """Refuse a secret file that is missing, empty, not this user's, or that group or others
    could read (:func:`stat_private_file`). ValueError says how to fix it."""
    file = Path(path).expanduser()
    if stat_private_file(file, what).st_size == 0:
        raise ValueError(f"{what} file {file} is empty")


def hf_home_of(deployment: Deployment) -> str:
    """The Hugging Face cache replicas and `coral-hpc stage` use: ``engine.hf_home``, or
    ``<state_dir>/huggingface`` (shared by every deployment of that state_dir), absolute."""
    configured = deployment.engine.hf_home
    base = Path(configured) if configured else Path(deployment.state_dir) / "huggingface"
    return str(base.expanduser().resolve())


# --------------------------------------------------------------------------- the host's paths


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _writable_problem(path: Path, want_dir: bool) -> str | None:
    """Why ``path`` cannot be (created and) written as a file or directory; None if it can."""
    what = "directory" if want_dir else "file"
    if path.exists():
        if path.is_dir() != want_dir:
            actual = "a directory" if path.is_dir() else "not a directory"
            hint = f" such as {path / 'coral.db'}" if path.is_dir() else ""
            return f"{path} is {actual}; give the path of a {what}{hint}"
        if not want_dir and not path.is_file():
            return f"{path} is not a regular file; give the path of a {what}"
        if not os.access(path, os.W_OK | (os.X_OK if want_dir else 0)):
            return f"{path} is not writable by this user"
        return None
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        return f"cannot create {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: {parent} is not writable by this user"
    return None


def measured_profiles_problems(deployment: Deployment) -> list[str]:
    """With ``policy.measured_only``, a plan needs measured profiles: a ``profiles_dir`` that is
    missing or holds none would plan nothing and exit 0 without a word (issue 29c)."""
    if not deployment.policy.measured_only:
        return []
    folder = deployment.measured_profiles_path
    if folder.is_dir() and any(folder.rglob("*.yaml")):
        return []
    field: tuple[str | int, ...] = ("profiles_dir",) if deployment.profiles_dir else (
        "policy", "measured_only")
    found = "holds no profiles" if folder.is_dir() else "does not exist"
    return [deployment.problem(field, (
        f"policy.measured_only plans from measured profiles only, and {folder} {found} "
        "(relative paths are against this file's folder); measure them with `coral-hpc "
        "profile` or set profiles_dir"))]


def host_path_problems(deployment: Deployment) -> list[str]:
    """Problems with the paths ``serve`` writes on this host: ``db_path`` must be (or be
    creatable as) a writable regular file, ``state_dir`` a writable directory.

    Read-only commands (status, cost, logs) do not need this; ``validate`` and ``serve`` do."""
    problems = []
    for field, want_dir in (("db_path", False), ("state_dir", True)):
        path = Path(getattr(deployment, field)).expanduser()
        problem = _writable_problem(path, want_dir)
        if problem:
            problems.append(deployment.problem((field,), problem))
    return problems


# --------------------------------------------------------------------------- private state (ops)


def private_state_problems(deployment: Deployment) -> list[str]:
    """Problems that let other users of a shared login node change what ``serve`` reads: the
    state folder (and this deployment's folder in it) or the database's folder exists and is not
    this user's, or group or others may write it. ``serve`` refuses them (exit 2); folders that
    do not exist yet are created 0700."""
    from coral_hpc.atomic import not_private_problem

    problems = []
    state = Path(deployment.state_dir).expanduser()
    for field, path, what in (
        ("state_dir", state, "state folder"),
        ("state_dir", deployment.state_path, "deployment folder"),
        ("db_path", Path(deployment.db_path).expanduser().parent, "database folder"),
    ):
        problem = not_private_problem(path, what)
        if problem:
            problems.append(deployment.problem((field,), problem))
    return problems
