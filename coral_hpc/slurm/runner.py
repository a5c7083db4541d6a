"""The one seam where coral-hpc runs Slurm commands: argv lists, timeouts, typed errors, retries
with backoff for transient failures, a count of calls per command kind (the observe bench
checks one call per kind per cycle), and the charge of every call to the daemon's one Slurm call
budget (``coral_hpc.slurm.budget``) when it has one."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.errors import (
    SlurmMisconfigured,
    SlurmNotInstalled,
    SlurmTimeout,
    SlurmUnavailable,
    classify,
    config_file_problem,
)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    stdout: str
    stderr: str
    #: seconds the command took (Slurm's answer time, as seen from here)
    seconds: float


def command_kind(argv: Sequence[str]) -> str:
    """``["scontrol", "show", "node", "-o"]`` → ``"scontrol show node"``; ``["squeue", ...]`` →
    ``"squeue"``; ``["sacctmgr", "-n", "-P", "show", "qos", ...]`` → ``"sacctmgr show qos"``."""
    if not argv:
        return "?"
    words = [argv[0]]
    if argv[0] in ("scontrol", "sacctmgr"):
        rest = [a for a in argv[1:] if not a.startswith("-")]
        words.extend(rest[:2])
    return " ".join(words)


class CommandRunner:
    """Runs Slurm commands. ``env`` defaults to this process's environment (``SLURM_CONF``
    included); ``sleep`` is injectable so tests of the retry policy need not wait; every command
    run (retries too) is charged to ``budget`` when one is given."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        attempts: int = 3,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        budget: CallBudget | None = None,
    ):
        self.budget = budget
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.sleep = sleep
        #: calls per command kind since the last :meth:`reset_counters`
        self.calls: Counter[str] = Counter()
        #: seconds spent waiting for Slurm since the last :meth:`reset_counters`
        self.slurm_seconds = 0.0

    def reset_counters(self) -> None:
        self.calls = Counter()
        self.slurm_seconds = 0.0

    def run(
        self,
        argv: Sequence[str],
        *,
        retry: bool = True,
        timeout_s: float | None = None,
        extra_env: Mapping[str, str] | None = None,
        ok_returncodes: tuple[int, ...] = (0,),
    ) -> CommandResult:
        """Run ``argv``; return its output, or raise a typed SlurmError. Transient failures are
        retried ``attempts`` times with doubling backoff when ``retry`` is True (pass False for
        commands that must not run twice, such as sbatch after a timeout)."""
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                return self._run_once(argv, timeout_s, extra_env, ok_returncodes)
            except SlurmUnavailable:
                if not retry or attempt == self.attempts:
                    raise
                self.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _run_once(
        self,
        argv: Sequence[str],
        timeout_s: float | None,
        extra_env: Mapping[str, str] | None,
        ok_returncodes: tuple[int, ...],
    ) -> CommandResult:
        env = self.env if self.env is not None else dict(os.environ)
        if extra_env:
            env = {**env, **extra_env}
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        misconfigured = config_file_problem(argv, env)
        if misconfigured is not None:
            raise misconfigured  # fail fast: Slurm itself would wait 60 s to say the same
        self.calls[command_kind(argv)] += 1
        if self.budget is not None:
            self.budget.spend(1, probe=tuple(argv[:2]) == ("sbatch", "--test-only"))
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                list(argv), check=False, capture_output=True, text=True, timeout=timeout, env=env,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise SlurmNotInstalled(f"{argv[0]}: command not found (is Slurm installed?)", argv) from None
        except subprocess.TimeoutExpired as exc:
            self.slurm_seconds += time.perf_counter() - started
            said = _text(exc.stderr)
            known = classify(argv, -1, said) if said.strip() else None
            if isinstance(known, SlurmMisconfigured):
                raise known from None  # Slurm said why (a broken slurm.conf): no retry helps
            last = said.strip().splitlines()[-1].strip() if said.strip() else ""
            raise SlurmTimeout(f"{argv[0]}: no answer within {timeout:g} s"
                               + (f"; it said: {last}" if last else ""), argv, None,
                               said) from None
        seconds = time.perf_counter() - started
        self.slurm_seconds += seconds
        if proc.returncode not in ok_returncodes:
            raise classify(argv, proc.returncode, proc.stderr)
        return CommandResult(tuple(argv), proc.stdout, proc.stderr, seconds)


def _text(output: str | bytes | None) -> str:
    """What a timed-out command had written (``TimeoutExpired`` may hold bytes)."""
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output
