"""The ``gateway`` section: the one OpenAI-compatible endpoint, and who may reach it.

Every route but ``/health`` needs an API key, on every address: a login node's loopback is shared
by everyone logged in, so ``127.0.0.1`` is not private. Beyond loopback the keys must travel over
TLS. Only a machine one person uses may serve without keys, and only on loopback, by saying so:
``open_on_loopback: true``."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator, model_validator

from coral_hpc.config.base import _against_file, _Frozen

#: why a gateway without a keys file and without the opt-out does not start
NO_KEYS_MESSAGE = (
    "gateway.api_keys_file is not set: every route of the gateway needs an API key, on "
    "127.0.0.1 too, since everyone logged in to a login node shares its loopback. Create a key "
    "with `coral-hpc keys add FILE NAME` and set gateway.api_keys_file: FILE; or, on a machine "
    "only you use, set gateway.open_on_loopback: true"
)

#: logged at every start of a gateway without keys
OPEN_WARNING = (
    "gateway.open_on_loopback is true: no API key is asked for, and everyone who can log in to "
    "this machine may use every model, read the metrics and the routing table; a shared login "
    "node must not run this way (set gateway.api_keys_file)"
)


def access_warning(config: GatewayConfig) -> str | None:
    """What ``validate`` says of who may reach the gateway: that ``serve`` and ``gateway``
    will refuse a file without keys or the opt-out, or that the opt-out is in use."""
    if config.api_keys_file is not None:
        return None
    if config.open_on_loopback:
        return OPEN_WARNING
    return "serve and gateway will refuse to start: " + NO_KEYS_MESSAGE


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; a host name may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GatewayConfig(_Frozen):
    """The one OpenAI-compatible endpoint."""

    listen: str = Field(default="127.0.0.1:8000", description="host:port")
    api_keys_file: str | None = Field(
        default=None,
        description="file of hashed API keys (`coral-hpc keys add`); every route but /health "
                    "needs one of them, loopback included",
    )
    open_on_loopback: bool = Field(
        default=False,
        description="serve without API keys: anyone who can log in to this machine may use every "
                    "model, the metrics and the internal routes. Only for a machine one person "
                    "uses, with a loopback listen; never on a shared login node",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, le=1 << 30,
        description="largest request body accepted, in bytes; a larger one is answered 413",
    )
    tls_cert: str | None = Field(
        default=None, description="PEM certificate (chain) the gateway serves HTTPS with"
    )
    tls_key: str | None = Field(default=None, description="PEM private key of tls_cert; mode 0600")
    behind_tls_proxy: bool = Field(
        default=False,
        description="a TLS-terminating proxy of the site is in front: plain HTTP beyond loopback",
    )

    _resolve = field_validator("api_keys_file", "tls_cert", "tls_key")(_against_file)

    @model_validator(mode="after")
    def _exposure(self) -> GatewayConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set tls_cert and tls_key together (or neither)")
        if self.open_on_loopback and not is_loopback_host(self.host):
            raise ValueError(
                f"open_on_loopback: true serves without API keys, so it needs a loopback listen "
                f"address, but listen {self.listen!r} is reachable from other machines: set "
                "api_keys_file instead (`coral-hpc keys add FILE NAME`) and drop open_on_loopback"
            )
        if self.open_on_loopback and self.api_keys_file is not None:
            raise ValueError(
                "open_on_loopback: true and api_keys_file are both set: with a keys file every "
                "route needs a key, so drop open_on_loopback (or the keys file, on a machine "
                "only you use)"
            )
        if is_loopback_host(self.host):
            return self
        # beyond loopback, API keys travel over the network: keys, and TLS to carry them
        if self.api_keys_file is None:
            raise ValueError(
                f"listen {self.listen!r} is reachable from other machines: set api_keys_file "
                "(`coral-hpc keys add FILE NAME`) or listen on 127.0.0.1"
            )
        if self.tls_cert is None and not self.behind_tls_proxy:
            raise ValueError(
                f"listen {self.listen!r} is reachable from other machines and API keys would "
                "cross the network in clear: set tls_cert and tls_key, or behind_tls_proxy: true "
                "when the site's TLS-terminating proxy is in front"
            )
        return self

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not host:port such as '127.0.0.1:8000'")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])
