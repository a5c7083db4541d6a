"""The whole of ``models.yaml`` (:class:`Deployment`): its top-level keys, the checks that span
sections, and the values derived from it (the Slurm call budget, the Hugging Face cache)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PrivateAttr, field_validator, model_validator

from coral_hpc.config.base import _SAFE_NAME_RE, _against_file, _FieldError, _Frozen
from coral_hpc.config.cluster import ClusterConfig
from coral_hpc.config.engine import KV_CONNECTORS, EngineConfig
from coral_hpc.config.gateway import GatewayConfig
from coral_hpc.config.locate import _dotted, _nearest_line
from coral_hpc.config.models import ModelConfig
from coral_hpc.config.policy import PolicyConfig, RetentionConfig
from coral_hpc.config.source import FieldLines, FieldPath


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
    catalog: str | None = Field(
        default=None,
        description="a site catalogue: a YAML file of GPU types and model entries that add to "
        "or override the shipped ones (see docs/catalog.md); relative to this file",
    )
    cluster: ClusterConfig
    engine: EngineConfig = EngineConfig()
    gateway: GatewayConfig = GatewayConfig()
    policy: PolicyConfig = PolicyConfig()
    retention: RetentionConfig = RetentionConfig()
    models: tuple[ModelConfig, ...] = Field(min_length=1)

    # relative paths mean "beside this models.yaml", not "below wherever serve was started"
    _resolve = field_validator("state_dir", "db_path", "profiles_dir", "catalog")(_against_file)

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
        self._check_names()
        self._check_engine_needs()
        self._check_catalog_prices()
        return self

    def _check_catalog_prices(self) -> None:
        """``price: catalog`` takes each GPU type's price from the site catalogue: there must be
        one (whether it prices every type is checked when it is read: coral_hpc.model_archs)."""
        for index, part in enumerate(self.cluster.partitions):
            if part.price == "catalog" and self.catalog is None:
                raise _FieldError(
                    ("cluster", "partitions", index, "price"),
                    "'catalog' takes each GPU type's price_per_gpu_hour from the site catalogue, "
                    "and this file names none: add catalog: FILE (docs/catalog.md) or give "
                    "prices here",
                )

    def _check_names(self) -> None:
        """Model names are unique; the partitions models and compatible_with name exist."""
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

    def _check_engine_needs(self) -> None:
        """What the policy and engine kind need of the other sections: disaggregated vLLM a KV
        connector, vLLM an environment per partition. (measured_only with disaggregation needs
        role profiles: :func:`coral_hpc.config.host.measured_profiles_problems`.)"""
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

    #: where the deployment was read from, and the line of every field (for later checks' errors)
    _source: str = PrivateAttr(default="<string>")
    _lines: FieldLines = PrivateAttr(default_factory=dict)
    #: model name -> where its architecture came from (coral_hpc.model_archs.Derivation); filled
    #: by coral_hpc.model_archs.derive_models, which the configuration does not import
    _derived: dict[str, object] = PrivateAttr(default_factory=dict)
    #: model name -> its observed request lengths (coral_solver.types.ObservedLengths), which
    #: Stage 1's simulated capacity draws from: read from models[].lengths.trace by
    #: coral_hpc.model_lengths.read_lengths, or the lengths `coral-hpc simulate` replays
    _lengths: dict[str, object] = PrivateAttr(default_factory=dict)

    def problem(self, loc: FieldPath, message: str) -> str:
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
    default_poll: float = PolicyConfig.model_fields["poll_interval_s"].default
    return DEFAULT_SLURM_CALLS_PER_MIN * max(1.0, default_poll / deployment.policy.poll_interval_s)


def hf_home_of(deployment: Deployment) -> str:
    """The Hugging Face cache replicas and `coral-hpc stage` use: ``engine.hf_home``, or
    ``<state_dir>/huggingface`` (shared by every deployment of that state_dir), absolute."""
    configured = deployment.engine.hf_home
    base = Path(configured) if configured else Path(deployment.state_dir) / "huggingface"
    return str(base.expanduser().resolve())
