"""Small value types shared across layers.

:class:`JobTag` is how coral-hpc recognises its own Slurm jobs: written by ``coral_hpc.launch``
into the job name and comment, read back by ``coral_hpc.slurm`` when it observes the queue and
sacct. One format, one place.
"""

from __future__ import annotations

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
    def from_comment(cls, comment: str | None) -> "JobTag | None":
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
