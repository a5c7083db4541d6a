"""What the gateway's file reloads change and its routes read: the models it knows and the keys
it takes. One object, shared by reference, so a reload is seen by the next request."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coral_hpc.gateway.auth import KeyChecker


@dataclass
class GatewayState:
    """The models and keys as of the last reload (:mod:`~coral_hpc.gateway.reload`)."""

    configured: frozenset[str]                   # the configuration's models: 503 when not READY
    keys: KeyChecker | None = None               # client keys; None = no client auth
    known: set[str] = field(default_factory=set)  # configured ∪ the routing table's: else 404
    internal_digest: str | None = None           # SHA-256 of the daemon's internal key

    def __post_init__(self) -> None:
        self.known |= self.configured

    def learn_models(self, table_models: Iterable[str]) -> None:
        """The routing table's models are known from now on, besides the configured ones."""
        self.known = set(self.configured) | set(table_models)
