"""The documents a user reads are checked like code: README.md and INSTALL.md stay readable (no
line a screen cannot show), speak of the product and not of how it was built, list every command
that exists (each of which answers ``--help``); the models.yaml reference describes every field;
every example validates from any working directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import COMMANDS, cli
from coral_hpc.config import load_deployment
from coral_hpc.config.reference import _sections, field_description, field_type

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
USER_DOCS = (README, REPO / "INSTALL.md")
REFERENCE = REPO / "docs" / "config-reference.md"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
MAX_LINE = 300

#: words of the lab notebook, not of the product: work sessions, commits, CI runs, hosts
NOTEBOOK_WORDS = re.compile(
    r"this stop|the stop before|last stop|\bsession's\b|work session|\bCI (run|failure)\b|"
    r"the CI\b|\bmain [0-9a-f]{7}\b|\bcommit [0-9a-f]{7}\b|coral-no-ring-stall|this host",
    re.IGNORECASE)


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_no_line_is_longer_than_a_screen(doc):
    long = [(n, len(line)) for n, line in enumerate(doc.read_text().splitlines(), 1)
            if len(line) > MAX_LINE]
    assert not long, f"{doc.name}: lines over {MAX_LINE} characters (line, length): {long}"


@pytest.mark.parametrize("doc", [*USER_DOCS, *sorted((REPO / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_user_docs_speak_of_the_product_not_of_how_it_was_built(doc):
    found = [(n, m.group(0)) for n, line in enumerate(doc.read_text().splitlines(), 1)
             for m in NOTEBOOK_WORDS.finditer(line)]
    assert not found, f"{doc.name}: lab-notebook wording (line, words): {found}"


def test_the_readme_stays_short():
    words = len(README.read_text().split())
    assert words <= 1500, f"README.md has {words} words; measurements go to bench/results/README.md"


def _table_commands() -> list[str]:
    """The command names of the README's command table (rows that start with `coral-hpc NAME`)."""
    return re.findall(r"^\| `coral-hpc ([a-z]+)\b", README.read_text(), re.MULTILINE)


def test_the_command_table_lists_every_command_once():
    names = _table_commands()
    missing, unknown = sorted(set(COMMANDS) - set(names)), sorted(set(names) - set(COMMANDS))
    assert sorted(names) == sorted(COMMANDS), (
        f"README.md's command table and coral_hpc/cli COMMANDS differ: missing {missing}, "
        f"unknown {unknown}")


def test_the_readme_names_every_exit_status():
    from coral_hpc.cli._output import EXIT_STATUSES

    section = README.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    for code, _ in EXIT_STATUSES:
        assert re.search(rf"\b{code} [A-Za-z]", section), f"README omits exit status {code}"


def test_the_makefile_header_and_the_readme_give_the_same_two_commands():
    makefile = (REPO / "Makefile").read_text()
    header = makefile.split("\n\n", 1)[0].split("\nPYTHON", 1)[0]
    readme = README.read_text().split("## Try it on one machine", 1)[1].split("\n## ", 1)[0]
    for target in ("demo", "test"):
        assert f"make {target} " in header and f"make {target} " in readme, target
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"Makefile has no {target} target"
    assert "root" in header and "root" in readme
    assert "Debian/Ubuntu" in header and "Debian/Ubuntu" in readme


def _help_cases() -> list[tuple[str, ...]]:
    cases: list[tuple[str, ...]] = [(name,) for name in _table_commands()]
    cases += [("keys", sub) for sub in ("add", "list", "remove")]
    return cases


@pytest.mark.parametrize("argv", _help_cases(), ids=" ".join)
def test_every_command_in_the_table_answers_help(argv):
    result = CliRunner().invoke(cli, [*argv, "--help"], prog_name="coral-hpc")
    assert result.exit_code == 0, result.output
    assert f"Usage: coral-hpc {' '.join(argv)}" in result.output
    assert "Exit status" in result.output or "exit status" in result.output.lower()


def _fields():
    for path, model in _sections():
        for name, field in model.model_fields.items():
            yield f"{path}.{name}".lstrip("."), model, name, field


@pytest.mark.parametrize("where,model,name,field", list(_fields()), ids=lambda v: v if
                         isinstance(v, str) else "")
def test_every_config_field_has_a_description_in_the_reference(where, model, name, field):
    description = field_description(field).strip()
    assert description, f"{where}: add description= to the Field in coral_hpc/config/"
    section = REFERENCE.read_text().split(f"\n## {model.__name__}\n", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| `{name}` |"))
    assert row.rstrip(" |").split(" | ")[-1].strip(), f"{where}: empty cell in {REFERENCE.name}"


def test_the_reference_shows_env_as_a_mapping():
    from coral_hpc.config import VenvEnvironment

    assert field_type(VenvEnvironment.model_fields["env"]).startswith("map of")
    text = REFERENCE.read_text()
    assert "| `env` | map of string → string | {} |" in text
    assert "list of list" not in text


def test_the_reference_explains_demand_auto_and_time_units():
    head = REFERENCE.read_text().split("\n## ", 1)[0]
    assert "`demand: auto`" in head and "measured" in head
    assert "`_s`" in head and "seconds" in head
    assert "time_limit" in head and "minutes" in head


# --------------------------------------------------------------------------- examples

def _no_slurm_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which no Slurm command is found: validate then warns and still checks
    everything else (the unit lane runs without Slurm; a Slurm on the test host is not asked)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PATH"] = str(empty)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_from_any_working_directory(example, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "validate",
         str(example)], cwd=elsewhere, env=_no_slurm_env(tmp_path), capture_output=True,
        text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("valid"), run.stdout + run.stderr
    assert "Slurm not asked" in run.stdout + run.stderr


@pytest.mark.parametrize("example", [p for p in EXAMPLES if "profiles_dir:" in p.read_text()],
                         ids=lambda p: p.name)
def test_an_examples_profiles_dir_is_found_from_any_working_directory(example, tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    profiles = load_deployment(example).measured_profiles_path
    assert profiles.is_absolute() and profiles.is_dir(), profiles
