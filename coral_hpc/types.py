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

#: Seconds between Slurm's SIGUSR2 warning and the end of the walltime (``--signal=USR2@N``):
#: time for the engine to drain its requests; the reconcile loop counts it off a replica's life.
SIGNAL_LEAD_S = 90
#: Seconds Slurm may send that warning *earlier* than asked: "Due to the resolution of event
#: handling by Slurm, the signal may be sent up to 60 seconds earlier than specified" (sbatch(1),
#: ``--signal``; seen on the local cluster: a 5-minute job warned 106 s before its limit). A
#: replica's usable life is planned to end at the earliest warning, so its successor is READY
#: by then.
SIGNAL_RESOLUTION_S = 60

_DURATION_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")

_TAG_PREFIX = "coral:"
_NAME_PREFIX = "coral."
_FIELD_RE = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class JobTag:
    """Identity of a replica job: deployment, model, replica id, template id, and the instance
    (``coral_hpc.instance``: which state folder's daemon owns it; "" on jobs from before
    instances existed). Two deployments of one name differ by instance."""

    deployment: str
    model: str
    replica_id: str
    template_id: str = ""
    instance: str = ""

    def __post_init__(self) -> None:
        for field in ("deployment", "model", "replica_id"):
            value = getattr(self, field)
            if not _FIELD_RE.match(value):
                raise ValueError(f"JobTag.{field} {value!r} has characters outside [A-Za-z0-9._-]")
        if self.template_id and not _FIELD_RE.match(self.template_id):
            raise ValueError(f"JobTag.template_id {self.template_id!r} is not a safe identifier")
        if self.instance and not _FIELD_RE.match(self.instance):
            raise ValueError(f"JobTag.instance {self.instance!r} is not a safe identifier")

    def job_name(self) -> str:
        """The Slurm job name: ``coral.<deployment>.<model>.<replica_id>`` (shows in squeue)."""
        return f"{_NAME_PREFIX}{self.deployment}.{self.model}.{self.replica_id}"

    def comment(self) -> str:
        """The Slurm job comment, kept by sacct (AccountingStoreFlags=job_comment)."""
        instance = f";instance={self.instance}" if self.instance else ""
        return (
            f"{_TAG_PREFIX}deployment={self.deployment};model={self.model};"
            f"replica={self.replica_id};template={self.template_id}{instance}"
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
                instance=fields.get("instance", ""),
            )
        except (KeyError, ValueError):
            return None


# --------------------------------------------------------------------------- Slurm durations


def slurm_duration_s(text: str) -> int:
    """Seconds in a Slurm duration: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS`` (the one parser: ``models.yaml``'s ``time_limit`` and Slurm's own output).
    Raises ValueError for anything else."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Slurm duration")
    days, first, second, third = match.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


# --------------------------------------------------------------------------- replica layout

#: What a replica serves: both phases (aggregated), or only prefill or only decode (disaggregated).
ROLES = ("both", "prefill", "decode")


#: Between a partition and a reservation in a placement name (``a100@lab-maint``): a character
#: cluster.partitions names may not hold (coral_hpc.config), so the split is unambiguous
PLACEMENT_SEP = "@"


def placement_name(partition: str, reservation: str | None = None) -> str:
    """Where a stage runs as the planner and the daemon name it: the partition, or
    ``partition@reservation`` for a stage that runs in a reservation (``--reservation``)."""
    return f"{partition}{PLACEMENT_SEP}{reservation}" if reservation else partition


def split_placement(name: str) -> tuple[str, str | None]:
    """Inverse of :func:`placement_name`: ``"a100@res"`` → ``("a100", "res")``,
    ``"a100"`` → ``("a100", None)``."""
    partition, sep, reservation = name.partition(PLACEMENT_SEP)
    return partition, (reservation or None) if sep else None


@dataclass(frozen=True)
class StageLayout:
    """One pipeline stage of a replica: one node of ``partition`` with TP GPUs of ``gpu_type``,
    holding ``layers`` consecutive layers of the model; in ``reservation`` when the plan put it
    on a reservation's nodes (the job is submitted with ``--reservation``)."""

    partition: str
    gpu_type: str
    layers: int
    reservation: str | None = None

    @property
    def placement(self) -> str:
        """The partition, or ``partition@reservation`` (:func:`placement_name`)."""
        return placement_name(self.partition, self.reservation)


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
        """Where each stage runs, in pipeline order: its partition, ``partition@reservation``
        for a stage in a reservation (:func:`placement_name`). A replica's identity in plans,
        the store and exclusions, so one in a reservation never stands in for one outside."""
        return tuple(s.placement for s in self.stages)

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
        if len({(s.partition, s.reservation, s.gpu_type) for s in self.stages}) == 1:
            return "multinode"
        return "hetero"

    def to_dict(self) -> dict:
        """Plain JSON data; :meth:`from_dict` reads it back equal."""
        return {"tp": self.tp, "dtype": self.dtype, "role": self.role,
                "stages": [{"partition": s.partition, "gpu_type": s.gpu_type, "layers": s.layers,
                            **({"reservation": s.reservation} if s.reservation else {})}
                           for s in self.stages]}

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaLayout:
        """Inverse of :meth:`to_dict`. Raises ValueError naming the missing or bad field."""
        try:
            stages = tuple(StageLayout(str(s["partition"]), str(s["gpu_type"]), int(s["layers"]),
                                       str(s["reservation"]) if s.get("reservation") else None)
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
    START_FAILED = "start_failed"  #: a replica of a template failed before READY (backs off)
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
