"""Removing what ended replicas left on the shared filesystem, after ``retention``'s days.

Under ``<state_dir>/<deployment>`` every replica leaves ``replicas/<id>/`` (spec, rendered
scripts), ``logs/<id>.*`` (entrypoint and engine logs), ``logs/<job>_*`` (Slurm's and submitit's
output), ``run/<job>/`` (pipeline rendezvous) and, while it serves, ``endpoints/<id>.json``;
``stage/`` holds staging jobs' scripts, logs and results. An entry is removed when nothing in it
changed for the retention period *and* it belongs to no live replica (the database's word, so a
quiet, long-running replica's logs stay). Nothing else under the state folder is touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

#: the folders under a deployment's state folder whose entries belong to replicas (or stagings)
REPLICA_FOLDERS = ("replicas", "logs", "run", "endpoints", "stage")


def _newest_mtime(path: Path) -> float:
    """The latest modification time of ``path`` or anything inside it."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for child in path.rglob("*"):
            try:
                newest = max(newest, child.lstat().st_mtime)
            except FileNotFoundError:
                continue
    return newest


def _owner(folder: str, name: str) -> str:
    """The replica id or job id an entry's name starts with (``r1a2b.123.rank0.log`` → ``r1a2b``,
    ``123_0_log.out`` → ``123``)."""
    if folder == "endpoints":
        return name.removesuffix(".json")
    if folder == "logs":
        return name.split(".", 1)[0].split("_", 1)[0]
    return name


def expired_entries(state_path: Path, live: Iterable[tuple[str, str | None]],
                    cutoff: float) -> list[Path]:
    """Entries under the replica folders last changed before ``cutoff`` (epoch seconds) that no
    live replica owns; ``live`` is (replica id, job id or None) per live replica."""
    owned: set[str] = set()
    for replica_id, job_id in live:
        owned.add(replica_id)
        if job_id:
            owned.add(job_id)
    expired = []
    for folder in REPLICA_FOLDERS:
        base = state_path / folder
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir()):
            if _owner(folder, entry.name) in owned:
                continue
            try:
                if _newest_mtime(entry) < cutoff:
                    expired.append(entry)
            except FileNotFoundError:
                continue  # removed meanwhile
    return expired


def remove_entries(paths: Iterable[Path]) -> int:
    """Delete files and folders; returns how many entries went (a vanished one counts as gone)."""
    removed = 0
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed += 1
    return removed
