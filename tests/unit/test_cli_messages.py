"""The CLI's messages say what is wrong, once, in Slurm's words where Slurm said it (issue 29d).

Each test runs the command as a user would, on recorded data (tests/data): the dev cluster's
saved snapshot, real sinfo/sacct output.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
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


def _problems(text: str) -> list[str]:
    from coral_hpc.config import ConfigError, parse_deployment

    try:
        parse_deployment(text, "m.yaml")
    except ConfigError as exc:
        return exc.problems
    raise AssertionError("expected a ConfigError")


_UNION_CASES = """
deployment: u
state_dir: /tmp/u
db_path: /tmp/u.db
engine: {kind: sim}
cluster:
  partitions:
    - {name: v100, gpu_types: [v100], price: {v100: fast}}
    - {name: a100, gpu_types: [a100], price: free}
models:
  - {name: m, source: x, architecture: x, mix: {input_tokens: 100, output_tokens: 10},
     demand: {requests_per_s: -1}, slo: {ttft_s: 1, tpot_s: 0.1}}
  - {name: n, source: x, architecture: x, mix: {input_tokens: 100, output_tokens: 10},
     demand: {requests_per_s: 1, bogus: 2}, slo: {ttft_s: 1, tpot_s: 0.1}}
"""


def test_a_union_field_gives_one_error_per_problem():
    problems = _problems(_UNION_CASES)
    assert problems == [
        "m.yaml:8: cluster.partitions[0].price.v100: Input should be a valid number, unable to "
        "parse string as a number",
        "m.yaml:9: cluster.partitions[1].price: Input should be a valid dictionary or 'billing' "
        "or 'catalog'",
        "m.yaml:12: models[0].demand.requests_per_s: Input should be greater than or equal to 0",
        "m.yaml:14: models[1].demand.bogus: unknown key 'bogus'; valid keys here: "
        "output_tokens_per_s, requests_per_s",
    ]


def test_validate_json_prints_the_errors_and_exits_2(tmp_path: Path):
    bad = tmp_path / "m.yaml"
    bad.write_text(_UNION_CASES)
    result = CliRunner().invoke(cli, ["validate", str(bad), "--json"])
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["valid"] is False and document["file"] == str(bad)
    assert len(document["errors"]) == 4 and "price.v100" in document["errors"][0]
    assert "4 problem(s)" in result.stderr  # the same lines as without --json, on stderr
    # a problem only Slurm's partitions reveal is reported the same way
    site = CliRunner().invoke(cli, ["validate", str(_university(tmp_path)), "--json",
                                    "--snapshot", str(SNAPSHOT)])
    assert site.exit_code == 2
    assert "Slurm has no partition" in json.loads(site.stdout)["errors"][0]


def test_cluster_with_a_missing_slurm_conf_fails_fast_in_slurms_words(tmp_path: Path,
                                                                     monkeypatch):
    import time

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["cluster"])
    assert time.monotonic() - started < 10  # not sinfo's 60 s retry loop, three times over
    assert result.exit_code == 2, result.output
    assert f"cannot stat file {tmp_path / 'slurm.conf'}: No such file or directory" in (
        result.stderr)


# ----------------------------------------------------------- --since/--until as sacct reads them
_NOW = datetime(2026, 12, 2, 18, 0, 5)  # local time, as sacct reads its TIME


@pytest.mark.parametrize("text, expected", [
    ("now-2days", datetime(2026, 11, 30, 18, 0, 5)),
    ("now-3hours", datetime(2026, 12, 2, 15, 0, 5)),
    ("now-1weeks", datetime(2026, 11, 25, 18, 0, 5)),
    ("now-2", datetime(2026, 12, 2, 18, 0, 3)),  # sacct: seconds when no unit
    ("now-90m", datetime(2026, 12, 2, 16, 30, 5)),
    ("now+1h", datetime(2026, 12, 2, 19, 0, 5)),
    ("today", datetime(2026, 12, 2)),
    ("midnight", datetime(2026, 12, 2)),
    ("noon", datetime(2026, 12, 2, 12)),
    ("teatime", datetime(2026, 12, 2, 16)),
    ("yesterday", datetime(2026, 12, 1)),
    ("19:00", datetime(2026, 12, 1, 19)),  # ahead of now: sacct takes the last one passed
    ("9:30am", datetime(2026, 12, 2, 9, 30)),
    ("12/01", datetime(2026, 12, 1)),
    ("12/01/25-10:00", datetime(2025, 12, 1, 10)),
    ("1201", datetime(2026, 12, 1)),
    ("2026-11-29T10:00", datetime(2026, 11, 29, 10)),
])
def test_since_reads_sacct_time_forms(text: str, expected: datetime):
    from coral_hpc.cli.cost import parse_when

    assert parse_when(text, _NOW.timestamp()) == expected.timestamp()


@pytest.mark.parametrize("text", ["now-2fortnights", "soon", "13/45", "25:00"])
def test_since_refuses_what_is_not_a_time_naming_the_forms(text: str):
    from coral_hpc.cli.cost import parse_when

    with pytest.raises(ValueError, match="now-2days"):
        parse_when(text, _NOW.timestamp())
