"""``coral-hpc serve``: the daemon process — wiring only.

:func:`serve` builds the collaborators (store, Slurm client, planner, gateway process, metrics
server), runs the loops of :class:`~coral_hpc.daemon.core.Daemon` until SIGTERM/SIGINT, and on
the way out stops the gateway and leaves every replica running: a restart adopts them by their
tags and resumes in seconds (``coral-hpc down`` drains and cancels them). SIGHUP reloads
``models.yaml``; an invalid file is reported and the old one kept.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError, PermanentError

log = logging.getLogger("coral_hpc.daemon")


def ensure_replica_key(path: Path) -> Path:
    """Create the key every replica requires (mode 600) when it does not exist yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path


def serve(
    config_path: str | Path,
    planner: Callable,
    *,
    gateway_listen: str | None = None,
    metrics_listen: str | None = "127.0.0.1:0",
    stop: threading.Event | None = None,
) -> None:
    """Run the daemon for ``config_path`` until ``stop`` is set or SIGTERM/SIGINT arrives.

    ``planner`` turns a :class:`~coral_hpc.plan.planner.PlanRequest` into a
    :class:`~coral_hpc.plan.planner.PlanOutcome` (:class:`coral_hpc.plan.planner.Planner`)."""
    from prometheus_client import start_http_server

    from coral_hpc.daemon.core import Daemon
    from coral_hpc.daemon.metrics import DaemonMetrics
    from coral_hpc.daemon.process import (
        DaemonLock,
        GatewayProcess,
        info_path,
        lock_path,
        write_info,
    )
    from coral_hpc.daemon.scrape import fetch_demand
    from coral_hpc.gateway.table import default_replica_key_path, default_table_path
    from coral_hpc.slurm.client import client_for_deployment
    from coral_hpc.store import open_store

    config_path = Path(config_path).resolve()
    deployment = load_deployment(config_path)
    stop = stop or threading.Event()
    lock = DaemonLock(lock_path(deployment))
    lock.acquire()
    store = gateway = metrics_server = None
    try:
        store = open_store(deployment.db_path)
        key_file = ensure_replica_key(default_replica_key_path(deployment))
        client = client_for_deployment(deployment)
        gateway = GatewayProcess(config_path, deployment, listen=gateway_listen)
        address = gateway.start()
        metrics = DaemonMetrics()
        metrics_address = None
        if metrics_listen:
            host, _, port = metrics_listen.rpartition(":")
            metrics_server, _thread = start_http_server(int(port), host or "127.0.0.1",
                                                        registry=metrics.registry)
            metrics_address = f"{host or '127.0.0.1'}:{metrics_server.server_port}"
        daemon = Daemon(
            deployment, store, client, planner,
            api_key_file=key_file, table_path=default_table_path(deployment),
            metrics=metrics, demand_source=lambda: fetch_demand(gateway.url),
        )
        daemon.resume_plan()
        info = {
            "pid": os.getpid(), "deployment": deployment.deployment,
            "config": str(config_path), "gateway": address, "metrics": metrics_address,
            "started_at": time.time(),
        }
        write_info(info_path(deployment), info)
        store.add_event(time.time(), "start", f"daemon started (pid {os.getpid()}), gateway on "
                        f"{address}, metrics on {metrics_address}")
        log.info("serving %s: gateway http://%s, metrics %s", deployment.deployment, address,
                 metrics_address)
        reload_requested = threading.Event()
        _install_signals(stop, reload_requested)
        threads = [loop.start() for loop in daemon.loops(stop)]
        retry_gateway_at = 0.0
        while not stop.wait(0.5):
            if reload_requested.is_set():
                reload_requested.clear()
                deployment = _reload(config_path, daemon, deployment, gateway)
            if not gateway.alive() and time.monotonic() >= retry_gateway_at:
                code = gateway.proc.returncode if gateway.proc is not None else None
                store.add_event(time.time(), "gateway",
                                f"gateway not running (exit code {code}); starting it")
                try:
                    gateway.start()
                except PermanentError as exc:  # e.g. its port taken meanwhile: try again soon
                    store.add_event(time.time(), "gateway", f"gateway restart failed: {exc}")
                    retry_gateway_at = time.monotonic() + 5.0
            if gateway.address != info["gateway"]:
                # a restart on port 0 (or a reload) binds a new port: clients read it here
                info["gateway"] = gateway.address
                write_info(info_path(deployment), info)
        for thread in threads:
            thread.join(timeout=30)
        store.add_event(time.time(), "stop", "daemon stopped; replicas left running")
    finally:
        if gateway is not None:
            gateway.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
        if store is not None:
            store.close()
        info_path(deployment).unlink(missing_ok=True)
        lock.release()


def _install_signals(stop: threading.Event, reload_requested: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # tests drive stop themselves
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload_requested.set())


def _reload(config_path: Path, daemon, deployment, gateway):
    """SIGHUP: validate the file; use it, or keep the old one and say why."""
    try:
        new = load_deployment(config_path)
    except ConfigError as exc:
        daemon.store.add_event(time.time(), "reload_error",
                               "models.yaml not reloaded: " + "; ".join(exc.problems))
        log.error("models.yaml not reloaded:\n%s", "\n".join(exc.problems))
        return deployment
    if new.deployment != deployment.deployment or new.db_path != deployment.db_path:
        daemon.store.add_event(time.time(), "reload_error",
                               "models.yaml not reloaded: deployment name and db_path cannot "
                               "change while serving; stop and start instead")
        return deployment
    daemon.reload(new)
    if [m.name for m in new.models] != [m.name for m in deployment.models] or (
        new.gateway != deployment.gateway
    ):
        # the gateway learns the configured models at start: stop it here and the serve loop
        # starts it again with the new file (retrying there if the start fails)
        gateway.deployment = new
        gateway.stop()
    return new
