"""docs/config-reference.md is generated from the pydantic models and kept in sync with them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from coral_hpc.config.reference import _sections, render_reference

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "config-reference.md"


def test_the_reference_page_matches_the_models():
    assert PAGE.read_text() == render_reference(), (
        "docs/config-reference.md is out of date: run scripts/config-reference")


def test_every_section_and_key_is_in_the_reference():
    text = PAGE.read_text()
    sections = _sections()
    assert {model.__name__ for _, model in sections} >= {
        "Deployment", "ClusterConfig", "PartitionConfig", "EngineConfig", "GatewayConfig",
        "PolicyConfig", "RetentionConfig", "ModelConfig", "VenvEnvironment",
        "ApptainerEnvironment"}
    for _, model in sections:
        assert f"## {model.__name__}" in text
        for name in model.model_fields:
            assert f"| `{name}` |" in text, (model.__name__, name)


def test_the_script_checks_and_fails_on_a_stale_page(tmp_path):
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "config-reference"), "--check"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "docs").mkdir()
    (copy / "scripts" / "config-reference").write_text(
        (REPO / "scripts" / "config-reference").read_text())
    (copy / "docs" / "config-reference.md").write_text(PAGE.read_text() + "stale\n")
    (copy / "coral_hpc").symlink_to(REPO / "coral_hpc")
    (copy / "solver").symlink_to(REPO / "solver")
    stale = subprocess.run([sys.executable, str(copy / "scripts" / "config-reference"),
                            "--check"], capture_output=True, text=True, check=False)
    assert stale.returncode == 1 and "out of date" in stale.stderr
