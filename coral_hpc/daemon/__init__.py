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

from coral_hpc.atomic import private_dir
from coral_hpc.config import load_deployment
from coral_hpc.daemon.lease import read_lease
from coral_hpc.errors import ConfigError, PermanentError

log = logging.getLogger("coral_hpc.daemon")


def ensure_replica_key(path: Path) -> Path:
    """Create the key every replica requires (mode 600) when it does not exist yet."""
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
    from coral_hpc.daemon.lease import Lease
    from coral_hpc.daemon.metrics import DaemonMetrics
    from coral_hpc.daemon.process import (
        DaemonLock,
        GatewayProcess,
        info_path,
        lock_path,
        write_info,
    )
    from coral_hpc.daemon.scrape import fetch_demand
    from coral_hpc.daemon.status_file import status_data, status_file, write_status
    from coral_hpc.daemon.stop_request import StopRequests
    from coral_hpc.gateway.table import default_replica_key_path, default_table_path
    from coral_hpc.instance import ensure_instance
    from coral_hpc.slurm.client import call_budget, client_for_deployment
    from coral_hpc.store import open_store

    config_path = Path(config_path).resolve()
    deployment = load_deployment(config_path)
    stop = stop or threading.Event()
    # the lease on the shared state folder first: a daemon on any host names itself there
    lease = Lease(deployment.state_path, deployment.deployment)
    taken = lease.acquire()
    lock = DaemonLock(lock_path(deployment))
    try:
        lock.acquire()
    except BaseException:
        lease.release()
        raise
    store = gateway = metrics_server = None
    try:
        instance = ensure_instance(deployment.state_path, deployment.deployment)
        stop_requests = StopRequests(deployment.state_path, since=time.time())
        store = open_store(deployment.db_path)
        if taken:
            store.add_event(time.time(), "lease", "took over the stale lease of the daemon on "
                            f"{taken.get('host')} (pid {taken.get('pid')})")
        key_file = ensure_replica_key(default_replica_key_path(deployment))
        # every Slurm call of this daemon is charged to one budget (cluster.slurm.calls_per_min)
        client = client_for_deployment(deployment, budgeted=True)
        if hasattr(planner, "use_client"):  # its start-estimate probes: the same budget
            planner.use_client(client)
        gateway = GatewayProcess(config_path, deployment, listen=gateway_listen)
        # a gateway left by a daemon killed with -9 is still routing: keep it (no gap, no leak)
        address = gateway.adopt()
        if address is not None:
            store.add_event(time.time(), "gateway", f"adopted the running gateway (pid "
                            f"{gateway.pid}) on {address}")
        else:
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
            metrics=metrics, demand_source=lambda: fetch_demand(gateway.url,
                                                     tls_cert=gateway.deployment.gateway.tls_cert),
            instance=instance, may_act=lease.ours, budget=call_budget(client),
            on_cycle=lambda now: write_status(status_file(deployment.state_path),
                                              status_data(deployment, store, now)),
            config_path=config_path,
        )
        daemon.resume_plan()
        info = {
            "pid": os.getpid(), "deployment": deployment.deployment,
            "config": str(config_path), "gateway": address, "metrics": metrics_address,
            "started_at": time.time(),
        }
        write_info(info_path(deployment), info)
        lease.publish(config=str(config_path), instance=instance, gateway=address,
                      metrics=metrics_address, started_at=info["started_at"])
        store.add_event(time.time(), "start", f"daemon started (pid {os.getpid()}), gateway on "
                        f"{address}, metrics on {metrics_address}")
        log.info("serving %s: gateway %s, metrics %s", deployment.deployment, gateway.url,
                 metrics_address)
        reload_requested = threading.Event()
        _install_signals(stop, reload_requested)
        threads = [loop.start() for loop in daemon.loops(stop) + [_retention_loop(daemon, stop)]]
        retry_gateway_at = 0.0
        while not stop.wait(0.5):
            if not lease.renew():
                holder = read_lease(lease.path) or {}
                store.add_event(time.time(), "lease_lost", "the lease was taken over by the "
                                f"daemon on {holder.get('host')} (pid {holder.get('pid')}); "
                                "stopping without touching its replicas")
                log.error("lease lost to %s pid %s; stopping", holder.get("host"),
                          holder.get("pid"))
                stop.set()
                break
            request = stop_requests.pending()
            if request is not None:
                store.add_event(time.time(), "stop", f"stop requested by {request}")
                stop.set()
                break
            if reload_requested.is_set():
                reload_requested.clear()
                deployment = _reload(config_path, daemon, deployment, gateway)
            if not gateway.alive() and time.monotonic() >= retry_gateway_at:
                code = gateway.exit_code
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
                lease.publish(gateway=gateway.address)
        for thread in threads:
            thread.join(timeout=30)
        if daemon.fatal is not None:
            raise daemon.fatal  # the CLI exits 2 with its lines; the finally cleans up
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
        lease.release()


def _retention_loop(daemon, stop: threading.Event):
    """Prune the database and old replica files every ``retention.prune_interval_s``."""
    from coral_hpc.daemon.core import Loop
    from coral_hpc.daemon.retention import RetentionStep

    step = RetentionStep(lambda: daemon.deployment, daemon.store, daemon.clock)
    # the step returns a summary: a Loop step returning something true would run again at once
    return Loop("retention", daemon.deployment.retention.prune_interval_s,
                lambda: step() and None, stop)


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
