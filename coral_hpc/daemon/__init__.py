"""``coral-hpc serve``: the daemon process and what it publishes (routing table, status, metrics);
this module is wiring only.

:func:`serve` builds the collaborators (store, Slurm client, planner, gateway process, metrics
server), runs the loops of :class:`~coral_hpc.daemon.core.Daemon` until SIGTERM/SIGINT, and on
the way out stops the gateway and leaves every replica running: a restart adopts them by their
tags and resumes in seconds (``coral-hpc down`` drains and cancels them). SIGHUP reloads
``models.yaml``; an invalid file is reported and the old one kept. How it does so lives in
:mod:`coral_hpc.daemon.service`.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coral_hpc.atomic import private_dir


def ensure_replica_key(path: Path) -> Path:
    """Create the key every replica requires (mode 600) when it does not exist yet."""
    return ensure_key_file(path)


def ensure_key_file(path: Path) -> Path:
    """Create a file holding a new random key (256 bits, mode 600, in a 0700 folder) when
    it does not exist yet; an existing one is kept, so a restart changes no key."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path


def serve(
    config_path: str | Path,
    planner: Callable[..., Any],
    *,
    gateway_listen: str | None = None,
    metrics_listen: str | None = "127.0.0.1:0",
    stop: threading.Event | None = None,
) -> None:
    """Run the daemon for ``config_path`` until ``stop`` is set or SIGTERM/SIGINT arrives.

    ``planner`` turns a :class:`~coral_hpc.plan.planner.PlanRequest` into a
    :class:`~coral_hpc.plan.planner.PlanOutcome` (:class:`coral_hpc.plan.planner.Planner`)."""
    # imported here: the daemon's collaborators (prometheus, the planner's solver) are heavy,
    # and the CLI imports this package's light modules (lease, process) on every command
    from coral_hpc.daemon.service import serve as run

    run(config_path, planner, gateway_listen=gateway_listen, metrics_listen=metrics_listen,
        stop=stop)
