"""The serving daemon's lifetime, behind :func:`coral_hpc.daemon.serve`: claim the deployment
(lease, then lock), start the collaborators (store, Slurm client, gateway process, metrics
server, :class:`~coral_hpc.daemon.core.Daemon`), supervise them while the loops run (lease,
stop requests, SIGHUP reloads, gateway restarts) and clean up on the way out, leaving every
replica running."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coral_hpc.config import Deployment, load_deployment
from coral_hpc.daemon import ensure_key_file, ensure_replica_key
from coral_hpc.daemon.core import Daemon
from coral_hpc.daemon.lease import Lease, read_lease
from coral_hpc.daemon.loop import Loop
from coral_hpc.daemon.metrics import DaemonMetrics
from coral_hpc.daemon.metrics_server import start_metrics_server
from coral_hpc.daemon.process import DaemonLock, GatewayProcess, info_path, lock_path, write_info
from coral_hpc.daemon.retention import RetentionStep
from coral_hpc.daemon.scrape import fetch_demand, read_internal_key
from coral_hpc.daemon.status_file import status_data, status_file, write_status
from coral_hpc.daemon.stop_request import StopRequests
from coral_hpc.errors import ConfigError, PermanentError
from coral_hpc.gateway.server import check_exposure
from coral_hpc.gateway.table import (
    default_internal_key_path,
    default_replica_key_path,
    default_table_path,
)
from coral_hpc.gateway.wake import wake_dir
from coral_hpc.instance import ensure_instance
from coral_hpc.model_archs import derived_deployment
from coral_hpc.slurm.client import call_budget, client_for_deployment
from coral_hpc.store import Store, open_store

log = logging.getLogger("coral_hpc.daemon")


@dataclass
class Serving:
    """What serve has started so far: what the supervisor watches and the way out stops."""

    config_path: Path
    deployment: Deployment
    lease: Lease
    #: made before anything slow starts, so a stop asked for during start-up is not missed
    stop_requests: StopRequests | None = None
    store: Store | None = None
    gateway: GatewayProcess | None = None
    metrics_server: Any = None
    #: the daemon file's fields (pid, gateway and metrics addresses), rewritten as they change
    info: dict[str, Any] = field(default_factory=dict)


def serve(
    config_path: str | Path,
    planner: Callable[..., Any],
    *,
    gateway_listen: str | None = None,
    metrics_listen: str | None = "127.0.0.1:0",
    stop: threading.Event | None = None,
) -> None:
    """Run the daemon for ``config_path`` until ``stop`` is set or SIGTERM/SIGINT arrives (see
    :func:`coral_hpc.daemon.serve`)."""
    config_path = Path(config_path).resolve()
    deployment = derived_deployment(load_deployment(config_path))
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
    serving = Serving(config_path, deployment, lease)
    try:
        daemon = start(serving, planner, taken, gateway_listen, metrics_listen)
        reload_requested = threading.Event()
        _install_signals(stop, reload_requested)
        threads = [loop.start() for loop in daemon.loops(stop) + [retention_loop(daemon, stop)]]
        supervise(serving, daemon, stop, reload_requested)
        for thread in threads:
            thread.join(timeout=30)
        if daemon.fatal is not None:
            raise daemon.fatal  # the CLI exits 2 with its lines; the finally cleans up
        store = serving.store
        assert store is not None  # start opened it
        store.add_event(time.time(), "stop", "daemon stopped; replicas left running")
    finally:
        clean_up(serving, lock)



def gateway_demand(gateway: GatewayProcess) -> dict[str, Any]:
    """The gateway's demand counters. While the gateway restarts it has no address: the scrape
    loop's error handler logs this one line and the next poll reads the counters again."""
    url = gateway.url
    if url is None:
        raise ConnectionError("the gateway is not listening (it is being restarted)")
    # read per scrape (a few bytes each poll): a key file restored or replaced is used at once
    key = read_internal_key(default_internal_key_path(gateway.deployment))
    return fetch_demand(url, tls_cert=gateway.deployment.gateway.tls_cert, key=key)


def start(
    serving: Serving,
    planner: Callable[..., Any],
    taken: dict[str, Any] | None,
    gateway_listen: str | None,
    metrics_listen: str | None,
) -> Daemon:
    """Open the store, start (or adopt) the gateway and the metrics server, build the daemon
    with its last plan, and announce it: daemon file, lease record, start event."""
    deployment = serving.deployment
    instance = ensure_instance(deployment.state_path, deployment.deployment)
    serving.stop_requests = StopRequests(deployment.state_path, since=time.time())
    store = serving.store = open_store(deployment.db_path)
    if taken:
        store.add_event(time.time(), "lease", "took over the stale lease of the daemon on "
                        f"{taken.get('host')} (pid {taken.get('pid')})")
    key_file = ensure_replica_key(default_replica_key_path(deployment))
    # the daemon's own key for its gateway's /internal/* and /metrics (and its own metrics):
    # made before the gateway starts, which reads it (gateway.table.default_internal_key_path)
    internal_key = ensure_key_file(default_internal_key_path(deployment))
    # every Slurm call of this daemon is charged to one budget (cluster.slurm.calls_per_min)
    client = client_for_deployment(deployment, budgeted=True)
    if hasattr(planner, "use_client"):  # its start-estimate probes: the same budget
        planner.use_client(client)
    gateway = serving.gateway = GatewayProcess(serving.config_path, deployment,
                                               listen=gateway_listen)
    address = start_gateway(gateway, store)
    metrics = DaemonMetrics()
    serving.metrics_server, metrics_address = start_metrics(metrics_listen, metrics, deployment,
                                                            internal_key)
    daemon = Daemon(
        deployment, store, client, planner,
        api_key_file=key_file, table_path=default_table_path(deployment),
        metrics=metrics, demand_source=lambda: gateway_demand(gateway),
        instance=instance, may_act=serving.lease.ours, budget=call_budget(client),
        on_cycle=lambda now: write_status(status_file(deployment.state_path),
                                          status_data(deployment, store, now)),
        config_path=serving.config_path,
        wake_folder=wake_dir(deployment.state_path),
    )
    daemon.resume_plan()
    serving.info = {
        "pid": os.getpid(), "deployment": deployment.deployment,
        "config": str(serving.config_path), "gateway": address, "metrics": metrics_address,
        "started_at": time.time(),
    }
    write_info(info_path(deployment), serving.info)
    serving.lease.publish(config=str(serving.config_path), instance=instance, gateway=address,
                          metrics=metrics_address, started_at=serving.info["started_at"])
    store.add_event(time.time(), "start", f"daemon started (pid {os.getpid()}), gateway on "
                    f"{address}, metrics on {metrics_address}")
    log.info("serving %s: gateway %s, metrics %s", deployment.deployment, gateway.url,
             metrics_address)
    return daemon


def start_gateway(gateway: GatewayProcess, store: Store) -> str:
    """Adopt the gateway a daemon killed with -9 left routing (no gap, no leak), else start one;
    its address."""
    address = gateway.adopt()
    if address is None:
        return gateway.start()
    store.add_event(time.time(), "gateway", f"adopted the running gateway (pid "
                    f"{gateway.pid}) on {address}")
    return address


def start_metrics(listen: str | None, metrics: DaemonMetrics, deployment: Deployment,
                  internal_key_file: Path | None = None) -> tuple[Any, str | None]:
    """The Prometheus server on ``listen`` (host:port; port 0 picks one), asking for one of the
    deployment's client keys or the internal key (:mod:`coral_hpc.daemon.metrics_server`), and
    the address it bound; (None, None) when ``listen`` is empty: no metrics server."""
    if not listen:
        return None, None
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    server, _thread = start_metrics_server(host, int(port), metrics.registry, deployment,
                                           internal_key_file)
    shown = f"[{host}]" if ":" in host else host   # host:port, IPv6 in brackets
    return server, f"{shown}:{server.server_port}"


def supervise(
    serving: Serving, daemon: Daemon, stop: threading.Event, reload_requested: threading.Event
) -> None:
    """Until ``stop``: renew the lease (stop when lost), honour stop requests and SIGHUP
    reloads, restart a gateway that died, and publish its address when it changes."""
    store, gateway, stop_requests = serving.store, serving.gateway, serving.stop_requests
    assert store is not None and gateway is not None and stop_requests is not None  # start's
    retry_gateway_at = 0.0
    while not stop.wait(0.5):
        if not serving.lease.renew():
            _lease_lost(serving.lease, store)
            stop.set()
            break
        request = stop_requests.pending()
        if request is not None:
            store.add_event(time.time(), "stop", f"stop requested by {request}")
            stop.set()
            break
        if reload_requested.is_set():
            reload_requested.clear()
            serving.deployment = reload(serving.config_path, daemon, serving.deployment, gateway)
        if not gateway.alive() and time.monotonic() >= retry_gateway_at:
            retry_gateway_at = restart_gateway(gateway, store)
        if gateway.address != serving.info["gateway"]:
            # a restart on port 0 (or a reload) binds a new port: clients read it here
            serving.info["gateway"] = gateway.address
            write_info(info_path(serving.deployment), serving.info)
            serving.lease.publish(gateway=gateway.address)


def _lease_lost(lease: Lease, store: Store) -> None:
    holder = read_lease(lease.path) or {}
    store.add_event(time.time(), "lease_lost", "the lease was taken over by the "
                    f"daemon on {holder.get('host')} (pid {holder.get('pid')}); "
                    "stopping without touching its replicas")
    log.error("lease lost to %s pid %s; stopping", holder.get("host"), holder.get("pid"))


def restart_gateway(gateway: GatewayProcess, store: Store) -> float:
    """Start a gateway that is not running; the monotonic time before which not to try again
    (0: try whenever it is down again)."""
    store.add_event(time.time(), "gateway",
                    f"gateway not running (exit code {gateway.exit_code}); starting it")
    try:
        gateway.start()
    except PermanentError as exc:  # e.g. its port taken meanwhile: try again soon
        store.add_event(time.time(), "gateway", f"gateway restart failed: {exc}")
        return time.monotonic() + 5.0
    return 0.0


def clean_up(serving: Serving, lock: DaemonLock) -> None:
    """Stop what serve started — never the replicas — and give up the lock and the lease."""
    if serving.gateway is not None:
        serving.gateway.stop()
    if serving.metrics_server is not None:
        serving.metrics_server.shutdown()
    if serving.store is not None:
        serving.store.close()
    info_path(serving.deployment).unlink(missing_ok=True)
    lock.release()
    serving.lease.release()


def gateway_access_problem(deployment: Deployment, listen: str | None) -> str | None:
    """Why the gateway of ``deployment`` (on ``listen`` when given, else ``gateway.listen``)
    would refuse to start as to who may reach it, or None (:func:`check_exposure`)."""
    config = deployment.gateway
    host = listen.rpartition(":")[0].strip("[]") if listen else config.host
    try:
        check_exposure(host, Path(config.api_keys_file) if config.api_keys_file else None,
                       tls=config.tls_cert is not None, behind_tls_proxy=config.behind_tls_proxy,
                       open_on_loopback=config.open_on_loopback)
    except PermanentError as exc:
        return str(exc)
    return None


def retention_loop(daemon: Daemon, stop: threading.Event) -> Loop:
    """Prune the database and old replica files every ``retention.prune_interval_s``."""
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


def reload(
    config_path: Path, daemon: Daemon, deployment: Deployment, gateway: GatewayProcess
) -> Deployment:
    """SIGHUP: validate the file; use it, or keep the old one and say why."""
    try:
        new = derived_deployment(load_deployment(config_path))
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
    refused = gateway_access_problem(new, gateway.listen)
    if refused is not None:
        # the gateway would not start with it: keep serving with the file we have
        daemon.store.add_event(time.time(), "reload_error", f"models.yaml not reloaded: {refused}")
        log.error("models.yaml not reloaded: %s", refused)
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
