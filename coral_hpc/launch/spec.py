"""What one replica job runs: :class:`ReplicaSpec`, plain frozen data.

The daemon builds a spec with :func:`replica_spec` from the deployment and a plan row; the
submit side turns it into a Slurm job, the job side (:mod:`coral_hpc.launch.entrypoint`) reads it
back from ``spec.json`` and starts the engine. One pipeline stage runs on one node (TP inside the
node, ARCHITECTURE.md), so ``len(stages)`` is the pipeline-parallel size and the number of nodes.

Secrets are never part of a spec: it names the files that hold them (readable only by the user).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter

from coral_hpc.atomic import write_atomic
from coral_hpc.config import (
    DEFAULT_CPUS_PER_GPU,
    DEFAULT_MEM_PER_GPU_GB,
    ApptainerEnvironment,
    Deployment,
    EngineEnvironment,
    ModuleEnvironment,
    VenvEnvironment,
    hf_home_of,
)
from coral_hpc.errors import PermanentError
from coral_hpc.slurm.job_shape import ReplicaShape, replica_shape
from coral_hpc.types import SIGNAL_LEAD_S, JobTag, ReplicaLayout, StageLayout

__all__ = ["SIGNAL_LEAD_S", "ReplicaSpec", "SpecError", "StageRequest", "StageSpec", "replica_spec"]

Environment = VenvEnvironment | ModuleEnvironment | ApptainerEnvironment
_ENV_ADAPTER: TypeAdapter = TypeAdapter(EngineEnvironment)



class SpecError(PermanentError):
    """A replica spec that cannot run (no stages, mismatched TP, missing environment...)."""


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: one node of ``partition`` with ``gpus_per_node`` GPUs of ``gpu_type``
    (the TP degree), holding ``layers`` consecutive layers of the model."""

    partition: str
    gpu_type: str
    gpus_per_node: int
    layers: int
    #: how vLLM starts on this partition; None for the sim engine
    environment: Environment | None = None
    #: the reservation the stage runs in (``--reservation``), when the plan put it in one
    reservation: str | None = None

    @property
    def shape(self) -> tuple[str, str, int]:
        """What Slurm must allocate for this stage: (partition, GPU type, GPUs)."""
        return (self.partition, self.gpu_type, self.gpus_per_node)


@dataclass(frozen=True)
class StageRequest:
    """What one stage asks Slurm for, in Slurm's own spelling: the one job shape both submitit
    and the hetjob script use."""

    partition: str
    gres: str  #: ``gpu:TYPE:N``
    cpus: int  #: ``--cpus-per-task``
    mem: str  #: ``--mem``, whole GB (``32G``)
    reservation: str | None = None  #: ``--reservation``


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica job needs; JSON round-trips through :meth:`to_json` and
    :meth:`from_json`."""

    deployment: str
    model: str  # served model name (``--served-model-name``)
    model_source: str  # Hugging Face id or path on the shared filesystem
    replica_id: str
    template_id: str
    stages: tuple[StageSpec, ...]
    tp: int
    engine_kind: Literal["vllm", "sim"]
    state_path: str  # <state_dir>/<deployment>, on the filesystem jobs share
    time_limit_s: int
    engine_args: tuple[str, ...] = ()
    dtype: str = "auto"
    role: str = "both"  # both phases, or prefill / decode only (ReplicaLayout.role)
    #: vLLM's --kv-transfer-config (JSON) of a prefill or decode replica; None when aggregated
    kv_transfer_config: str | None = None
    max_model_len: int | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_gpu: int = DEFAULT_CPUS_PER_GPU
    mem_per_gpu_gb: int = DEFAULT_MEM_PER_GPU_GB
    api_key_file: str | None = None  # file (mode 600) whose content becomes VLLM_API_KEY
    hf_token_file: str | None = None  # file (mode 600) whose content becomes HF_TOKEN
    hf_home: str | None = None  # the site's shared Hugging Face cache: HF_HOME of the engine
    python: str = field(default_factory=lambda: sys.executable)  # runs the entrypoint (and sim)
    sim_arch: str | None = None  # architecture name for the sim engine's performance model
    sim_catalog: str | None = None  # the site catalogue (models.yaml catalog:) the sim reads
    health_timeout_s: float = 1800.0  # loading a large model from a network FS takes minutes
    drain_timeout_s: float = 60.0  # after SIGTERM, how long the engine may finish requests
    instance: str = ""  # coral_hpc.instance: the state folder's id, written into the job's tag
    #: vLLM's runner flags of an embedding model (``--runner pooling``, ``--convert embed`` for
    #: a decoder checkpoint); empty for a model that generates (:func:`runner_args`)
    runner_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.stages:
            raise SpecError(f"replica {self.replica_id}: a replica needs at least one stage")
        if self.tp < 1:
            raise SpecError(f"replica {self.replica_id}: tp must be ≥ 1, got {self.tp}")
        for index, stage in enumerate(self.stages):
            if stage.gpus_per_node != self.tp:
                raise SpecError(
                    f"replica {self.replica_id}: stage {index} has {stage.gpus_per_node} GPUs but "
                    f"tp is {self.tp}; vLLM needs one TP degree for every stage"
                )
            if stage.layers < 1:
                raise SpecError(f"replica {self.replica_id}: stage {index} holds no layers")
            if self.engine_kind == "vllm" and stage.environment is None:
                raise SpecError(
                    f"replica {self.replica_id}: stage {index} on partition {stage.partition!r} "
                    "has no vLLM environment (cluster.partitions[].environment)"
                )
        envs = {json.dumps(_env_dict(s.environment), sort_keys=True) for s in self.stages}
        if len(envs) > 1:
            # one engine process group spans every stage: they must run the same vLLM build
            raise SpecError(
                f"replica {self.replica_id}: its stages' partitions name different vLLM "
                "environments; a pipeline needs the same vLLM on every node"
            )
        _ = self.tag  # JobTag validates the identifiers
        try:
            _ = self.layout  # ReplicaLayout validates the role
        except ValueError as exc:
            raise SpecError(f"replica {self.replica_id}: {exc}") from None

    # ------------------------------------------------------------------ derived facts

    @property
    def pp(self) -> int:
        """Pipeline-parallel size = stages = nodes."""
        return len(self.stages)

    @property
    def layout(self) -> ReplicaLayout:
        """The replica's layout, equal to the one :func:`replica_spec` was built from (its
        ``kind``: ``single``, ``multinode`` or ``hetero`` picks how the job is submitted)."""
        return ReplicaLayout(
            self.tp, tuple(StageLayout(s.partition, s.gpu_type, s.layers, s.reservation)
                           for s in self.stages),
            self.dtype, self.role)

    @property
    def layer_partition(self) -> str:
        """``VLLM_PP_LAYER_PARTITION``: layers per stage, comma separated, in pipeline order."""
        return self.layout.layer_partition

    def stage_request(self, stage: StageSpec) -> StageRequest:
        """What ``stage`` asks Slurm for: its GPUs and ``cpus_per_gpu`` / ``mem_per_gpu_gb``
        per GPU (the shape the planner prices and fits on nodes)."""
        gpus = stage.gpus_per_node
        return StageRequest(stage.partition, f"gpu:{stage.gpu_type}:{gpus}",
                            self.cpus_per_gpu * gpus, f"{self.mem_per_gpu_gb * gpus}G",
                            stage.reservation)

    @property
    def environment(self) -> Environment | None:
        """The engine environment (the same on every stage, checked on construction)."""
        return self.stages[0].environment

    @property
    def env_kind(self) -> str:
        """Which launch prelude the job renders: venv, module, apptainer, or sim."""
        if self.engine_kind == "sim":
            return "sim"
        assert self.environment is not None
        return self.environment.kind

    @property
    def tag(self) -> JobTag:
        """The job name and comment that mark this job as ours."""
        return JobTag(self.deployment, self.model, self.replica_id, self.template_id,
                      self.instance)

    @property
    def total_gpus(self) -> int:
        return sum(s.gpus_per_node for s in self.stages)

    @property
    def time_limit_min(self) -> int:
        """Slurm takes minutes; round up so a replica never gets less than configured."""
        return max(1, -(-self.time_limit_s // 60))

    # ------------------------------------------------------------------ state paths

    @property
    def logs_dir(self) -> Path:
        return Path(self.state_path) / "logs"

    @property
    def endpoints_dir(self) -> Path:
        return Path(self.state_path) / "endpoints"

    @property
    def endpoint_file(self) -> Path:
        """Written by the job once the engine answers /health."""
        return self.endpoints_dir / f"{self.replica_id}.json"

    @property
    def replica_dir(self) -> Path:
        """spec.json, the rendered hetjob script and engine launch scripts of this replica."""
        return Path(self.state_path) / "replicas" / self.replica_id

    @property
    def spec_file(self) -> Path:
        return self.replica_dir / "spec.json"

    def run_dir(self, job_id: str) -> Path:
        """Per-job rendezvous folder: the head node publishes its address here for the others."""
        return Path(self.state_path) / "run" / job_id

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> str:
        """Serialise to JSON (environments as their config dicts)."""
        data = asdict(self)
        data["stages"] = [
            {**asdict(s), "environment": _env_dict(s.environment)} for s in self.stages
        ]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ReplicaSpec:
        """Inverse of :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        data["stages"] = tuple(
            StageSpec(
                **{
                    **stage,
                    "environment": None
                    if stage.get("environment") is None
                    else _ENV_ADAPTER.validate_python(stage["environment"]),
                }
            )
            for stage in data["stages"]
        )
        data["engine_args"] = tuple(data.get("engine_args", ()))
        data["runner_args"] = tuple(data.get("runner_args", ()))
        return cls(**data)

    def write(self) -> Path:
        """Write ``spec.json`` into the replica folder (atomically) and return its path."""
        write_atomic(self.spec_file, self.to_json())
        return self.spec_file


def spec_path(state_path: Path, replica_id: str) -> Path:
    """Where a replica's ``spec.json`` lives under the deployment's state folder."""
    return Path(state_path) / "replicas" / replica_id / "spec.json"


def is_pre_instance_job_of(tag: JobTag, state_path: Path, deployment: str) -> bool:
    """Whether a job submitted before instance tags existed (its tag names no instance) belongs
    to the deployment served from ``state_path``: its ``spec.json`` there is readable, names
    this deployment, this replica and no instance, and was written for this very state folder.
    The state folder is what makes an instance (its instance id lives there), so a job that
    ran from it is this instance's; a job of another copy of the deployment has its spec in
    that copy's folder and stays left alone."""
    if tag.instance:
        return False
    try:
        spec = ReplicaSpec.from_json(spec_path(state_path, tag.replica_id).read_text())
    except (OSError, ValueError, TypeError, KeyError, PermanentError):
        return False
    return (spec.instance == "" and spec.deployment == deployment == tag.deployment
            and spec.replica_id == tag.replica_id
            and Path(spec.state_path).resolve() == Path(state_path).resolve())


def _env_dict(environment: Environment | None) -> dict[str, Any] | None:
    return None if environment is None else environment.model_dump(mode="json")


def replica_spec(
    deployment: Deployment,
    model: str,
    replica_id: str,
    template_id: str,
    layout: ReplicaLayout,
    *,
    api_key_file: str | Path | None,
    hf_token_file: str | Path | None = None,
    instance: str = "",
    python: str | None = None,
    time_limit_s: int | None = None,
    shape: ReplicaShape | None = None,
) -> ReplicaSpec:
    """Build the spec of one replica from the deployment and a plan row's ``layout`` (whose
    TP, stages, dtype and role the spec carries unchanged: ``spec.layout == layout``).

    Engine kind, environments, extra args, time limit, account/QOS, per-GPU CPUs/memory, the
    Hugging Face token file and cache (``engine.hf_token_file``, ``engine.hf_home``) come from
    ``deployment``; ``time_limit_s`` replaces the configured time limit when a partition's
    MaxTime is shorter (the plan's slot says). Stages on partitions declared interchangeable
    (``compatible_with``) all run the first stage's environment. Raises :class:`SpecError` for a
    stage that cannot run.
    """
    if hf_token_file is None:
        hf_token_file = deployment.engine.hf_token_file
    config = deployment.model(model)
    return ReplicaSpec(
        deployment=deployment.deployment,
        model=config.name,
        model_source=config.source,
        replica_id=replica_id,
        template_id=template_id,
        stages=_stage_specs(deployment, replica_id, layout),
        tp=layout.tp,
        engine_kind=deployment.engine.kind,
        state_path=str(deployment.state_path.resolve()),
        time_limit_s=int(time_limit_s) if time_limit_s else deployment.cluster.time_limit_s,
        engine_args=tuple(deployment.engine.args) + tuple(config.vllm_args),
        dtype=layout.dtype,
        role=layout.role,
        kv_transfer_config=kv_transfer_config(deployment, layout.role),
        max_model_len=config.max_model_len,
        account=deployment.cluster.account,
        qos=deployment.cluster.qos,
        # the plan's shape (coral_hpc.slurm.job_shape: models.yaml, else the partitions'
        # defaults), so the job asks what the planner packed; without one, models.yaml's
        cpus_per_gpu=(shape or replica_shape(deployment.cluster)).cpus_per_gpu,
        mem_per_gpu_gb=(shape or replica_shape(deployment.cluster)).mem_per_gpu_gb,
        api_key_file=None if api_key_file is None else str(api_key_file),
        hf_token_file=None if hf_token_file is None else str(Path(hf_token_file).expanduser()),
        hf_home=hf_home_of(deployment),
        python=python or sys.executable,
        sim_arch=config.arch_key,
        sim_catalog=deployment.catalog,
        instance=instance,
        runner_args=runner_args(config.embedding, config.arch_key),
    )


def _stage_specs(deployment: Deployment, replica_id: str,
                 layout: ReplicaLayout) -> tuple[StageSpec, ...]:
    """Each stage of ``layout`` on its partition, with the partition's engine environment (vLLM
    only); stages on partitions declared interchangeable all run the first stage's."""
    partitions = {p.name: p for p in deployment.cluster.partitions}
    built = []
    for index, stage in enumerate(layout.stages):
        if stage.partition not in partitions:
            raise SpecError(
                f"replica {replica_id}: stage {index} names partition {stage.partition!r}, not "
                f"in cluster.partitions (valid: {sorted(partitions)})"
            )
        env = (partitions[stage.partition].environment if deployment.engine.kind == "vllm"
               else None)
        built.append(StageSpec(stage.partition, stage.gpu_type, layout.tp, stage.layers, env,
                               stage.reservation))
    names = {s.partition for s in built}
    if len(names) > 1 and any(names <= set(g) for g in deployment.environment_groups()):
        # declared interchangeable (compatible_with): every stage runs the first stage's vLLM
        built = [replace(s, environment=built[0].environment) for s in built]
    return tuple(built)


def runner_args(embedding: bool, arch_key: str) -> tuple[str, ...]:
    """vLLM flags that serve an embedding model at ``/v1/embeddings`` (vLLM 0.32:
    ``--runner pooling``; ``--convert embed`` turns a ``...ForCausalLM`` checkpoint such as
    Qwen3-Embedding into one, while a native embedding architecture, e.g. BertModel, needs
    none). Empty for a model that generates: vLLM's ``--runner auto`` picks generate for it."""
    if not embedding:
        return ()
    from coral_solver import catalog

    try:
        native = catalog.model_arch(arch_key).pooling
    except KeyError:
        native = False
    return ("--runner", "pooling") if native else ("--runner", "pooling", "--convert", "embed")


#: subfolder of ``<state_dir>/<deployment>`` where ExampleConnector keeps prompts' KV by default
KV_DIR_NAME = "kv"


def kv_transfer_config(deployment: Deployment, role: str) -> str | None:
    """vLLM's ``--kv-transfer-config`` for a replica in ``role``: None for an aggregated one;
    for prefill and decode replicas the deployment's ``engine.kv_connector``, ``kv_role``
    ``kv_both`` (vLLM decides per request which side a server takes, from the request's
    ``kv_transfer_params``, so either replica works with the same config). ExampleConnector's
    directory defaults to ``<state_dir>/<deployment>/kv`` on the filesystem jobs share; the sim
    engine, which moves no KV, gets an ExampleConnector config when none is set."""
    if role == "both":
        return None
    connector = deployment.engine.kv_connector
    if connector is None:
        if deployment.engine.kind == "vllm":
            raise SpecError(f"a {role} replica needs engine.kv_connector in models.yaml")
        name, extra, path = "ExampleConnector", {}, None
    else:
        name, extra, path = connector.name, dict(connector.extra_config), connector.shared_path
    if name == "ExampleConnector":
        shared = path or str(deployment.state_path.resolve() / KV_DIR_NAME)
        extra = {"shared_storage_path": shared, **extra}
    config: dict[str, Any] = {"kv_connector": name, "kv_role": "kv_both"}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config, sort_keys=True)
