"""coral_hpc.atomic.write_atomic: readers see the old file or the new one, with the right mode."""

from __future__ import annotations

import os
import stat

import pytest

from coral_hpc.atomic import write_atomic


def test_replaces_the_file_with_its_mode_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "table.json"
    write_atomic(path, "old\n")
    write_atomic(path, b"new\n", mode=0o600)
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(path.parent)) == ["table.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "spec.json"
    write_atomic(path, "old\n")

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["spec.json"]
