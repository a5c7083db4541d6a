"""Issue 28 item 2: a login node is multi-user. The state folder, the database's folder, the
logs and every file in them are the service account's alone (folders 0700, files 0600), and
``serve`` refuses (exit 2) a state or database folder others could write. Before this they
followed the umask (0644 files, 0755 folders) and nothing checked who could write there."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.daemon import ensure_replica_key
from coral_hpc.daemon.lease import Lease
from coral_hpc.gateway.table import RoutingTable, write_routing_table
from coral_hpc.instance import ensure_instance
from coral_hpc.launch.entrypoint import _setup_logging, _write_script
from coral_hpc.store import open_store
from tests.unit.launch_cases import case_spec
from tests.unit.test_config import BASE

OTHER_USER = "coral-other"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def no_daemon(monkeypatch):
    """A refusal that does not happen must fail here, not start a daemon that submits jobs to
    whatever Slurm this machine reaches."""
    def started(*args, **kwargs):
        raise AssertionError("serve started the daemon instead of refusing")

    monkeypatch.setattr("coral_hpc.daemon.serve", started)


@pytest.fixture(autouse=True)
def loose_umask():
    """The umask most login shells have: what coral-hpc creates must not depend on it."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_what_the_daemon_writes_is_private(tmp_path: Path):
    state = tmp_path / "state" / "dep"
    store = open_store(tmp_path / "db" / "coral.db")
    store.add_event(0.0, "start", "x")  # the WAL file too
    store.close()
    key = ensure_replica_key(state / "gateway" / "replica.key")
    ensure_instance(state, "dep")
    Lease(state, "dep").acquire()
    write_routing_table(state / "gateway" / "routes.json", RoutingTable(1, {"m": ()}))
    for folder in (tmp_path / "db", tmp_path / "state", state, key.parent):
        assert _mode(folder) == 0o700, folder
    files = [p for p in [*(tmp_path / "db").iterdir(), *state.rglob("*")] if p.is_file()]
    assert any(p.name == "coral.db" for p in files) and any(p.name == "routes.json" for p in files)
    for file in files:
        assert _mode(file) == 0o600, file


def test_what_a_replica_job_writes_is_private(tmp_path: Path):
    spec = case_spec("single", "sim", state_path=str(tmp_path / "state" / "dep"))
    log_path = _setup_logging(spec, "7", 0)
    log_path.parent.joinpath("x").touch()  # as the engine's own log would be, under the job's umask
    script = _write_script(spec, "7", 0, 0, "echo\n")
    for path in (log_path.parent, script.parent, spec.replica_dir):
        assert _mode(path) == 0o700, path
    assert _mode(script) == 0o600


def test_replica_jobs_set_a_private_umask():
    spec = case_spec("hetero", "sim")
    from coral_hpc.launch.render import render_hetjob

    assert "\numask 077\n" in render_hetjob(spec, Path("/s/spec.json"))


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(BASE.replace("/tmp/coral-state", str(tmp_path / "state"))
                    .replace("/tmp/coral.db", str(tmp_path / "db" / "coral.db")))
    return path


@pytest.mark.parametrize(("folder", "mode", "field"), [
    ("state", 0o777, "state_dir"), ("state", 0o770, "state_dir"), ("state/t", 0o757, "state_dir"),
    ("db", 0o775, "db_path"),
])
def test_serve_refuses_state_others_may_write(tmp_path: Path, folder: str, mode: int, field: str):
    config = _config(tmp_path)
    path = tmp_path / folder
    path.mkdir(parents=True)
    path.chmod(mode)
    result = CliRunner().invoke(cli, ["serve", str(config)], catch_exceptions=True)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f": {field}: " in result.output and f"`chmod 700 {path}`" in result.output, \
        result.output
    assert result.output.rstrip().endswith("nothing was started"), result.output
    assert not (tmp_path / "db" / "coral.db").exists()


def test_serve_refuses_a_state_folder_of_another_user(tmp_path: Path, monkeypatch):
    config = _config(tmp_path)
    (tmp_path / "state").mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 4242)
    result = CliRunner().invoke(cli, ["serve", str(config)], catch_exceptions=True)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "not by this user" in result.output, result.output


def _other_user_exists() -> bool:
    try:
        return subprocess.run(["id", OTHER_USER], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not _other_user_exists() or os.geteuid() != 0 or not shutil.which("runuser"),
                    reason=f"needs root and a second local user {OTHER_USER}")
def test_another_user_cannot_read_the_state_folder():
    # a folder the other user may enter (pytest's tmp_path is private to this user already)
    base = Path(tempfile.mkdtemp(prefix="coral-private-"))
    try:
        base.chmod(0o755)
        state = base / "state" / "dep"
        ensure_replica_key(state / "gateway" / "replica.key")
        write_routing_table(state / "gateway" / "routes.json", RoutingTable(1, {"m": ()}))
        (base / "public").mkdir()
        (base / "public").chmod(0o755)

        def as_other(*argv: str) -> int:
            return subprocess.run(["runuser", "-u", OTHER_USER, "--", *argv],
                                  capture_output=True, timeout=30).returncode

        assert as_other("ls", str(base / "public")) == 0  # the check itself works
        assert as_other("ls", str(base / "state")) != 0
        assert as_other("cat", str(state / "gateway" / "replica.key")) != 0
        assert as_other("cat", str(state / "gateway" / "routes.json")) != 0
        assert as_other("touch", str(base / "state" / "forged")) != 0
    finally:
        shutil.rmtree(base)
