"""The gateway's files, re-read when they change: the routing table the daemon writes, the
API-keys file, the daemon's internal key and the key replicas require. A ``stat`` per poll;
a file is read only when its (inode, mtime, size) changed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from coral_hpc.gateway.auth import KeyChecker, KeysFileError, hash_key, read_keys_file
from coral_hpc.gateway.replicas import Replicas
from coral_hpc.gateway.routing import Router
from coral_hpc.gateway.settings import GatewaySettings
from coral_hpc.gateway.state import GatewayState
from coral_hpc.gateway.table import RoutingTableError, read_routing_table
from coral_hpc.gateway.wake import Waker

log = logging.getLogger("coral_hpc.gateway")


@dataclass
class Reloadable:
    """A file re-read when its (inode, mtime, size) changes."""

    path: Path | None
    stamp: tuple[int, int, int] | None = None
    problem: str | None = field(default=None)

    def changed(self) -> bool:
        """True when the file appeared, changed or went away since the last call."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        return True

    @property
    def gone(self) -> bool:
        """The file was not there at the last :meth:`changed`."""
        return self.stamp is None


def read_internal_key(file: Reloadable) -> str | None:
    """The SHA-256 of the daemon's internal key in ``file``, or None (no file, unreadable, or
    empty: then only client keys open /metrics and /internal/*)."""
    if file.gone or file.path is None:
        return None
    try:
        if os.stat(file.path).st_mode & 0o077:
            log.warning("%s is readable by others; it should be mode 0600", file.path)
        key = Path(file.path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        log.error("cannot read the internal key file %s: %s", file.path, exc.strerror)
        return None
    return hash_key(key) if key else None


class Reloader:
    """Re-reads the gateway's files into ``state``, ``router``, the upstream headers
    (``use_replica_key``) and the waker's view of cold models when they change; :meth:`reload`
    is the poller's step."""

    def __init__(self, settings: GatewaySettings, state: GatewayState, router: Router,
                 replicas: Replicas, use_replica_key: Callable[[str], None],
                 waker: Waker) -> None:
        self.state = state
        self.router = router
        self.replicas = replicas
        self.waker = waker
        self._use_replica_key = use_replica_key
        self._table_file = Reloadable(settings.table_path)
        self._keys_file = Reloadable(settings.api_keys_file)
        self._replica_key_file = Reloadable(settings.replica_key_file)
        self._internal_key_file = Reloadable(settings.internal_key_file)

    def reload(self) -> None:
        """Every file that changed since the last call."""
        self.catch_up_table()
        if self._keys_file.changed():
            self._reload_keys()
        if self._internal_key_file.changed():
            self.state.internal_digest = read_internal_key(self._internal_key_file)
        if self._replica_key_file.changed() and not self._replica_key_file.gone:
            self._reload_replica_key()

    def _reload_keys(self) -> None:
        if self._keys_file.gone:
            # fail closed: deleting the keys file is how an operator revokes every key at once
            self.state.keys = KeyChecker([])
            log.error("API-keys file %s is gone: every key is revoked until it returns",
                      self._keys_file.path)
            return
        path = self._keys_file.path
        assert path is not None  # changed() is never True for a file not configured
        try:
            self.state.keys = KeyChecker(read_keys_file(path))
            log.info("API keys reloaded from %s", self._keys_file.path)
        except KeysFileError as exc:
            # keep the keys we had: a half-edited file must not lock everyone out
            log.error("%s (keeping the previous keys)", exc)

    def _reload_replica_key(self) -> None:
        path = self._replica_key_file.path
        assert path is not None  # changed() is never True for a file not configured
        try:
            if os.stat(path).st_mode & 0o077:
                log.warning("%s is readable by others; it should be mode 0600", path)
            key = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            log.error("cannot read the replica key file %s: %s", path, exc.strerror)
        else:
            self._use_replica_key(key)
            log.info("replica key loaded from %s", path)

    def catch_up_table(self) -> None:
        """Load the routing table if the daemon rewrote it since the last look. The poller calls
        this every ``poll_interval_s``; a request for a model with no replica calls it too, so
        one that arrives just after the daemon routed the model's first replica (and `status`
        called it READY) is served rather than answered 503 until the next poll."""
        if self._table_file.changed() and not self._table_file.gone:
            # a table that went away keeps the routes we have: the daemon rewrites it atomically
            self._reload_table()

    def _reload_table(self) -> None:
        path = self._table_file.path
        assert path is not None  # the gateway is always given a table
        try:
            table = read_routing_table(path)
        except (OSError, RoutingTableError) as exc:
            log.error("routing table not loaded: %s (keeping version %s)", exc, self.router.version)
            return
        if self.router.version is not None and table.version <= self.router.version:
            log.warning("routing table %s has version %d, not newer than %d; ignored",
                        path, table.version, self.router.version)
            return
        diff, dropped = self.router.apply(table)
        self.waker.info = dict(table.wake)  # cold and waking models, as the daemon sees them
        self.state.learn_models(table.models)
        for state in dropped:
            if state.outstanding == 0:
                self.replicas.close(state)
        log.info("routing table version %d: +%d -%d reweighted %d", table.version,
                 len(diff.added), len(diff.removed), len(diff.reweighted))
