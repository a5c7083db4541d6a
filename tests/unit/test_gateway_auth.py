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
