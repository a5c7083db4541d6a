"""Real-engine tests (marker ``vllm``): vLLM's CPU build serving the project's generated models
in jobs on the local Slurm cluster. The fixtures build what they need with the project's own
scripts (cached outside the repo, so only the first run pays): the engine venv
(``scripts/vllm-cpu-env``) and the test models (``scripts/make-test-models``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


def _run(argv: list[str], what: str) -> str:
    out = subprocess.run(argv, check=False, capture_output=True, text=True, cwd=REPO, timeout=1800)
    if out.returncode != 0:
        pytest.fail(f"{what} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The engine venv (built on first use, ~3 min)."""
    return Path(_run([str(REPO / "scripts" / "vllm-cpu-env")], "scripts/vllm-cpu-env"))


@pytest.fixture(scope="session")
def test_models(vllm_venv: Path) -> Path:
    """The folder holding the generated test models."""
    return Path(_run([str(vllm_venv / "bin" / "python"), str(REPO / "scripts" / "make-test-models")],
                     "scripts/make-test-models"))


@pytest.fixture
def vllm_env(slurm_cluster, monkeypatch, vllm_venv, test_models):
    """The local cluster's environment (set on this process too: submitit runs sbatch with it),
    with the engine venv and the models in place."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    return {**slurm_cluster, "CORAL_VLLM_VENV": str(vllm_venv),
            "CORAL_TEST_MODELS": str(test_models), **{k: v for k, v in os.environ.items()
                                                      if k == "PATH"}}
