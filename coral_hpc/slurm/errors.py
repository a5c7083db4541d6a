"""Typed Slurm errors and the ONE table that classifies a failed command.

Callers decide by class, never by message: a :class:`SlurmUnavailable` (a
:class:`~coral_hpc.errors.TransientError`) is retried with backoff; a :class:`SlurmRejected` (a
:class:`~coral_hpc.errors.PermanentError`) is surfaced. Only :func:`classify` looks at stderr text,
through :data:`STDERR_RULES`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from coral_hpc.errors import PermanentError, TransientError


class SlurmError(Exception):
    """Mixin carrying what ran and what Slurm said."""

    def __init__(
        self,
        message: str,
        argv: Sequence[str] = (),
        returncode: int | None = None,
        stderr: str = "",
    ):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message)


class SlurmUnavailable(SlurmError, TransientError):
    """slurmctld or slurmdbd did not answer (down, restarting, overloaded): try again later."""


class SlurmTimeout(SlurmUnavailable):
    """A Slurm command ran past its timeout. For sbatch the job may still have been submitted:
    adopt by tag on the next cycle rather than submitting again."""


class SlurmRejected(SlurmError, PermanentError):
    """Slurm refused the request: invalid partition, account, QOS, GRES or node configuration,
    a drained partition, a policy limit. Retrying will not help until a person changes something."""


class SlurmJobNotFound(SlurmRejected):
    """Slurm does not know the job id (finished and purged, or never existed)."""


class SlurmNotInstalled(SlurmError, PermanentError):
    """A Slurm client command is not on PATH."""


class SlurmMisconfigured(SlurmError, PermanentError):
    """This host's Slurm client configuration (``SLURM_CONF``, slurm.conf) is missing or
    unreadable: every command fails the same way until a person fixes it, so it is never
    retried."""


class SlurmCommandError(SlurmError, PermanentError):
    """A Slurm command failed in a way the table does not know; surfaced with its stderr."""


class SlurmParseError(SlurmError, PermanentError):
    """Slurm answered something the parsers do not understand (a schema or format change)."""


#: (pattern on stderr, error class, short reason). First match wins; order specific → general.
#: Patterns are Slurm's own messages (recorded in tests/data/slurm/22.05/*.stderr).
STDERR_RULES: tuple[tuple[re.Pattern[str], type[SlurmError], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cls, reason)
    for pattern, cls, reason in (
        # a missing or broken slurm.conf: every Slurm command fails alike, retrying cannot help
        (r"Unable to process configuration file|s_p_parse_file: cannot stat file",
         SlurmMisconfigured, "this host's Slurm configuration cannot be read"),
        (r"Invalid job id specified", SlurmJobNotFound, "unknown job id"),
        # a site without slurmdbd: retrying cannot help, and cost reports must say so, not show 0
        (r"accounting storage is disabled", SlurmRejected,
         "Slurm accounting (slurmdbd) is disabled on this cluster"),
        (r"Unable to contact slurm controller", SlurmUnavailable, "slurmctld unreachable"),
        (r"Slurm backup controller in standby mode", SlurmUnavailable, "slurmctld in standby"),
        (r"Socket timed out on send/recv", SlurmUnavailable, "slurmctld timed out"),
        (r"Zero Bytes were transmitted or received", SlurmUnavailable, "connection dropped"),
        (r"Problem talking to the database", SlurmUnavailable, "slurmdbd unreachable"),
        (r"persistent connection to host", SlurmUnavailable, "slurmdbd unreachable"),
        (r"Unable to connect to database", SlurmUnavailable, "slurmdbd unreachable"),
        (r"Resource temporarily unavailable", SlurmUnavailable, "resource temporarily unavailable"),
        (r"Connection refused|connect failure", SlurmUnavailable, "connection refused"),
        (r"Invalid partition name specified|invalid partition specified", SlurmRejected,
         "invalid partition"),
        (r"Invalid account or account/partition combination", SlurmRejected, "invalid account"),
        (r"Invalid qos specification", SlurmRejected, "invalid QOS"),
        (r"Required partition not available", SlurmRejected, "partition drained or inactive"),
        (r"Requested node configuration is not available", SlurmRejected,
         "no node has this configuration"),
        (r"Invalid generic resource \(gres\) specification", SlurmRejected, "invalid GRES"),
        (r"Requested time limit is invalid", SlurmRejected, "time limit above the partition's"),
        (r"Job violates accounting/QOS policy", SlurmRejected, "QOS or association limit"),
        (r"Access/permission denied|Access denied", SlurmRejected, "permission denied"),
        (r"Memory required by task is not available", SlurmRejected, "memory not available"),
        (r"Node count specification invalid", SlurmRejected, "invalid node count"),
    )
)


def classify(argv: Sequence[str], returncode: int, stderr: str) -> SlurmError:
    """The typed error for a Slurm command that exited with ``returncode`` ≠ 0."""
    command = argv[0] if argv else "?"
    text = stderr.strip()
    for pattern, cls, reason in STDERR_RULES:
        if pattern.search(text):
            return cls(f"{command}: {reason}: {_last_line(text)}", argv, returncode, stderr)
    return SlurmCommandError(
        f"{command} exited {returncode}: {_last_line(text) or 'no message'}", argv, returncode, stderr
    )


def config_file_problem(argv: Sequence[str],
                        env: Mapping[str, str]) -> SlurmMisconfigured | None:
    """The error for a ``SLURM_CONF`` that names no readable file, before running ``argv``:
    Slurm's commands retry such a file for 60 s (``s_p_parse_file: cannot stat file ...,
    retrying in 1sec up to 60sec``) and then fail, which retries here would only repeat.
    None when SLURM_CONF is unset (Slurm's own default, or configless) or readable."""
    path = env.get("SLURM_CONF")
    if not path:
        return None
    try:
        with open(path, "rb"):
            return None
    except OSError as exc:
        said = (f"s_p_parse_file: cannot stat file {path}: {exc.strerror}" if
                isinstance(exc, FileNotFoundError) else f"cannot read {path}: {exc.strerror}")
        command = argv[0] if argv else "?"
        return SlurmMisconfigured(
            f"{command}: this host's Slurm configuration cannot be read: {said} "
            f"(SLURM_CONF={path}); Slurm would retry for 60 s and then stop with "
            "'Unable to process configuration file'", argv, None, said)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
