"""Logging for the long-running commands (``serve``, ``gateway``): to stderr (systemd's journal
rotates it), or to a file rotated by size (``retention.log_max_mb`` × ``log_backups``)."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

from coral_hpc.config import RetentionConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, log_file: str | Path | None,
                      retention: RetentionConfig | None = None) -> logging.Handler:
    """Send every log record at ``level`` or above to ``log_file`` (rotated) or to stderr;
    returns the handler."""
    retention = retention or RetentionConfig()
    if log_file is not None:
        path = Path(log_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=int(retention.log_max_mb * 1024 * 1024),
            backupCount=retention.log_backups, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    return handler
