"""The one Slurm call budget (coral_hpc.slurm.budget): the bucket, the runner's charge of every
command, and the reconcile loop waiting for it."""

from __future__ import annotations

import threading

import pytest

from coral_hpc.daemon.core import Loop
from coral_hpc.slurm.budget import OBSERVE_CYCLE_CALLS, CallBudget
from coral_hpc.slurm.runner import CommandRunner


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class VirtualStop(threading.Event):
    """A stop event whose waits pass virtual time, set once ``until`` is reached."""

    def __init__(self, clock: Clock, until: float):
        super().__init__()
        self.clock, self.until = clock, until

    def is_set(self) -> bool:
        return self.clock.now >= self.until

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return self.is_set()


def test_the_bucket_refills_at_its_rate_and_saves_up_no_more_than_a_burst():
    clock = Clock()
    budget = CallBudget(30, clock=clock)  # one call every 2 s
    assert budget.tokens() == pytest.approx(OBSERVE_CYCLE_CALLS + 1)
    budget.spend(3)
    assert budget.tokens() == pytest.approx(1)
    assert budget.wait_s(3) == pytest.approx(4.0)  # two calls missing at 0.5 a second
    clock.now += 4
    assert budget.wait_s(3) == pytest.approx(0.0)
    clock.now += 3600  # an idle hour saves up one burst, not 1,800 calls
    assert budget.tokens() == pytest.approx(OBSERVE_CYCLE_CALLS + 1)
    budget.spend(10)  # acts are never refused: the bucket goes below zero
    assert budget.tokens() == pytest.approx(-6)
    assert budget.wait_s(3) == pytest.approx(18.0)
    assert budget.spent == 13
    with pytest.raises(ValueError):
        CallBudget(0)


def test_every_command_the_runner_runs_is_charged_failures_included():
    budget = CallBudget(30)
    runner = CommandRunner(budget=budget)
    runner.run(["true"])
    runner.run(["false"], ok_returncodes=(0, 1))
    assert budget.spent == 2
    assert sum(runner.calls.values()) == 2


def test_the_reconcile_loop_waits_for_the_budget_instead_of_overspending():
    clock = Clock()
    budget = CallBudget(30, clock=clock)
    steps: list[float] = []

    def step() -> None:  # an observe cycle (3 calls) plus, every 60 s, six probes
        steps.append(clock.now)
        budget.spend(3)
        if len(steps) % 10 == 1:
            budget.spend(6)

    stop = VirtualStop(clock, until=clock.now + 600)
    Loop("reconcile", 6.0, step, stop, pace=lambda: budget.wait_s(OBSERVE_CYCLE_CALLS),
         monotonic=clock).run()
    minutes = 10
    assert budget.spent <= 30 * minutes + OBSERVE_CYCLE_CALLS + 1
    # the probes' share came out of the observe cycles: fewer than one every 6 s
    assert len(steps) < minutes * 10
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert min(gaps) >= 6.0  # never faster than the poll interval

    # without the pace the same loop overspends: the check above can fail
    clock2 = Clock()
    budget2 = CallBudget(30, clock=clock2)
    steps.clear()

    def step2() -> None:
        steps.append(clock2.now)
        budget2.spend(3)
        if len(steps) % 10 == 1:
            budget2.spend(6)

    Loop("reconcile", 6.0, step2, VirtualStop(clock2, clock2.now + 600), monotonic=clock2).run()
    assert budget2.spent > 30 * minutes + OBSERVE_CYCLE_CALLS + 1


def test_probes_must_leave_the_observe_cycle_part_of_the_budget():
    from pydantic import ValidationError

    from coral_hpc.config import SlurmSettings

    assert SlurmSettings().calls_per_min == 30
    SlurmSettings(calls_per_min=9, probe_calls_per_min=6)
    with pytest.raises(ValidationError, match="probe_calls_per_min"):
        SlurmSettings(calls_per_min=8, probe_calls_per_min=6)
