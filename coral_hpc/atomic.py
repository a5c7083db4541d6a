"""Write a file so that readers see the old content or the new, never half of either.

The one way coral-hpc replaces a file other processes read (routing table, endpoint files, the
replica spec, the daemon's info file, the gateway's key and ready files): a temp file in the same
folder, flushed to disk, given its final mode, then renamed over the target (``os.replace`` is
atomic within one filesystem). The temp file is created with mode 0600 (``mkstemp``), so a file
meant to be private is never readable by others, not even for a moment.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically, creating its folder; ``mode`` is the file's
    permission bits (0600 for anything private)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
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
