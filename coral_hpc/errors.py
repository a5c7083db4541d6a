"""Error types shared by every layer.

Errors are split by *class*, never by message text: a :class:`TransientError` is retried after a
delay (slurmctld restarting, a timeout), a :class:`PermanentError` stops the action and is surfaced
(bad partition, bad account, invalid configuration).
"""

from __future__ import annotations


class CoralError(Exception):
    """Base of every error coral-hpc raises on purpose."""


class TransientError(CoralError):
    """Worth retrying later: the system may answer differently in a moment."""


class PermanentError(CoralError):
    """Retrying will not help until a person changes something."""


class ConfigError(PermanentError):
    """``models.yaml`` is invalid. ``problems`` holds one line per problem, each naming
    the file, line and field and what would be valid."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
