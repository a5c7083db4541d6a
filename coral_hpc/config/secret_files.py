"""Probing a secret file on this host (a token, a key): it must be this user's, non-empty, and
unreadable by group and others, as ssh insists for a private key."""

from __future__ import annotations

import os
from pathlib import Path


def stat_private_file(file: Path, what: str) -> os.stat_result:
    """The ``stat`` of secret file ``file`` once it may hold a secret: it exists, is this user's,
    and neither group nor others may read it (as ssh refuses a loose private key). ValueError
    says how to fix it; ``what`` names the file."""
    import stat

    try:
        info = file.stat()
    except OSError as exc:
        raise ValueError(f"{what} file {file}: cannot read: {exc.strerror}") from None
    if info.st_uid != os.getuid():
        raise ValueError(f"{what} file {file} is owned by uid {info.st_uid}, not by this user")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"{what} file {file} has mode {stat.S_IMODE(info.st_mode):o}: group or others may "
            f"read it; run `chmod 600 {file}`"
        )
    return info


def check_private_file(path: str, what: str) -> None:
    """Refuse a secret file that is missing, empty, not this user's, or that group or others
    could read (:func:`stat_private_file`). ValueError says how to fix it."""
    file = Path(path).expanduser()
    if stat_private_file(file, what).st_size == 0:
        raise ValueError(f"{what} file {file} is empty")
