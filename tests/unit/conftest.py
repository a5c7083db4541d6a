"""Unit tests never reach a Slurm: whatever cluster the test machine has (up, down or half set
up) must not change a unit result or make a CLI test wait out scontrol's 60 s retry. Every test
here, and every child process it starts, sees Slurm commands that fail at once and no
``SLURM_CONF`` (``make test`` exports the local cluster's, which the unit lane runs before
that cluster is set up: a runner that checks the file first would fail every fake command);
tests that need a real cluster live in tests/integration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.no_slurm import no_slurm_env


@pytest.fixture(scope="session", autouse=True)
def _no_slurm_on_path(tmp_path_factory):
    saved = {name: os.environ.get(name) for name in ("PATH", "SLURM_CONF")}
    os.environ.pop("SLURM_CONF", None)
    os.environ.update(no_slurm_env(tmp_path_factory.mktemp("no-slurm")))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def files_read(monkeypatch) -> set[Path]:
    """Every file read with ``Path.read_bytes`` from now on in the test, resolved (e.g. the
    modules a cache key hashes)."""
    read: set[Path] = set()
    read_bytes = Path.read_bytes

    def recording(path: Path) -> bytes:
        read.add(path.resolve())
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", recording)
    return read
