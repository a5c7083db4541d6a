"""Write a file so that readers see the old content or the new, never half of either.

The one way coral-hpc replaces a file other processes read (routing table, endpoint files, the
replica spec, the daemon's info file, the gateway's key and ready files): a temp file in the same
folder, flushed to disk, given its final mode, then renamed over the target (``os.replace`` is
atomic within one filesystem). The temp file is created with mode 0600 (``mkstemp``), so a file
meant to be private is never readable by others, not even for a moment.

Everything coral-hpc writes is private by default (a login node is multi-user): files 0600, and
the folders :func:`private_dir` creates 0700.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: mode of every folder coral-hpc creates, and of every file it writes
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create folder ``path`` and its missing parents with mode 0700 (whatever the umask), and
    return it; folders that exist already are left as they are."""
    folder = Path(path)
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:  # made meanwhile by another process: not ours to change
            continue
        os.chmod(created, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask
    if not folder.is_dir():
        folder.mkdir()  # raises the error that says why (a file in the way)
    return folder


def write_atomic(path: str | os.PathLike[str], data: str | bytes,
                 mode: int = PRIVATE_FILE_MODE) -> None:
    """Replace ``path`` with ``data`` atomically, creating its folder (0700); ``mode`` is the
    file's permission bits (0600 unless given)."""
    target = Path(path)
    private_dir(target.parent)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def not_private_problem(path: str | os.PathLike[str], what: str = "folder") -> str | None:
    """Why others could change what ``path`` holds (it is not this user's, or group or others
    may write it), with the fix; None when it is private enough or does not exist yet."""
    target = Path(path)
    try:
        info = target.stat()
    except FileNotFoundError:
        return None
    if info.st_uid != os.getuid():
        return (f"{what} {target} is owned by uid {info.st_uid}, not by this user (uid "
                f"{os.getuid()}): others could replace what coral-hpc keeps there; use a "
                f"{what} of your own")
    if info.st_mode & 0o022:
        fix = "chmod 700" if target.is_dir() else "chmod 600"
        return (f"{what} {target} has mode {info.st_mode & 0o777:o}: group or others may write "
                f"it, so they could forge what coral-hpc reads there; run `{fix} {target}`")
    return None
