"""API keys: hashed file, shown once, strict parsing, loopback rule."""

from __future__ import annotations

import os

import pytest

from coral_hpc.gateway.auth import (
    KeyChecker,
    KeysFileError,
    add_key,
    hash_key,
    is_loopback,
    read_keys_file,
    remove_key,
)


def test_added_key_is_stored_only_as_hash_with_private_mode(tmp_path):
    path = tmp_path / "keys"
    key = add_key(path, "alice")
    text = path.read_text()
    assert key not in text and hash_key(key) in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    checker = KeyChecker(read_keys_file(path))
    assert checker.name_for(f"Bearer {key}") == "alice"
    assert checker.name_for(f"Bearer {key}x") is None
    assert checker.name_for(key) is None            # not a Bearer header
    assert checker.name_for(None) is None
    assert checker.name_for("Bearer ") is None


def test_two_keys_are_distinct_and_removable(tmp_path):
    path = tmp_path / "keys"
    k1, k2 = add_key(path, "alice"), add_key(path, "bob")
    assert k1 != k2
    with pytest.raises(KeysFileError, match="exists"):
        add_key(path, "alice")
    remove_key(path, "alice")
    checker = KeyChecker(read_keys_file(path))
    assert checker.name_for(f"Bearer {k1}") is None
    assert checker.name_for(f"Bearer {k2}") == "bob"
    with pytest.raises(KeysFileError, match="no key named"):
        remove_key(path, "alice")


def test_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# comment\n\nalice sha256:" + "a" * 64 + "\nbob plaintext-key\n")
    with pytest.raises(KeysFileError, match=r"keys:4: expected"):
        read_keys_file(path)
    path.write_text(f"a sha256:{'b' * 64}\na sha256:{'c' * 64}\n")
    with pytest.raises(KeysFileError, match=r"keys:2: key name 'a' is used twice"):
        read_keys_file(path)
    with pytest.raises(KeysFileError, match="cannot read"):
        read_keys_file(tmp_path / "missing")
    with pytest.raises(KeysFileError, match="not a key name"):
        add_key(path, "bad name")


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("login01.cluster", False),
])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


# --- keys that carry policy: models, requests and tokens per minute, expiry -------------------


def test_policy_fields_round_trip_and_an_old_file_still_reads(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"old sha256:{'a' * 64} created=2026-01-01T00:00:00+00:00 lab=astro\n")
    add_key(path, "scoped", "bio", models=("llama-8b", "qwen3-8b"), rpm=30, tpm=20000,
            expires="2027-01-31")
    entries = {e.name: e for e in read_keys_file(path)}
    assert (entries["old"].lab, entries["old"].models, entries["old"].rpm) == ("astro", (), None)
    scoped = entries["scoped"]
    assert (scoped.lab, scoped.models, scoped.rpm, scoped.tpm, scoped.expires) == (
        "bio", ("llama-8b", "qwen3-8b"), 30, 20000, "2027-01-31")
    checker = KeyChecker(list(entries.values()))
    assert checker.allows("scoped", "llama-8b") and not checker.allows("scoped", "phi-4")
    assert checker.allows("old", "phi-4")            # no models= : every model
    assert not checker.allows("nobody", "phi-4")


def test_an_expired_key_is_no_key(tmp_path):
    path = tmp_path / "keys"
    key = add_key(path, "term", expires="2027-01-31T18:00:00Z")
    now = [1_800_000_000.0]                          # 2027-01-15
    checker = KeyChecker(read_keys_file(path), clock=lambda: now[0])
    assert checker.name_for(f"Bearer {key}") == "term"
    now[0] = 1_801_677_600.0                         # 2027-01-31T18:00:00Z exactly
    assert checker.name_for(f"Bearer {key}") is None


@pytest.mark.parametrize("field, message", [
    ("rpm=0", "rpm='0' must be a whole number"), ("tpm=ten", "tpm='ten' must be a whole"),
    ("expires=soon", "expires='soon' is not an ISO date"), ("color=red", "unknown field 'color'"),
    ("lab=a lab=b", "lab given twice"), ("lab=x/y", "lab='x/y' is not a name"),
])
def test_a_bad_policy_field_names_its_line(tmp_path, field, message):
    path = tmp_path / "keys"
    path.write_text(f"# keys\nalice sha256:{'a' * 64} {field}\n")
    with pytest.raises(KeysFileError, match=f"keys:2: {message}"):
        read_keys_file(path)


def test_add_key_refuses_bad_policy(tmp_path):
    for kwargs, message in (({"rpm": 0}, "rpm 0"), ({"expires": "tomorrow"}, "not an ISO"),
                            ({"models": ("a b",)}, "not a model")):
        with pytest.raises(KeysFileError, match=message):
            add_key(tmp_path / "keys", "alice", **kwargs)
    assert not (tmp_path / "keys").exists()          # nothing written
