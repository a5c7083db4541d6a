"""coral_hpc.atomic.write_atomic: readers see the old file or the new one, with the right mode."""

from __future__ import annotations

import os
import stat

import pytest

from coral_hpc.atomic import not_private_problem, private_dir, write_atomic


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


# Issue 28 item 2: a login node is multi-user; what coral-hpc writes is private by default.


def test_files_are_0600_and_created_folders_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "state" / "dep" / "endpoints" / "r.json"
        write_atomic(path, "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (tmp_path / "state", tmp_path / "state" / "dep", path.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_private_dir_leaves_existing_folders_alone(tmp_path):
    tmp_path.chmod(0o755)
    assert private_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700


@pytest.mark.parametrize(("mode", "phrase"), [(0o775, "chmod 700"), (0o757, "chmod 700"),
                                               (0o700, None), (0o755, None)])
def test_not_private_problem_names_the_path_and_the_fix(tmp_path, mode, phrase):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(mode)
    problem = not_private_problem(folder)
    if phrase is None:
        assert problem is None
    else:
        assert problem is not None and f"{phrase} {folder}" in problem
