"""A throw-away certificate authority and a server certificate for ``localhost`` / 127.0.0.1,
made with the ``openssl`` command (argv lists; nothing leaves the test's folder)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PKI:
    """PEM files of one test CA and the server certificate it signed."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(folder: Path) -> PKI:
    """A CA and a server certificate for DNS:localhost and IP:127.0.0.1, valid for one day; the
    key files are mode 0600 as the gateway requires."""
    folder.mkdir(parents=True, exist_ok=True)
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=coral-hpc test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    _openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=folder)
    (folder / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "server.ext",
             cwd=folder)
    for key in ("ca.key", "server.key"):
        (folder / key).chmod(0o600)
    return PKI(folder / "ca.crt", folder / "server.crt", folder / "server.key")
