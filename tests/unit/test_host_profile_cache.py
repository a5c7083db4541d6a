"""The real-engine SLO test's per-host profile cache (tests/vllm/example.py): measured once, then
reused only while the host's CPU and the inputs that decide the figures are unchanged."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tests.vllm.example as example
from coral_hpc.config import load_deployment

LAYOUTS = ("coral-tiny-llama__a100__tp1.yaml",
           "pipelines/coral-tiny-llama-long__v100__tp1__pp2.yaml")


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """A stand-in for `coral-hpc profile` that writes one file per layout, numbered by the run,
    and an extra input file the key depends on."""
    runs: list[int] = []
    extra = tmp_path / "input.txt"
    extra.write_text("one")

    def profile_here(config: Path, env: dict) -> list[Path]:
        runs.append(len(runs) + 1)
        target = load_deployment(config).measured_profiles_path
        written = []
        for name in LAYOUTS:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_text(f"run {len(runs)}\n")
            written.append(target / name)
        return written

    monkeypatch.setattr(example, "profile_here", profile_here)
    monkeypatch.setattr(example, "PROFILE_CACHE", tmp_path / "cache")
    monkeypatch.setattr(example, "PROFILE_INPUTS", (*example.PROFILE_INPUTS, extra))
    return runs, extra


def _config(folder: Path) -> Path:
    config = example.example_copy(folder, Path("/venv"), Path("/models"))
    text = re.sub(r"(?m)^profiles_dir: .*$", f"profiles_dir: {folder / 'profiles'}",
                  config.read_text())
    config.write_text(text)
    return config


def test_measured_once_then_copied_while_the_inputs_hold(tmp_path, measured):
    runs, extra = measured
    first, second, third = (tmp_path / n for n in ("a", "b", "c"))
    for folder in (first, second, third):
        folder.mkdir()
    files = example.profiles_of_this_host(_config(first), {})
    assert runs == [1] and [f.read_text() for f in files] == ["run 1\n"] * 2

    again = example.profiles_of_this_host(_config(second), {})
    assert runs == [1], "the same host and inputs measured again"
    assert [f.relative_to(second / "profiles") for f in again] == [Path(n) for n in LAYOUTS]
    assert [f.read_text() for f in again] == ["run 1\n"] * 2

    extra.write_text("two")  # e.g. the profile code changed
    changed = example.profiles_of_this_host(_config(third), {})
    assert runs == [1, 2] and [f.read_text() for f in changed] == ["run 2\n"] * 2
