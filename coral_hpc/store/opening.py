"""Opening the database file: created private and migrated, in WAL mode, or read-only.

One file on the daemon host's local disk, never on a network filesystem (SQLite's locking is
not safe there). WAL mode, so ``coral-hpc status`` can read while the daemon writes.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from coral_hpc.atomic import PRIVATE_FILE_MODE, private_dir
from coral_hpc.errors import PermanentError
from coral_hpc.store.access import Store
from coral_hpc.store.migrations import migrate, refuse_newer


def open_store(path: str | Path, readonly: bool = False) -> Store:
    """Open (creating when absent) the database at ``path``, migrate it, and return a Store.

    ``readonly`` opens an existing database without migrating or writing (``coral-hpc status``
    must not change a database a running daemon owns). Raises :class:`PermanentError` when the
    database was written by a newer coral-hpc or is not a coral-hpc database.
    """
    file = Path(path).expanduser()
    if readonly:
        if not file.exists():
            raise PermanentError(f"{file}: no coral-hpc database here (has `coral-hpc serve` run?)")
        connection = sqlite3.connect(
            f"file:{file}?mode=ro", uri=True, check_same_thread=False, timeout=10
        )
    else:
        private_dir(file.parent)
        if not file.exists():
            _create(file)
        # the WAL and shared-memory files SQLite makes take the database's mode
        os.chmod(file, PRIVATE_FILE_MODE)
        connection = sqlite3.connect(str(file), check_same_thread=False, timeout=10)
    connection.row_factory = sqlite3.Row
    try:
        connection.execute("PRAGMA foreign_keys = ON")
        if not readonly:
            # WAL: readers (status) never block the writer (daemon); NORMAL sync is durable
            # across application crashes, which is what a kill -9 of the daemon is.
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise PermanentError(f"{file}: SQLite refused WAL mode (got {mode!r})")
            connection.execute("PRAGMA synchronous = NORMAL")
            migrate(connection, str(file))
        else:
            refuse_newer(connection, str(file))
    except Exception:
        connection.close()
        raise
    return Store(connection, str(file))


def _create(file: Path) -> None:
    """Make a new database beside ``file`` and move it into place once migrated, so a reader
    (``coral-hpc status`` while the daemon starts) never opens one without its tables."""
    tmp = file.with_name(f".{file.name}.{os.getpid()}.new")
    connection = sqlite3.connect(str(tmp))
    try:
        migrate(connection, str(file))
    finally:
        connection.close()
    os.replace(tmp, file)
