"""Client API keys: a file of hashed keys, checked on ``Authorization: Bearer <key>``.

File format, one key per line (``#`` starts a comment)::

    <name> sha256:<64 hex digits> [created=<ISO time>] [lab=<lab>] [models=<m1>,<m2>]
        [rpm=<requests per minute>] [tpm=<tokens per minute>] [expires=<ISO date or time>]

Keys are generated here (256 random bits), shown once, and only their SHA-256 is stored. A plain
unsalted hash is enough because the keys are random, not passwords: nobody can guess a 256-bit
preimage, and it lets a lookup be one dictionary access. The key's *name* is what metrics and
demand counters are labelled with; the key itself is never logged. ``lab`` (optional) is the group
the key's use is booked to; the gateway's access log names it beside the key. The policy fields
(all optional, in any order) scope a key to some models, limit its requests and tokens per
minute, and end it at a time (a date alone ends at its start, UTC).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from coral_hpc.atomic import write_atomic
from coral_hpc.config import is_loopback_host
from coral_hpc.errors import PermanentError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_HEAD_RE = re.compile(r"^(\S+)\s+sha256:([0-9a-f]{64})((?:\s+\S+=\S+)*)$")
_FIELDS = ("created", "lab", "models", "rpm", "tpm", "expires")
KEY_PREFIX = "coral-"


class KeysFileError(PermanentError):
    """The API-keys file is unreadable or has a bad line; the message names file and line."""


@dataclass(frozen=True)
class KeyEntry:
    """One stored key: its name, its hash, when it was created, its lab and its policy."""

    name: str
    digest: str
    created: str = ""
    lab: str | None = None
    models: tuple[str, ...] = ()      #: the models it may use; () = every model
    rpm: int | None = None            #: requests per minute at most
    tpm: int | None = None            #: tokens (prompt + output) per minute at most
    expires: str = ""                 #: ISO date or time (UTC unless it says); "" = never

    @property
    def expires_at(self) -> float | None:
        """``expires`` as epoch seconds (None: never)."""
        return _epoch(self.expires) if self.expires else None

    def fields(self) -> str:
        """The line's fields after the hash, as the keys file writes them."""
        values = {"created": self.created, "lab": self.lab or "",
                  "models": ",".join(self.models), "rpm": "" if self.rpm is None else self.rpm,
                  "tpm": "" if self.tpm is None else self.tpm, "expires": self.expires}
        return "".join(f" {k}={v}" for k, v in values.items() if v != "")


def _epoch(text: str) -> float:
    """An ISO date or time as epoch seconds, UTC unless it names its zone."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _entry(file: Path, lineno: int, name: str, digest: str, rest: str) -> KeyEntry:
    """A line's fields checked one by one; raises :class:`KeysFileError` naming the field."""
    where = f"{file}:{lineno}"
    values: dict[str, str] = {}
    for item in rest.split():
        field, _, value = item.partition("=")
        if field not in _FIELDS:
            raise KeysFileError(f"{where}: unknown field {field!r}; known: {', '.join(_FIELDS)}")
        if field in values:
            raise KeysFileError(f"{where}: {field} given twice")
        values[field] = value
    lab = values.get("lab")
    if lab is not None and not _NAME_RE.match(lab):
        raise KeysFileError(f"{where}: lab={lab!r} is not a name (letters, digits, '.', '_', '-')")
    models = tuple(m for m in values.get("models", "").split(",") if m)
    limits: dict[str, int | None] = {}
    for field in ("rpm", "tpm"):
        text = values.get(field)
        if text is not None and (not text.isdigit() or int(text) < 1):
            raise KeysFileError(f"{where}: {field}={text!r} must be a whole number ≥ 1")
        limits[field] = int(text) if text is not None else None
    expires = values.get("expires", "")
    if expires:
        try:
            _epoch(expires)
        except ValueError:
            raise KeysFileError(f"{where}: expires={expires!r} is not an ISO date or time "
                                "(e.g. 2027-01-31 or 2027-01-31T18:00:00Z)") from None
    return KeyEntry(name, digest, values.get("created", ""), lab, models, limits["rpm"],
                    limits["tpm"], expires)


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
        match = _HEAD_RE.match(line)
        if not match or not _NAME_RE.match(match.group(1)):
            raise KeysFileError(
                f"{file}:{lineno}: expected '<name> sha256:<64 hex digits> [created=<time>] "
                "[lab=<lab>] [models=<m>,...] [rpm=<n>] [tpm=<n>] [expires=<date>]' (make keys "
                "with `coral-hpc keys add`)"
            )
        name, digest = match.group(1), match.group(2)
        if name in names:
            raise KeysFileError(f"{file}:{lineno}: key name {name!r} is used twice")
        names.add(name)
        entries.append(_entry(file, lineno, name, digest, match.group(3)))
    return entries


def _write_keys_file(path: Path, entries: list[KeyEntry]) -> None:
    lines = ["# coral-hpc gateway API keys: name, SHA-256 of the key. Keys themselves are not kept."]
    for entry in entries:
        lines.append(f"{entry.name} sha256:{entry.digest}{entry.fields()}")
    # 0600 from the first byte: hashes are not keys, but nobody else needs to read them either.
    write_atomic(path, "\n".join(lines) + "\n", mode=0o600)


def add_key(path: str | os.PathLike[str], name: str, lab: str | None = None, *,
            models: tuple[str, ...] = (), rpm: int | None = None, tpm: int | None = None,
            expires: str = "") -> str:
    """Create a new key called ``name`` (of ``lab``, scoped to ``models``, limited to ``rpm``
    requests and ``tpm`` tokens a minute, ending at ``expires``, when given), store its hash in
    ``path`` and return the key (the only time it is ever visible)."""
    for what, value in (("key name", name), ("lab", lab), *(("model", m) for m in models)):
        if value is not None and not _NAME_RE.match(value):
            raise KeysFileError(
                f"{value!r} is not a {what}: use letters, digits, '.', '_' or '-' "
                "(≤ 63 characters)"
            )
    for what, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and limit < 1:
            raise KeysFileError(f"{what} {limit} must be at least 1")
    if expires:
        try:
            _epoch(expires)
        except ValueError:
            raise KeysFileError(f"expires {expires!r} is not an ISO date or time "
                                "(e.g. 2027-01-31 or 2027-01-31T18:00:00Z)") from None
    file = Path(path)
    entries = read_keys_file(file) if file.exists() else []
    if any(e.name == name for e in entries):
        raise KeysFileError(f"{file}: a key named {name!r} exists; remove it first or pick a name")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    entries.append(KeyEntry(name, hash_key(key), created, lab, tuple(models), rpm, tpm, expires))
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
    """Maps a presented bearer token to the name of its key (and a key's name to its lab and
    policy). An expired key is no key."""

    def __init__(self, entries: list[KeyEntry], clock: Callable[[], float] = time.time) -> None:
        self._by_digest = {e.digest: e for e in entries}
        self._by_name = {e.name: e for e in entries}
        self._clock = clock

    def lab_of(self, name: str) -> str | None:
        """The lab of key ``name``, or None when it has none."""
        entry = self._by_name.get(name)
        return entry.lab if entry is not None else None

    def entry(self, name: str) -> KeyEntry | None:
        """Key ``name``'s stored entry (its policy)."""
        return self._by_name.get(name)

    def allows(self, name: str, model: str) -> bool:
        """Whether key ``name`` may use ``model`` (a key without ``models=`` may use every one)."""
        entry = self._by_name.get(name)
        return entry is not None and (not entry.models or model in entry.models)

    def name_for(self, authorization: str | None) -> str | None:
        """The key name for an ``Authorization`` header value, or None when it is not valid
        (unknown, or past its ``expires``)."""
        if not authorization:
            return None
        # RFC 9110 §11.1: the scheme is case-insensitive ("bearer" and "BEARER" are "Bearer")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = token.strip()
        if not token:
            return None
        entry = self._by_digest.get(hash_key(token))
        if entry is None:
            return None
        expires = entry.expires_at
        if expires is not None and self._clock() >= expires:
            return None
        return entry.name


def is_loopback(host: str) -> bool:
    """True when ``host`` (from ``gateway.listen``) only accepts connections from this machine."""
    return is_loopback_host(host.strip("[]"))
