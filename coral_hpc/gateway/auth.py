"""Client API keys: a file of hashed keys, checked on ``Authorization: Bearer <key>``.

File format, one key per line (``#`` starts a comment)::

    <name> sha256:<64 hex digits> [created=<ISO time>] [lab=<lab>]

Keys are generated here (256 random bits), shown once, and only their SHA-256 is stored. A plain
unsalted hash is enough because the keys are random, not passwords: nobody can guess a 256-bit
preimage, and it lets a lookup be one dictionary access. The key's *name* is what metrics and
demand counters are labelled with; the key itself is never logged. ``lab`` (optional) is the group
the key's use is booked to; the gateway's access log names it beside the key.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from coral_hpc.atomic import write_atomic
from coral_hpc.config import is_loopback_host
from coral_hpc.errors import PermanentError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_LINE_RE = re.compile(r"^(\S+)\s+sha256:([0-9a-f]{64})(?:\s+created=(\S+))?(?:\s+lab=(\S+))?$")
KEY_PREFIX = "coral-"


class KeysFileError(PermanentError):
    """The API-keys file is unreadable or has a bad line; the message names file and line."""


@dataclass(frozen=True)
class KeyEntry:
    """One stored key: its name, its hash and when it was created."""

    name: str
    digest: str
    created: str = ""
    lab: str | None = None


def hash_key(key: str) -> str:
    """The hex SHA-256 of ``key`` as stored in the keys file."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def read_keys_file(path: str | os.PathLike[str]) -> list[KeyEntry]:
    """Parse the keys file at ``path``; raises :class:`KeysFileError` naming the bad line."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeysFileError(f"{file}: cannot read the API-keys file: {exc.strerror}") from None
    entries: list[KeyEntry] = []
    names: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE_RE.match(line)
        if not match or not _NAME_RE.match(match.group(1)) or (
                match.group(4) is not None and not _NAME_RE.match(match.group(4))):
            raise KeysFileError(
                f"{file}:{lineno}: expected '<name> sha256:<64 hex digits> [created=<time>] "
                "[lab=<lab>]' (make keys with `coral-hpc keys add`)"
            )
        name, digest, created = match.group(1), match.group(2), match.group(3) or ""
        if name in names:
            raise KeysFileError(f"{file}:{lineno}: key name {name!r} is used twice")
        names.add(name)
        entries.append(KeyEntry(name, digest, created, match.group(4)))
    return entries


def _write_keys_file(path: Path, entries: list[KeyEntry]) -> None:
    lines = ["# coral-hpc gateway API keys: name, SHA-256 of the key. Keys themselves are not kept."]
    for entry in entries:
        created = f" created={entry.created}" if entry.created else ""
        lab = f" lab={entry.lab}" if entry.lab else ""
        lines.append(f"{entry.name} sha256:{entry.digest}{created}{lab}")
    # 0600 from the first byte: hashes are not keys, but nobody else needs to read them either.
    write_atomic(path, "\n".join(lines) + "\n", mode=0o600)


def add_key(path: str | os.PathLike[str], name: str, lab: str | None = None) -> str:
    """Create a new key called ``name`` (of ``lab``, when given), store its hash in ``path`` and
    return the key (the only time it is ever visible)."""
    for what, value in (("key name", name), ("lab", lab)):
        if value is not None and not _NAME_RE.match(value):
            raise KeysFileError(
                f"{value!r} is not a {what}: use letters, digits, '.', '_' or '-' "
                "(≤ 63 characters)"
            )
    file = Path(path)
    entries = read_keys_file(file) if file.exists() else []
    if any(e.name == name for e in entries):
        raise KeysFileError(f"{file}: a key named {name!r} exists; remove it first or pick a name")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    entries.append(KeyEntry(name, hash_key(key), created, lab))
    _write_keys_file(file, entries)
    return key


def remove_key(path: str | os.PathLike[str], name: str) -> None:
    """Delete the key called ``name`` from ``path``; raises :class:`KeysFileError` if absent."""
    file = Path(path)
    entries = read_keys_file(file)
    kept = [e for e in entries if e.name != name]
    if len(kept) == len(entries):
        raise KeysFileError(f"{file}: no key named {name!r}")
    _write_keys_file(file, kept)


class KeyChecker:
    """Maps a presented bearer token to the name of its key (and a key's name to its lab)."""

    def __init__(self, entries: list[KeyEntry]) -> None:
        self._by_digest = {e.digest: e.name for e in entries}
        self._labs = {e.name: e.lab for e in entries if e.lab}

    def lab_of(self, name: str) -> str | None:
        """The lab of key ``name``, or None when it has none."""
        return self._labs.get(name)

    def name_for(self, authorization: str | None) -> str | None:
        """The key name for an ``Authorization`` header value, or None when it is not valid."""
        if not authorization:
            return None
        # RFC 9110 §11.1: the scheme is case-insensitive ("bearer" and "BEARER" are "Bearer")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = token.strip()
        if not token:
            return None
        return self._by_digest.get(hash_key(token))


def is_loopback(host: str) -> bool:
    """True when ``host`` (from ``gateway.listen``) only accepts connections from this machine."""
    return is_loopback_host(host.strip("[]"))
