"""Small value types shared across layers.

:class:`JobTag` is how coral-hpc recognises its own Slurm jobs: written by ``coral_hpc.launch``
into the job name and comment, read back by ``coral_hpc.slurm`` when it observes the queue and
sacct. One format, one place.

:class:`ReplicaLayout` is how one replica runs (made by ``coral_hpc.plan``, carried to launch,
store and status); :class:`TemplateExclusion` / :class:`ShapeExclusion` are what a cool-down or
timeout keeps out of plans.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_TAG_PREFIX = "coral:"
_NAME_PREFIX = "coral."
_FIELD_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class JobTag:
    """Identity of a replica job: deployment, model, replica id and template id."""

    deployment: str
    model: str
    replica_id: str
    template_id: str = ""

    def __post_init__(self) -> None:
        for field in ("deployment", "model", "replica_id"):
            value = getattr(self, field)
            if not _FIELD_RE.match(value):
                raise ValueError(f"JobTag.{field} {value!r} has characters outside [A-Za-z0-9._-]")
        if self.template_id and not _FIELD_RE.match(self.template_id):
            raise ValueError(f"JobTag.template_id {self.template_id!r} is not a safe identifier")

    def job_name(self) -> str:
        """The Slurm job name: ``coral.<deployment>.<model>.<replica_id>`` (shows in squeue)."""
        return f"{_NAME_PREFIX}{self.deployment}.{self.model}.{self.replica_id}"

    def comment(self) -> str:
        """The Slurm job comment, kept by sacct (AccountingStoreFlags=job_comment)."""
        return (
            f"{_TAG_PREFIX}deployment={self.deployment};model={self.model};"
            f"replica={self.replica_id};template={self.template_id}"
        )

    @classmethod
    def from_comment(cls, comment: str | None) -> JobTag | None:
        """Parse a job comment; None when it is not a coral-hpc tag (someone else's job)."""
        if not comment or not comment.startswith(_TAG_PREFIX):
            return None
        fields: dict[str, str] = {}
        for part in comment[len(_TAG_PREFIX):].split(";"):
            key, sep, value = part.partition("=")
            if not sep:
                return None
            fields[key.strip()] = value.strip()
        try:
            return cls(
                deployment=fields["deployment"],
                model=fields["model"],
                replica_id=fields["replica"],
                template_id=fields.get("template", ""),
            )
        except (KeyError, ValueError):
            return None


# --------------------------------------------------------------------------- replica layout

#: What a replica serves: both phases (aggregated), or only prefill or only decode (disaggregated).
ROLES = ("both", "prefill", "decode")


@dataclass(frozen=True)
class StageLayout:
    """One pipeline stage of a replica: one node of ``partition`` with TP GPUs of ``gpu_type``,
    holding ``layers`` consecutive layers of the model."""

    partition: str
    gpu_type: str
    layers: int


@dataclass(frozen=True)
class ReplicaLayout:
    """How one replica runs, made once from a plan row (``coral_hpc.plan.layout``) and carried
    unchanged to the replica spec, the store, adoption, ``status`` and the rendered scripts.

    One TP degree for every stage (vLLM requires it), one stage per node, stages in pipeline
    order. ``dtype`` is vLLM's ``--dtype`` for these GPUs (every stage must agree)."""

    tp: int
    stages: tuple[StageLayout, ...]
    dtype: str
    role: str = "both"

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a replica layout needs at least one stage")
        if self.tp < 1:
            raise ValueError(f"layout tp must be ≥ 1, got {self.tp}")
        for index, stage in enumerate(self.stages):
            if stage.layers < 1:
                raise ValueError(f"layout stage {index} holds no layers")
        if self.role not in ROLES:
            raise ValueError(f"layout role {self.role!r} is not one of {', '.join(ROLES)}")

    @property
    def pp(self) -> int:
        """Pipeline-parallel size = stages = nodes."""
        return len(self.stages)

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partition of each stage, in pipeline order."""
        return tuple(s.partition for s in self.stages)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU type of each stage, in pipeline order."""
        return tuple(s.gpu_type for s in self.stages)

    @property
    def total_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def layer_partition(self) -> str:
        """``VLLM_PP_LAYER_PARTITION``: layers per stage, comma separated, in pipeline order."""
        return ",".join(str(s.layers) for s in self.stages)

    @property
    def kind(self) -> str:
        """``single`` (one node), ``multinode`` (identical nodes of one partition: one Slurm job
        of ``pp`` nodes) or ``hetero`` (stages differ in partition or GPU type: a Slurm
        heterogeneous job)."""
        if self.pp == 1:
            return "single"
        if len({(s.partition, s.gpu_type) for s in self.stages}) == 1:
            return "multinode"
        return "hetero"

    def to_dict(self) -> dict:
        """Plain JSON data; :meth:`from_dict` reads it back equal."""
        return {"tp": self.tp, "dtype": self.dtype, "role": self.role,
                "stages": [{"partition": s.partition, "gpu_type": s.gpu_type, "layers": s.layers}
                           for s in self.stages]}

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaLayout:
        """Inverse of :meth:`to_dict`. Raises ValueError naming the missing or bad field."""
        try:
            stages = tuple(StageLayout(str(s["partition"]), str(s["gpu_type"]), int(s["layers"]))
                           for s in data["stages"])
            # rows written before the layout carried its dtype: "auto", what every replica
            # on a bf16-capable GPU was launched with then
            return cls(int(data["tp"]), stages, str(data.get("dtype", "auto")),
                       str(data.get("role", "both")))
        except KeyError as exc:
            raise ValueError(f"replica layout without {exc.args[0]!r}: {data!r}") from None
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"not a replica layout: {data!r} ({exc})") from None


# --------------------------------------------------------------------------- exclusions


class ExclusionKind(str, enum.Enum):
    """Why something is kept out of plans for a while."""

    CRASH_COOLDOWN = "crash_cooldown"  #: a template crashed ``crash_limit`` times
    PENDING_TIMEOUT = "pending_timeout"  #: a replica of a shape sat pending past the timeout
    SUBMIT_REFUSED = "submit_refused"  #: Slurm refused a shape (drained partition, bad GRES)


@dataclass(frozen=True)
class TemplateExclusion:
    """A template kept out of plans wherever it would run (crash cool-down)."""

    template_id: str

    @property
    def key(self) -> str:
        """The store's key: ``template:<id>``."""
        return f"template:{self.template_id}"


@dataclass(frozen=True)
class ShapeExclusion:
    """A template kept out of some partitions, stage by stage (pending timeout, refusal)."""

    template_id: str
    partitions: tuple[str, ...]

    @property
    def key(self) -> str:
        """The store's key: ``shape:<id>@<partition of each stage>``."""
        return f"shape:{self.template_id}@{','.join(self.partitions)}"


Excluded = TemplateExclusion | ShapeExclusion


def excluded_from_key(key: str) -> Excluded:
    """Inverse of ``.key`` (the store reads its column back). ValueError for anything else."""
    kind, sep, body = key.partition(":")
    if sep and kind == "template" and body:
        return TemplateExclusion(body)
    if sep and kind == "shape":
        template, at, parts = body.rpartition("@")
        if at and template:
            return ShapeExclusion(template, tuple(p for p in parts.split(",") if p))
    raise ValueError(f"not an exclusion key: {key!r} (template:<id> or shape:<id>@<partitions>)")
