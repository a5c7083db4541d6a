"""``coral-hpc gateway models.yaml`` (run the gateway alone) and ``coral-hpc keys`` (API keys)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from coral_hpc.cli._logging import configure_logging
from coral_hpc.cli._output import fail, print_json
from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError, PermanentError


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--table", "table", type=click.Path(dir_okay=False),
              help="Routing table to follow [default: <state_dir>/<deployment>/routing-table.json].")
@click.option("--replica-key-file", type=click.Path(dir_okay=False),
              help="File holding the key replicas require [default: "
                   "<state_dir>/<deployment>/replica.key, when it exists].")
@click.option("--internal-key-file", type=click.Path(dir_okay=False),
              help="File holding the key that opens /metrics and /internal/* besides the client "
                   "keys (the daemon's) [default: <state_dir>/<deployment>/internal.key, when it "
                   "exists].")
@click.option("--listen", help="host:port, overriding gateway.listen (port 0 = any free port).")
@click.option("--ready-file", type=click.Path(dir_okay=False),
              help="Write the bound host:port here once listening.")
@click.option("--read-timeout", type=float, default=600.0, show_default=True,
              help="Seconds of silence from a replica before it counts as stalled.")
@click.option("--probe-interval", type=float, default=1.0, show_default=True,
              help="Seconds between /health probes of each replica.")
@click.option("--poll-interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
              help="Seconds between checks of the routing table and keys files for changes.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=15.0, show_default=True,
              help="Close a client connection that sends no complete request head for this long "
                   "(idle keep-alive, or headers trickled in: slowloris).")
@click.option("--body-timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Answer 408 when a request body is not complete this long after its head.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-file", type=click.Path(dir_okay=False),
              help="Log here, rotated at retention.log_max_mb [default: stderr].")
def gateway(file: str, table: str | None, replica_key_file: str | None,
            internal_key_file: str | None, listen: str | None,
            ready_file: str | None, read_timeout: float, probe_interval: float,
            poll_interval: float, idle_timeout: float, body_timeout: float, log_level: str,
            log_file: str | None = None) -> None:
    """Serve every model of FILE behind one OpenAI-compatible endpoint."""
    from coral_hpc.gateway.accesslog import ACCESS_DIR_NAME
    from coral_hpc.gateway.proxy import GatewaySettings
    from coral_hpc.gateway.server import run_gateway
    from coral_hpc.gateway.table import default_table_path
    from coral_hpc.gateway.wake import wake_dir, wake_policies

    try:
        deployment = load_deployment(file)
    except ConfigError as exc:
        fail(exc.problems + [f"{file}: {len(exc.problems)} problem(s); gateway not started"])
    config = deployment.gateway
    host, port = _listen_address(listen, config.host, config.port)
    key_path, internal_key = _key_files(deployment, replica_key_file, internal_key_file)
    settings = GatewaySettings(
        models=tuple(m.name for m in deployment.models),
        table_path=Path(table) if table else default_table_path(deployment),
        api_keys_file=Path(config.api_keys_file).expanduser() if config.api_keys_file else None,
        replica_key_file=key_path,
        open_on_loopback=config.open_on_loopback,
        internal_key_file=internal_key,
        max_body_bytes=config.max_body_bytes,
        read_timeout_s=read_timeout,
        probe_interval_s=probe_interval,
        poll_interval_s=poll_interval,
        client_idle_timeout_s=idle_timeout,
        body_timeout_s=body_timeout,
        tls_cert=Path(config.tls_cert).expanduser() if config.tls_cert else None,
        tls_key=Path(config.tls_key).expanduser() if config.tls_key else None,
        behind_tls_proxy=config.behind_tls_proxy,
        access_log_dir=deployment.state_path / ACCESS_DIR_NAME,
        access_log_days=deployment.retention.access_log_days,
        demand_window_s=deployment.policy.demand_window_s,
        demand_windows=deployment.policy.demand_windows,
        wake=wake_policies(deployment),
        wake_dir=wake_dir(deployment.state_path),
    )
    os.umask(0o077)  # its ready file and logs are the service account's alone
    configure_logging(log_level, log_file, deployment.retention)
    try:
        run_gateway(settings, host, port, Path(ready_file) if ready_file else None)
    except PermanentError as exc:
        fail(f"{file}: {exc}")
    except OSError as exc:
        fail(f"gateway cannot listen on {host}:{port}: {exc.strerror or exc}", status=3)


def _listen_address(listen: str | None, host: str, port: int) -> tuple[str, int]:
    """``--listen host:port`` when given, else gateway.listen's; exit 2 on a malformed one."""
    if listen is not None:
        # port 0 (any free port, reported in --ready-file) is fine here, unlike in models.yaml
        host, _, port_text = listen.rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit() or int(port_text) > 65535:
            fail(f"--listen {listen!r}: expected host:port such as 127.0.0.1:8000")
        port = int(port_text)
    return host, port


def _key_files(deployment: Any, replica_key_file: str | None,
               internal_key_file: str | None) -> tuple[Path | None, Path]:
    """(the replica key file, None when there is none; the internal key file): the options'
    files, which must exist, or the state folder's."""
    from coral_hpc.gateway.table import default_internal_key_path, default_replica_key_path

    if replica_key_file is None:
        default_key = default_replica_key_path(deployment)
        key_path = default_key if default_key.exists() else None
    else:
        key_path = Path(replica_key_file)
        if not key_path.exists():
            fail(f"--replica-key-file {replica_key_file}: no such file")
    if internal_key_file is None:
        # read when it appears too: the daemon creates it before it starts this gateway
        internal_key = default_internal_key_path(deployment)
    else:
        internal_key = Path(internal_key_file)
        if not internal_key.exists():
            fail(f"--internal-key-file {internal_key_file}: no such file")
    return key_path, internal_key


@click.group()
def keys() -> None:
    """Manage the gateway's API-keys file (hashes only; a key is shown once)."""


@keys.command("add")
@click.argument("keys_file", type=click.Path(dir_okay=False))
@click.argument("name")
@click.option("--lab", help="The group this key's use is booked to (named in the access log).")
@click.option("--models", "models", help="Comma-separated models the key may use "
                                         "[default: every model].")
@click.option("--rpm", type=click.IntRange(min=1), help="Requests per minute at most.")
@click.option("--tpm", type=click.IntRange(min=1),
              help="Tokens (prompt and output) per minute at most.")
@click.option("--expires", help="When the key stops working: an ISO date or time, UTC unless "
                                "it names its zone (e.g. 2027-01-31).")
def keys_add(keys_file: str, name: str, lab: str | None = None, models: str | None = None,
             rpm: int | None = None, tpm: int | None = None,
             expires: str | None = None) -> None:
    """Create key NAME in KEYS_FILE and print it (the only time it is shown)."""
    from coral_hpc.gateway.auth import KeysFileError, add_key

    scope = tuple(m.strip() for m in (models or "").split(",") if m.strip())
    try:
        key = add_key(keys_file, name, lab, models=scope, rpm=rpm, tpm=tpm,
                      expires=expires or "")
    except KeysFileError as exc:
        fail(str(exc))
    click.echo(key)
    click.echo(f"key {name!r} added to {keys_file}; store it now, it is not kept", err=True)


@keys.command("list")
@click.argument("keys_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def keys_list(keys_file: str, as_json: bool) -> None:
    """List the key names in KEYS_FILE."""
    from coral_hpc.gateway.auth import KeysFileError, read_keys_file

    try:
        entries = read_keys_file(keys_file)
    except KeysFileError as exc:
        fail(str(exc))
    rows: list[dict[str, Any]] = [
        {"name": e.name, "lab": e.lab, "created": e.created, "models": list(e.models),
         "rpm": e.rpm, "tpm": e.tpm, "expires": e.expires or None,
         "sha256_prefix": e.digest[:12]} for e in entries]
    if as_json:
        print_json(rows)
        return
    from coral_hpc.cli._output import Column, print_table

    print_table([Column("name", "id"), Column("lab", "id"), Column("models", "id"),
                 Column("rpm", "num"), Column("tpm", "num"), Column("expires", "id"),
                 Column("created", "id"), Column("sha256 prefix", "id")],
                [(row["name"], row["lab"] or "-", ",".join(row["models"]) or "all",
                  row["rpm"] or "-", row["tpm"] or "-", row["expires"] or "never",
                  row["created"], row["sha256_prefix"]) for row in rows])


@keys.command("remove")
@click.argument("keys_file", type=click.Path(dir_okay=False))
@click.argument("name")
def keys_remove(keys_file: str, name: str) -> None:
    """Delete key NAME from KEYS_FILE (a running gateway notices within a second)."""
    from coral_hpc.gateway.auth import KeysFileError, remove_key

    try:
        remove_key(keys_file, name)
    except KeysFileError as exc:
        fail(str(exc))
    click.echo(f"key {name!r} removed from {keys_file}", err=True)
