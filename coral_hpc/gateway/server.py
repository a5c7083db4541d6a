"""Running the gateway as a process: safety checks, the event loop, signals, the ready file."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import ssl
from pathlib import Path

from coral_hpc.atomic import write_atomic
from coral_hpc.config.gateway import NO_KEYS_MESSAGE, OPEN_WARNING
from coral_hpc.errors import PermanentError
from coral_hpc.gateway.auth import KeyChecker, is_loopback, read_keys_file
from coral_hpc.gateway.http_server import HttpServer
from coral_hpc.gateway.proxy import Gateway, GatewaySettings
from coral_hpc.gateway.tls import check_private_file, server_context

log = logging.getLogger("coral_hpc.gateway")


class GatewayStartError(PermanentError):
    """The gateway refuses to start as configured; the message says what to change."""


def check_exposure(host: str, api_keys_file: Path | None, tls: bool = False,
                   behind_tls_proxy: bool = False, open_on_loopback: bool = False) -> None:
    """Refuse to start a gateway anyone may use without a key: no keys file unless
    ``gateway.open_on_loopback`` opts out on a loopback address, and beyond loopback keys but
    neither TLS nor a TLS-terminating proxy in front (the keys would cross the network in clear).
    A login node's loopback is shared by everyone logged in, so ``127.0.0.1`` alone is no
    protection."""
    if api_keys_file is None:
        if not is_loopback(host):
            if open_on_loopback:
                raise GatewayStartError(
                    f"gateway.open_on_loopback only opens a loopback address, but the gateway "
                    f"would listen on {host!r}, reachable from other machines: create keys with "
                    "`coral-hpc keys add FILE NAME` and set gateway.api_keys_file"
                )
            raise GatewayStartError(
                f"gateway.listen host {host!r} is reachable from other machines but "
                "gateway.api_keys_file is not set: create keys with `coral-hpc keys add FILE "
                "NAME` and set gateway.api_keys_file, or listen on 127.0.0.1"
            )
        if not open_on_loopback:
            raise GatewayStartError(NO_KEYS_MESSAGE)
        return
    if is_loopback(host):
        return
    if not tls and not behind_tls_proxy:
        raise GatewayStartError(
            f"gateway.listen host {host!r} is reachable from other machines and API keys would "
            "cross the network in clear: set gateway.tls_cert and gateway.tls_key, or "
            "gateway.behind_tls_proxy: true when the site's TLS-terminating proxy is in front"
        )


def _write_ready_file(path: Path, address: str) -> None:
    write_atomic(path, address + "\n", mode=0o600)


async def serve_gateway(settings: GatewaySettings, host: str, port: int,
                        ready_file: Path | None = None) -> None:
    """Serve until SIGTERM or SIGINT. Writes ``host:port`` (the bound port, useful with port 0)
    to ``ready_file`` once listening."""
    check_exposure(host, settings.api_keys_file, tls=settings.tls_cert is not None,
                   behind_tls_proxy=settings.behind_tls_proxy,
                   open_on_loopback=settings.open_on_loopback)
    tls = _tls_context(settings)
    keys = None
    if settings.api_keys_file is None:
        log.warning(OPEN_WARNING)
    if settings.api_keys_file is not None:
        # read now so a bad keys file stops the start with its file and line
        keys = KeyChecker(read_keys_file(settings.api_keys_file))
        # hashes of random keys are no secret, but whoever may write the file may add a key
        check_private_file(settings.api_keys_file, "gateway.api_keys_file", forbidden=0o022)
    gateway = Gateway(settings, keys=keys)
    await gateway.start()
    server = HttpServer(gateway.server_settings())
    _tune_gc()
    try:
        bound = await server.start(host, port, ssl_context=tls, backlog=2048)
    except BaseException:
        await gateway.stop()
        raise
    address = f"{host}:{bound}"
    log.info("gateway listening on %s://%s (models: %s)", "https" if tls else "http", address,
             ", ".join(settings.models))
    if ready_file is not None:
        _write_ready_file(ready_file, address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("gateway stopping")
        await server.close()
        await gateway.stop()


#: Young-generation size of the cyclic garbage collector. The default (700 allocations) makes
#: a collection every few requests and a full one every 70,000 allocations; with 1,000 open
#: streams a full collection walks every live object and stalls every stream for tens of ms
#: (bench/results/gateway_stream.md). Almost everything the gateway allocates is freed by
#: reference counting; cycles still go, in collections 14x rarer.
GC_THRESHOLDS = (10_000, 10, 10)


def _tune_gc() -> None:
    """Move what start-up allocated (modules, the app) out of the collector's sight and make
    collections rarer; see :data:`GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _tls_context(settings: GatewaySettings) -> ssl.SSLContext | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return server_context(settings.tls_cert, settings.tls_key)


def run_gateway(settings: GatewaySettings, host: str, port: int,
                ready_file: Path | None = None) -> None:
    """Blocking entry point: uvloop when available, then :func:`serve_gateway`."""
    check_exposure(host, settings.api_keys_file, tls=settings.tls_cert is not None,
                   behind_tls_proxy=settings.behind_tls_proxy,
                   open_on_loopback=settings.open_on_loopback)
    _tls_context(settings)   # a bad certificate or key stops the start before the event loop
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not a hard one
        asyncio.run(serve_gateway(settings, host, port, ready_file))
    else:
        uvloop.run(serve_gateway(settings, host, port, ready_file))
