"""Issue 16, Why-5: every hostile models.yaml is refused by `validate` and `serve` with exit 2,
naming the file (and line) and the field — never a traceback, a hang, or unbounded memory/time.

Each case here was measured failing before the fix (a traceback with exit 1, a hang on a FIFO,
/dev/zero read until memory ran out, a 12 s / 2.2 GB alias bomb, or "valid").
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.config import load_deployment, parse_deployment
from coral_hpc.config.source import MAX_CONFIG_BYTES
from coral_hpc.errors import ConfigError
from tests.unit.test_config import BASE, _edit

REPO = Path(__file__).resolve().parents[2]


def _bomb(levels: int = 6, width: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


# (id, file bytes, field named (None: the file itself), line (None: not checked), phrase)
TEXT_CASES = [
    ("deep-flow-nesting", b"a: " + b"[" * 100_000 + b"\n", None, 1, "nested deeper"),
    ("deep-block-nesting", "".join(f"{' ' * i}k{i}:\n" for i in range(200)).encode(), None, None,
     "nested deeper"),
    ("invalid-utf8", BASE.encode().replace(b"state_dir", b"st\xffte_dir"), None, 2, "not UTF-8"),
    ("binary", bytes(range(256)) * 8, None, 1, "binary file"),
    ("latin1-text", "deployment: caf\xe9\n".encode("latin-1"), None, 1, "not UTF-8"),
    ("raw-control-byte", BASE.replace("deployment: t", "deployment: t\x07").encode(), None, 1,
     "not valid YAML"),
    ("alias-bomb", _bomb().encode(), None, None, "expands to more than"),
    ("self-alias", b"deployment: &a [*a]\n", None, 1, "contains it"),
    ("unhashable-key", b"? [a, b]\n: 1\n", None, 1, "plain word"),
    ("python-tag", b"deployment: !!python/object/apply:os.system ['touch /tmp/coral-pwned']\n",
     None, 1, "not valid YAML"),
    ("two-documents", (BASE + "---\n" + BASE).encode(), None, None, "single document"),
    ("empty", b"", "(top level)", 1, "expected a mapping"),
    ("too-big", (BASE + "#" * (MAX_CONFIG_BYTES + 10) + "\n").encode(), None, None,
     "at most 1,048,576 bytes"),
    ("inf-demand", _edit(BASE, "requests_per_s: 2", "requests_per_s: .inf").encode(),
     "models[0].demand.requests_per_s", 19, "finite"),
    ("overflow-demand", _edit(BASE, "requests_per_s: 2", "requests_per_s: 1e400").encode(),
     "models[0].demand.requests_per_s", 19, "finite"),
    ("huge-int-demand", _edit(BASE, "requests_per_s: 2", "requests_per_s: 1" + "0" * 400).encode(),
     "models[0].demand.requests_per_s", 19, "valid number"),
    ("huge-demand", _edit(BASE, "requests_per_s: 2", "requests_per_s: 1e300").encode(),
     "models[0].demand.requests_per_s", 19, "less than or equal"),
    ("nan-ttft", _edit(BASE, "ttft_s: 2", "ttft_s: .nan").encode(), "models[0].slo.ttft_s", 20,
     "finite"),
    ("inf-priority", _edit(BASE, "    slo:", "    priority: .inf\n    slo:").encode(),
     "models[0].priority", 20, "finite"),
    ("huge-priority", _edit(BASE, "    slo:", "    priority: 1e300\n    slo:").encode(),
     "models[0].priority", 20, "less than or equal to 1000"),
    ("yes-priority", _edit(BASE, "    slo:", "    priority: yes\n    slo:").encode(),
     "models[0].priority", 20, "yes/no"),
    ("huge-min-replicas", _edit(BASE, "    slo:", f"    min_replicas: {10**30}\n    slo:").encode(),
     "models[0].min_replicas", 20, "less than or equal"),
    ("huge-time-limit", _edit(BASE, "cluster:\n", f"cluster:\n  time_limit: {10**12}\n").encode(),
     "cluster.time_limit", 5, "365 days"),
    ("newline-account",
     _edit(BASE, "cluster:\n", 'cluster:\n  account: "lab\\nrm -rf /"\n').encode(),
     "cluster.account", 5, "control character"),
    ("newline-state-dir", _edit(BASE, "state_dir: /tmp/coral-state",
                                'state_dir: "/tmp/coral-state\\ntouch /tmp/x"').encode(),
     "state_dir", 2, "control character"),
    ("tab-in-source", _edit(BASE, "source: Qwen/Qwen3-8B", 'source: "Qwen/\\tQwen3"').encode(),
     "models[0].source", 16, "control character"),
    ("line-separator", _edit(BASE, "source: Qwen/Qwen3-8B", 'source: "Qwen/\\u2028x"').encode(),
     "models[0].source", 16, "U+2028"),
    ("newline-env-path", _edit(BASE, "price: {v100: 0.8}",
                               'price: {v100: 0.8}\n      environment: '
                               '{kind: venv, path: "/x\\nid"}').encode(),
     "cluster.partitions[1].environment.path", 12, "control character"),
    ("shell-qos", _edit(BASE, "cluster:\n", "cluster:\n  qos: 'normal;touch /tmp/x'\n").encode(),
     "cluster.qos", 5, "not a Slurm qos name"),
    ("subshell-account", _edit(BASE, "cluster:\n", "cluster:\n  account: '$(id)'\n").encode(),
     "cluster.account", 5, "not a Slurm account name"),
    ("space-partition", _edit(BASE, "name: v100", "name: 'v 100'").encode(),
     "cluster.partitions[1].name", 9, "not a Slurm partition name"),
    ("tiny-poll", (BASE + "policy: {poll_interval_s: 0.05}\n").encode(), "policy.poll_interval_s",
     21, "greater than or equal to 1"),
    ("huge-queue-horizon", (BASE + "policy: {max_queue_wait_s: 1e12}\n").encode(),
     "policy.max_queue_wait_s", 21, "less than or equal to 604800"),
    ("int-top-key", (BASE + "1: x\n").encode(), None, 21, "keys should be strings"),
    ("null-cluster",
     _edit(BASE, "cluster:\n  partitions:", "cluster: null\nold:\n  partitions:").encode(),
     "cluster", 4, "valid dictionary"),
]

# the catalogue and this host's paths: well-formed files `plan`/`serve` would still fail on
CHECK_CASES = [
    ("unknown-architecture", _edit(BASE, "architecture: qwen3-8b", "architecture: qwen-99t"),
     "models[0].architecture", 17, "not in the performance model's catalogue"),
    ("unknown-gpu-type", _edit(BASE, "gpu_types: [v100]\n      price: {v100: 0.8}",
                               "gpu_types: [v900]\n      price: {v900: 0.8}"),
     "cluster.partitions[1].gpu_types", 10, "GPU type 'v900'"),
    ("unknown-model-gpu", _edit(BASE, "    slo:", "    gpu_types: [tpu9]\n    slo:"),
     "models[0].gpu_types", 20, "GPU type 'tpu9'"),
    ("impossible-slo", _edit(BASE, "ttft_s: 2, tpot_s: 0.05", "ttft_s: 0.001, tpot_s: 0.0001"),
     "models[0].slo", 20, "no layout meets"),
    ("db-path-directory", _edit(BASE, "db_path: /tmp/coral.db", "db_path: /tmp"),
     "db_path", 3, "is a directory"),
    ("db-path-under-file", _edit(BASE, "db_path: /tmp/coral.db", f"db_path: {REPO}/README.md/x.db"),
     "db_path", 3, "is not a directory"),
    ("db-path-unwritable", _edit(BASE, "db_path: /tmp/coral.db", "db_path: /proc/1/coral.db"),
     "db_path", 3, "not writable"),
    ("state-dir-a-file", _edit(BASE, "state_dir: /tmp/coral-state", f"state_dir: {REPO}/README.md"),
     "state_dir", 2, "not a directory"),
]


def _run(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=True)


def _assert_refused(result, path: Path, field, line, phrase, outcome: str) -> None:
    output = result.output
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in output, output
    lines = [ln for ln in output.splitlines() if ln.startswith(str(path))]
    wanted = [ln for ln in lines if field is None or f": {field}: " in ln]
    assert wanted, f"no line names {field!r}: {output}"
    if line is not None:
        prefix = rf"{re.escape(str(path))}:{line}: "
        assert any(re.match(prefix, ln) for ln in wanted), (line, output)
    assert any(phrase.lower() in ln.lower() for ln in wanted), (phrase, output)
    assert output.rstrip().endswith(outcome), output


@pytest.mark.parametrize("case", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_hostile_text_is_refused_by_validate(case, tmp_path: Path):
    _, content, field, line, phrase = case
    path = tmp_path / "models.yaml"
    path.write_bytes(content)
    started = time.monotonic()
    result = _run(["validate", str(path)])
    elapsed = time.monotonic() - started
    _assert_refused(result, path, field, line, phrase, "nothing was changed")
    # bounded work: the alias bomb took 12 s before; a 1 MiB file parses in well under this
    assert elapsed < 5.0, elapsed
    assert not Path("/tmp/coral-pwned").exists()


@pytest.mark.parametrize("case", CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_catalogue_and_path_problems_are_refused_by_validate(case, tmp_path: Path):
    _, text, field, line, phrase = case
    path = tmp_path / "models.yaml"
    path.write_text(text)
    _assert_refused(_run(["validate", str(path)]), path, field, line, phrase, "nothing was changed")


@pytest.mark.parametrize("case", [TEXT_CASES[0], TEXT_CASES[6], TEXT_CASES[23], TEXT_CASES[28],
                                  CHECK_CASES[3], CHECK_CASES[4]],
                         ids=lambda c: c[0])
def test_serve_refuses_with_the_same_message_before_starting(case, tmp_path: Path):
    _, content, field, line, phrase = case
    path = tmp_path / "models.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    _assert_refused(_run(["serve", str(path)]), path, field, line, phrase, "nothing was started")


def test_base_passes_every_check(tmp_path: Path):
    path = tmp_path / "models.yaml"
    path.write_text(BASE)
    result = _run(["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output


@pytest.mark.parametrize("special", ["fifo", "dev-zero", "directory"])
def test_special_files_are_refused_without_reading(special, tmp_path: Path):
    """Run as the user would (a subprocess with a deadline): a FIFO hung `validate` forever and
    /dev/zero was read until memory ran out."""
    if special == "fifo":
        path = tmp_path / "models.yaml"
        os.mkfifo(path)
        kind = "FIFO (named pipe)"
    elif special == "dev-zero":
        path, kind = Path("/dev/zero"), "character device"
    elif special == "dev-urandom":
        path, kind = Path("/dev/urandom"), "character device"
    else:
        path, kind = tmp_path, "directory"
    for command in ("validate", "serve"):
        run = subprocess.run(
            [sys.executable, "-c", "from coral_hpc.cli import main; main()", command, str(path)],
            check=False, capture_output=True, text=True, timeout=60, cwd=REPO,
        )
        assert run.returncode == 2, (command, run.returncode, run.stderr)
        assert "Traceback" not in run.stderr
        assert f"{path}: is a {kind}, not a regular file" in run.stderr, run.stderr


def test_random_corruptions_never_escape_as_anything_but_config_errors():
    """Byte-level mutations of a valid file: each either loads or raises ConfigError."""
    rng = random.Random(16)
    original = BASE.encode()
    alphabet = b"\x00\x07\t\n\r :-[]{}&*!|>'\"#%@`,?\xff\xc3" + bytes(range(32, 127))
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(400):
        data = bytearray(original)
        for _ in range(rng.randint(1, 6)):
            spot = rng.randrange(len(data))
            action = rng.random()
            if action < 0.4:
                data[spot] = rng.choice(alphabet)
            elif action < 0.7:
                data[spot:spot] = bytes([rng.choice(alphabet)]) * rng.randint(1, 40)
            else:
                del data[spot:spot + rng.randint(1, 20)]
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            continue  # covered through load_deployment in the invalid-utf8 case
        try:
            parse_deployment(text, "fuzz.yaml")
            outcomes["loaded"] += 1
        except ConfigError as exc:
            assert exc.problems and all(p.startswith("fuzz.yaml") for p in exc.problems)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100  # the mutations did reach the validator


def test_paths_that_load_are_unchanged_for_read_only_commands(tmp_path: Path):
    """`status`/`cost` still load a file whose db_path is not writable here (another host's
    disk): only validate and serve check this host's paths."""
    path = tmp_path / "models.yaml"
    path.write_text(_edit(BASE, "db_path: /tmp/coral.db", "db_path: /proc/1/coral.db"))
    assert load_deployment(path).db_path == "/proc/1/coral.db"
