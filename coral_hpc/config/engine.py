"""The ``engine`` section: which engine replicas run, the arguments every model's engine gets,
the KV connector of disaggregated models, and where model weights and the Hugging Face token
come from."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from coral_hpc.config.base import _against_file, _FieldError, _Frozen
from coral_hpc.config.engine_flags import engine_args_problems
from coral_hpc.config.secret_files import check_private_file

#: vLLM's KV connectors (``--kv-transfer-config``'s ``kv_connector``) coral-hpc can configure:
#: ExampleConnector moves the KV cache through a shared directory (the local cluster, measured
#: in ../shared/VLLM-CPU.md); the others are vLLM's network connectors for GPU sites.
KvConnectorName = Literal["ExampleConnector", "NixlConnector", "LMCacheConnectorV1",
                          "MooncakeConnector", "P2pNcclConnector"]
KV_CONNECTORS: tuple[str, ...] = get_args(KvConnectorName)


class KvConnectorConfig(_Frozen):
    """How a disaggregated model's prefill replicas hand the KV cache to its decode replicas."""

    name: KvConnectorName = Field(
        description="vLLM kv_connector: " + ", ".join(KV_CONNECTORS)
    )
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
