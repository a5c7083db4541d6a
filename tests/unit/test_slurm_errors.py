"""The one classification table: every recorded Slurm failure maps to its error class, and the
runner turns timeouts, missing commands and transient failures into typed errors (retrying the
transient ones with backoff)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from coral_hpc.errors import PermanentError, TransientError
from coral_hpc.slurm.errors import (
    SlurmCommandError,
    SlurmJobNotFound,
    SlurmMisconfigured,
    SlurmNotInstalled,
    SlurmRejected,
    SlurmTimeout,
    SlurmUnavailable,
    classify,
)
from coral_hpc.slurm.runner import CommandRunner, command_kind

REC = Path(__file__).resolve().parents[1] / "data" / "slurm" / "22.05"


def recorded(name: str) -> tuple[list[str], int, str]:
    stderr = (REC / f"{name}.stderr").read_text()
    rc = int((REC / f"{name}.rc").read_text().strip() or 1)
    return [name.split("_")[0]], rc, stderr


@pytest.mark.parametrize(
    "name",
    ["unreachable_scontrol_show_node_o.txt", "unreachable_scontrol_show_partition_o.txt",
     "unreachable_squeue_h.txt", "unreachable_sbatch_wrap_true.txt", "unreachable_scancel_1.txt",
     "unreachable_sacct.txt", "unreachable_sacctmgr.txt"],
)
def test_unreachable_controller_or_slurmdbd_is_transient(name):
    argv, rc, stderr = recorded(name)
    error = classify(argv, rc or 1, stderr)
    assert isinstance(error, SlurmUnavailable) and isinstance(error, TransientError)
    assert error.stderr == stderr and error.argv == argv


@pytest.mark.parametrize(
    "name, reason",
    [("sbatch_bad_partition.txt", "invalid partition"), ("sbatch_bad_account.txt", "invalid account"),
     ("sbatch_bad_qos.txt", "invalid QOS"), ("sbatch_bad_gres.txt", "no node has this configuration"),
     ("sbatch_too_many_gpus.txt", "no node has this configuration"),
     ("sbatch_partition_drain.txt", "partition drained or inactive")],
)
def test_refusals_are_permanent(name, reason):
    argv, rc, stderr = recorded(name)
    error = classify(argv, rc, stderr)
    assert type(error) is SlurmRejected and isinstance(error, PermanentError)
    assert reason in str(error)


def test_unknown_job_is_its_own_class():
    argv, rc, stderr = recorded("squeue_bad_job.txt")
    error = classify(argv, rc, stderr)
    assert isinstance(error, SlurmJobNotFound) and isinstance(error, PermanentError)


def test_unknown_failure_is_surfaced_not_retried():
    error = classify(["sinfo"], 2, "sinfo: error: something new happened\n")
    assert type(error) is SlurmCommandError and isinstance(error, PermanentError)
    assert "something new happened" in str(error)


def test_command_kinds():
    assert command_kind(["scontrol", "show", "node", "-o"]) == "scontrol show node"
    assert command_kind(["sacctmgr", "-n", "-P", "show", "qos", "where"]) == "sacctmgr show qos"
    assert command_kind(["squeue", "-h"]) == "squeue"


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-slurm-command"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_runner_timeout_is_transient_and_counted(tmp_path):
    runner = CommandRunner(timeout_s=0.2, attempts=1)
    with pytest.raises(SlurmTimeout) as info:
        runner.run([_script(tmp_path, "sleep 5\n")])
    assert isinstance(info.value, TransientError)
    assert sum(runner.calls.values()) == 1 and runner.slurm_seconds >= 0.2


def test_runner_missing_command(tmp_path):
    with pytest.raises(SlurmNotInstalled):
        CommandRunner().run([str(tmp_path / "no-such-sinfo")])


def test_runner_retries_transient_with_backoff_then_succeeds(tmp_path):
    """A real process that fails like an unreachable slurmctld twice, then answers."""
    counter = tmp_path / "count"
    script = _script(
        tmp_path,
        f'n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}\n'
        'if [ $n -lt 3 ]; then echo "slurm_load_jobs error: Unable to contact slurm controller '
        '(connect failure)" >&2; exit 1; fi\necho ok\n',
    )
    sleeps: list[float] = []
    runner = CommandRunner(attempts=3, backoff_s=0.5, sleep=sleeps.append)
    assert runner.run([script]).stdout == "ok\n"
    assert sleeps == [0.5, 1.0]
    counter.unlink()
    with pytest.raises(SlurmUnavailable):
        CommandRunner(attempts=2, backoff_s=0.1, sleep=sleeps.append).run([script])


def test_runner_does_not_retry_when_told_or_when_permanent(tmp_path):
    counter = tmp_path / "count"
    script = _script(
        tmp_path,
        f'echo x >> {counter}\necho "sbatch: error: Batch job submission failed: Invalid qos '
        'specification" >&2\nexit 1\n',
    )
    with pytest.raises(SlurmRejected):
        CommandRunner(attempts=3, sleep=lambda s: None).run([script])
    assert counter.read_text().count("x") == 1


def test_runner_passes_extra_env_not_argv(tmp_path):
    script = _script(tmp_path, 'echo "$CORAL_TEST_SECRET"\n')
    out = CommandRunner(env={"PATH": os.environ["PATH"]}).run([script], extra_env={"CORAL_TEST_SECRET": "s3"})
    assert out.stdout == "s3\n" and "s3" not in " ".join(out.argv)


def test_accounting_disabled_is_a_permanent_refusal_that_says_so():
    # recorded: sacct with AccountingStorageType=accounting_storage/none in slurm.conf
    argv, rc, stderr = recorded("sacct_accounting_disabled.txt")
    error = classify(argv, rc, stderr)
    assert type(error) is SlurmRejected and isinstance(error, PermanentError)
    assert "accounting" in str(error) and "disabled" in str(error)


# ------------------------------------------------------------ a slurm.conf retrying cannot fix
# issue 29d: with a bad SLURM_CONF, `coral-hpc cluster` waited 93 s (sinfo retries a missing
# file for 60 s; the runner's 30 s timeout was retried three times) and printed "no answer
# within 30 s", not sinfo's own message.


def test_a_broken_slurm_conf_is_permanent_in_slurms_words():
    # recorded: sinfo with SLURM_CONF naming a file of garbage
    argv, rc, stderr = recorded("sinfo_bad_conf.txt")
    error = classify(argv, rc, stderr)
    assert type(error) is SlurmMisconfigured and isinstance(error, PermanentError)
    assert "Unable to process configuration file" in str(error)


def test_a_missing_slurm_conf_fails_at_once_without_running_slurm(tmp_path):
    runner = CommandRunner(env={"PATH": os.environ["PATH"],
                                "SLURM_CONF": str(tmp_path / "slurm.conf")}, attempts=3)
    with pytest.raises(SlurmMisconfigured) as info:
        runner.run(["sinfo"])
    assert f"cannot stat file {tmp_path / 'slurm.conf'}: No such file or directory" in str(
        info.value)
    assert sum(runner.calls.values()) == 0  # nothing ran, nothing to retry


def test_a_timed_out_command_that_said_its_config_is_missing_is_not_retried(tmp_path):
    """Slurm's own retry loop outlasts the runner's timeout: what it wrote so far (recorded)
    decides, and it is shown."""
    said = (REC / "sinfo_missing_conf.txt.stderr").read_text().splitlines()[0]
    assert "cannot stat file" in said
    script = _script(tmp_path, f"echo '{said}' >&2\nsleep 5\n")
    sleeps: list[float] = []
    runner = CommandRunner(timeout_s=0.5, attempts=3, sleep=sleeps.append)
    with pytest.raises(SlurmMisconfigured) as info:
        runner.run([script])
    assert "cannot stat file /nonexistent/slurm.conf" in str(info.value)
    assert sum(runner.calls.values()) == 1 and sleeps == []


def test_a_plain_timeout_shows_what_the_command_said(tmp_path):
    script = _script(tmp_path, "echo 'sinfo: error: slow' >&2\nsleep 5\n")
    with pytest.raises(SlurmTimeout, match="it said: sinfo: error: slow"):
        CommandRunner(timeout_s=0.5, attempts=1).run([script])
