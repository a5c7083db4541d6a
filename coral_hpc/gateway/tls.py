"""TLS for the gateway: the server context from ``gateway.tls_cert`` / ``tls_key``, and the checks
on the files that hold secrets.

Beyond loopback, API keys cross the network; ``models.yaml`` then requires TLS here or a site's
TLS-terminating proxy in front (``gateway.behind_tls_proxy``), see :mod:`coral_hpc.config`.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

from coral_hpc.errors import PermanentError


class TLSSetupError(PermanentError):
    """A TLS or key file is missing, readable by others, or not a valid PEM certificate/key."""


def check_private_file(path: Path, what: str, forbidden: int = 0o077) -> None:
    """Refuse ``path`` unless it is a regular file without the ``forbidden`` permission bits
    (by default: nobody but the owner may read or write it, i.e. mode 0600 or 0400)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TLSSetupError(f"{what} {path}: cannot read it: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TLSSetupError(f"{what} {path}: not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & forbidden:
        raise TLSSetupError(
            f"{what} {path} has mode {mode:04o}; others must not "
            f"{'read or write' if forbidden & 0o044 else 'write'} it: chmod 600 {path}"
        )


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """An HTTPS server context (TLS 1.2 or newer) for ``cert`` (PEM chain) and ``key``; the key
    file must be mode 0600 (or 0400)."""
    check_private_file(key, "gateway.tls_key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except FileNotFoundError as exc:
        raise TLSSetupError(f"gateway.tls_cert {cert}: {exc.strerror}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TLSSetupError(
            f"gateway.tls_cert {cert} / tls_key {key}: not a PEM certificate and its matching "
            f"private key ({exc})"
        ) from None
    # HTTP/1.1 only: the gateway speaks nothing else, and saying so spares clients a guess
    context.set_alpn_protocols(["http/1.1"])
    return context


def loopback_client_context(cert: Path) -> ssl.SSLContext:
    """A client context for the daemon's own calls to its gateway on this machine: it trusts the
    gateway's certificate itself and does not match the name (the daemon dials an address such as
    127.0.0.1 that the certificate, issued for the site's host name, does not carry)."""
    context = ssl.create_default_context(cafile=str(cert))
    context.check_hostname = False
    # the leaf certificate itself is the trust anchor, whoever issued it
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context
