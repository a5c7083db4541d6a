"""The CLI's messages say what is wrong, once, in Slurm's words where Slurm said it (issue 29d).

Each test runs the command as a user would, on recorded data (tests/data): the dev cluster's
saved snapshot, real sinfo/sacct output.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from coral_hpc.cli import cli
from tests.conftest import REPO

SNAPSHOT = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"


def _university(tmp_path: Path) -> Path:
    """examples/university.yaml with its state on this host (its partitions gpu-v100 and
    gpu-a100 are not the dev cluster's)."""
    text = (REPO / "examples" / "university.yaml").read_text()
    text = text.replace("/scratch/shared/coral-hpc", str(tmp_path / "shared"))
    text = text.replace("~/.local/state/coral-hpc/lab-llm.db", str(tmp_path / "lab-llm.db"))
    path = tmp_path / "university.yaml"
    path.write_text(text)
    return path


def test_validate_names_the_partition_slurm_lacks(tmp_path: Path):
    path = _university(tmp_path)
    result = CliRunner().invoke(cli, ["validate", str(path), "--snapshot", str(SNAPSHOT)])
    assert result.exit_code == 2, result.output
    assert "Slurm has no partition gpu-a100, gpu-v100" in result.output
    assert "(none)" not in result.output and "at most 0" not in result.output
