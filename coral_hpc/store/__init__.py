"""The daemon's SQLite database: replicas, plans, events, metered demand, start-up history.

One file on the daemon host's local disk (``db_path`` in ``models.yaml``), never on a network
filesystem: SQLite's locking is not safe there. WAL mode, so ``coral-hpc status`` can read while
the daemon writes.

Design rules (../shared/ARCHITECTURE.md, "State"):

- An explicit schema, changed only by numbered migrations recorded in ``schema_migrations``
  (:mod:`coral_hpc.store.migrations`); a database newer than this code is refused rather than
  misread.
- No pickles. Columns hold plain values; the few JSON text columns hold small plain data
  (a replica's layout, a plan's rows) that is written and read through :mod:`json` only
  (:mod:`coral_hpc.store.access`).
- A replica row stores *facts* (times something happened, the last Slurm state seen); its
  status is derived from them by ``coral_hpc.reconcile.replica_status``, never stored.
- Constructing a :class:`Store` opens nothing: :func:`open_store`
  (:mod:`coral_hpc.store.opening`) opens the file and migrates. Every timestamp is passed in by
  the caller (seconds since the epoch), so tests use a fake clock.
"""

from __future__ import annotations

from coral_hpc.records import (
    DemandInterval,
    Event,
    Exclusion,
    PlanRecord,
    ReplicaRecord,
    StartupObservation,
)
from coral_hpc.store.access import Store
from coral_hpc.store.migrations import MIGRATIONS, SCHEMA_VERSION, migrate
from coral_hpc.store.opening import open_store

__all__ = [
    "DemandInterval", "Event", "Exclusion", "PlanRecord", "ReplicaRecord", "StartupObservation",
    "MIGRATIONS", "SCHEMA_VERSION", "Store", "migrate", "open_store",
]  # fmt: skip
