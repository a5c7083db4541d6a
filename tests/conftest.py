"""Shared fixtures. Integration tests (marker ``slurm``) run against the local cluster that
``scripts/dev-cluster up`` starts; without it they are skipped with the reason.

Tests that depend on the wall clock (sleeps, deadlines, request rates, durations) run on hosts
several times faster or slower than the author's, with other work on the same two cores. So:

- Name the resource a timing assumes (Slurm's scheduling pass, the daemon's cycle, the engine's
  token rate, this host's cores) in a comment beside it.
- Wait on the event, not the clock: :func:`wait_until` on what the code under test shows (the
  engine's running gauge, the gateway's log line, the product's own sacct query), never a sleep
  that assumes an order of events. A check that something does *not* happen runs over counted
  cycles or requests (``tests.support.serve_harness.wait_cycles``), not over seconds.
- What depends on the host's speed (a rate meant to overload, a latency bound, how long a step
  may take) scales with a measurement made in the same run, never a constant tuned on one host.
- A deadline only bounds a failure: generous, naming what was awaited and the last value seen.
  Never widen a tolerance to make a test pass; find what it assumed instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.wait import wait_until  # noqa: F401 (the tests import it from here)

REPO = Path(__file__).resolve().parent.parent
DEV_SLURM_CONF = "/var/tmp/coral-dev-cluster/etc/slurm.conf"
LOG_DIR = Path("/tmp/coral-test-slurm-logs")


# The commands size their tables to COLUMNS, and rich reads it once, when a console is made (at
# import): a size inherited from the shell that runs pytest, or from pytest-xdist (which sets
# COLUMNS in its workers), must not change what a test reads. A test that wants a width sets one
# itself (CliRunner's env, a subprocess's env).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


def _slurm_env() -> dict[str, str]:
    env = dict(os.environ)
    if "SLURM_CONF" not in env and Path(DEV_SLURM_CONF).exists():
        env["SLURM_CONF"] = DEV_SLURM_CONF
    return env


def slurm_answers() -> str | None:
    """None when a Slurm controller answers, else the reason it does not."""
    if shutil.which("scontrol") is None:
        return "Slurm client commands are not installed (run scripts/dev-cluster up)"
    try:
        out = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=10, env=_slurm_env()
        )
    except subprocess.TimeoutExpired:
        return "scontrol ping timed out"
    if "UP" not in out.stdout:
        return f"no Slurm controller answers: {out.stdout.strip() or out.stderr.strip()}"
    return None


class SlurmRunner:
    """Runs Slurm commands for tests and remembers every job submitted, to cancel them all."""

    def __init__(self) -> None:
        self.env = _slurm_env()
        self.job_ids: list[str] = []

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=60, env=self.env, check=check
        )

    def sbatch(self, *args: str) -> str:
        # Without -o Slurm writes slurm-<id>.out into the working directory (the checkout):
        # send job output to a scratch folder unless the test asked for a file.
        if not any(a in ("-o", "--output") or a.startswith("--output=") for a in args):
            LOG_DIR.mkdir(parents=True, exist_ok=True)
            args = ("--output", str(LOG_DIR / "slurm-%j.out"), *args)
        out = self.run("sbatch", "--parsable", *args)
        job_id = out.stdout.strip().split(";")[0]
        self.job_ids.append(job_id)
        return job_id

    def track(self, job_id: str | int) -> None:
        self.job_ids.append(str(job_id))

    def cancel_all(self) -> None:
        if self.job_ids:
            self.run("scancel", *self.job_ids, check=False)


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """The environment for talking to the local cluster; skips when none answers."""
    reason = slurm_answers()
    if reason:
        pytest.skip(f"local Slurm cluster unavailable: {reason}")
    return _slurm_env()


@pytest.fixture
def slurm(slurm_cluster: dict[str, str]):
    """A :class:`SlurmRunner` that cancels every job the test submitted at teardown."""
    runner = SlurmRunner()
    yield runner
    runner.cancel_all()


@pytest.fixture
def node_restorer(slurm: SlurmRunner):
    """Resume any node or partition a test drained or set down, even when the test fails."""
    touched_nodes: list[str] = []
    touched_partitions: list[str] = []

    class Restorer:
        def drain_node(self, node: str, reason: str = "coral-test") -> None:
            touched_nodes.append(node)
            slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

        def set_partition(self, partition: str, state: str) -> None:
            touched_partitions.append(partition)
            slurm.run("scontrol", "update", f"PartitionName={partition}", f"State={state}")

    yield Restorer()
    for node in touched_nodes:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    for partition in touched_partitions:
        slurm.run("scontrol", "update", f"PartitionName={partition}", "State=UP", check=False)
