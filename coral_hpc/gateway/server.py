"""Running the gateway as a process: safety checks, the event loop, signals, the ready file."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from coral_hpc.atomic import write_atomic
from coral_hpc.errors import PermanentError
from coral_hpc.gateway.auth import KeyChecker, is_loopback, read_keys_file
from coral_hpc.gateway.proxy import Gateway, GatewaySettings

log = logging.getLogger("coral_hpc.gateway")


class GatewayStartError(PermanentError):
    """The gateway refuses to start as configured; the message says what to change."""


def check_exposure(host: str, api_keys_file: Path | None) -> None:
    """Refuse to listen beyond loopback without client API keys."""
    if not is_loopback(host) and api_keys_file is None:
        raise GatewayStartError(
            f"gateway.listen host {host!r} is reachable from other machines but "
            "gateway.api_keys_file is not set: create keys with `coral-hpc keys add FILE NAME` and "
            "set gateway.api_keys_file, or listen on 127.0.0.1"
        )


def _write_ready_file(path: Path, address: str) -> None:
    write_atomic(path, address + "\n", mode=0o600)


async def serve_gateway(settings: GatewaySettings, host: str, port: int,
                        ready_file: Path | None = None) -> None:
    """Serve until SIGTERM or SIGINT. Writes ``host:port`` (the bound port, useful with port 0)
    to ``ready_file`` once listening."""
    check_exposure(host, settings.api_keys_file)
    keys = None
    if settings.api_keys_file is not None:
        # read now so a bad keys file stops the start with its file and line
        keys = KeyChecker(read_keys_file(settings.api_keys_file))
    gateway = Gateway(settings, keys=keys)
    # handler_cancellation: a client that disconnects cancels its handler, which closes the
    # upstream request, so a replica does not keep generating for nobody.
    runner = web.AppRunner(gateway.build_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    address = f"{host}:{bound}"
    log.info("gateway listening on http://%s (models: %s)", address, ", ".join(settings.models))
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
        await runner.cleanup()


def run_gateway(settings: GatewaySettings, host: str, port: int,
                ready_file: Path | None = None) -> None:
    """Blocking entry point: uvloop when available, then :func:`serve_gateway`."""
    check_exposure(host, settings.api_keys_file)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not a hard one
        asyncio.run(serve_gateway(settings, host, port, ready_file))
    else:
        uvloop.run(serve_gateway(settings, host, port, ready_file))
