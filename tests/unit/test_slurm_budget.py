"""The one Slurm call budget (coral_hpc.slurm.budget): the bucket, the runner's charge of every
command, and the reconcile loop waiting for it."""

from __future__ import annotations

import pytest

from coral_hpc.daemon.loop import Loop
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.runner import CommandRunner
from tests.support.virtual_time import VirtualClock, VirtualStop


def test_at_most_the_budget_in_any_minute_with_the_probes_share_kept_while_probing():
    clock = VirtualClock()
    budget = CallBudget(30, probe_calls_per_min=6, clock=clock)
    assert budget.wait_s(3) == 0.0
    assert budget.cycle_spacing_s(3) == pytest.approx(6.0)  # not probing: 30 a minute
    for _ in range(10):  # ten observe cycles at once fill the minute
        budget.spend(3)
    assert budget.wait_s(3) == pytest.approx(60.0)  # no room until the first ones age out
    assert not budget.has_room(1)
    clock.now += 60
    assert budget.wait_s(3) == 0.0 and budget.has_room(30)
    # probing: the observe cycles leave the probes' unspent share free, and space out to 24/min
    budget.spend(1, probe=True)
    assert budget.cycle_spacing_s(3) == pytest.approx(7.5)
    for _ in range(8):
        budget.spend(3)
    assert budget.wait_s(3) > 0  # 25 used + 3 + 5 kept for the probes > 30
    assert budget.has_room(5) and not budget.has_room(6)  # the probes still fit
    budget.spend(5, probe=True)  # the whole share spent: only the 30-call cap remains
    assert not budget.has_room(1)
    assert (budget.spent, budget.probes) == (30 + 1 + 24 + 5, 6)
    # two minutes without a probe: the share is the observe cycles' again
    clock.now += 121
    assert budget.wait_s(3) == 0.0 and budget.cycle_spacing_s(3) == pytest.approx(6.0)
    with pytest.raises(ValueError):
        CallBudget(0)
    with pytest.raises(ValueError):
        CallBudget(6, probe_calls_per_min=6)


def test_every_command_the_runner_runs_is_charged_failures_included():
    budget = CallBudget(30)
    runner = CommandRunner(budget=budget)
    runner.run(["true"])
    runner.run(["false"], ok_returncodes=(0, 1))
    assert budget.spent == 2
    assert sum(runner.calls.values()) == 2


def _observe_and_probe(budget: CallBudget, clock: VirtualClock, steps: list[float]):
    def step() -> None:  # an observe cycle (3 calls) plus, every 60 s, six probes at once
        steps.append(clock.now)
        budget.spend(3)
        if len(steps) == 1 or clock.now - steps[0] >= 60 * (sum(1 for _ in probes) + 1):
            budget.spend(6, probe=True)
            probes.append(clock.now)
    probes: list[float] = []
    return step, probes


def _busiest_minute(events: list[tuple[float, int]]) -> int:
    return max(sum(n for u, n in events if t <= u < t + 60) for t, _ in events)


def test_the_reconcile_loop_waits_for_the_budget_instead_of_overspending():
    clock = VirtualClock()
    budget = CallBudget(30, probe_calls_per_min=6, clock=clock)
    calls: list[tuple[float, int]] = []
    original = budget.spend

    def spend(n: int = 1, *, probe: bool = False) -> None:
        calls.append((clock.now, n))
        original(n, probe=probe)

    budget.spend = spend  # type: ignore[method-assign]
    steps: list[float] = []
    step, probes = _observe_and_probe(budget, clock, steps)
    stop = VirtualStop(clock, until=clock.now + 600)
    Loop("reconcile", 6.0, step, stop, pace=budget.observe_pace, monotonic=clock).run()
    assert len(probes) >= 9  # the probes ran every minute
    assert _busiest_minute(calls) <= 30
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert min(gaps) >= 6.0  # never faster than the poll interval
    assert max(gaps) <= 7.5 + 1e-6  # and no probe burst pushes a cycle back beyond 24/min

    # without the pace the same loop overspends: the checks above can fail
    clock2 = VirtualClock()
    budget2 = CallBudget(30, probe_calls_per_min=6, clock=clock2)
    calls.clear()
    original = budget2.spend
    budget2.spend = spend  # type: ignore[method-assign]
    clock = clock2  # noqa: F841 (spend() reads the clock it closed over)
    steps2: list[float] = []
    step2, _ = _observe_and_probe(budget2, clock2, steps2)
    Loop("reconcile", 6.0, step2, VirtualStop(clock2, clock2.now + 600), monotonic=clock2).run()
    assert budget2.spent > 30 * 10 + 6


def test_probes_must_leave_the_observe_cycle_part_of_the_budget():
    from pydantic import ValidationError

    from coral_hpc.config import SlurmSettings

    assert SlurmSettings().calls_per_min is None
    SlurmSettings(calls_per_min=9, probe_calls_per_min=6)
    with pytest.raises(ValidationError, match="probe_calls_per_min"):
        SlurmSettings(calls_per_min=8, probe_calls_per_min=6)


def test_the_default_budget_is_30_at_the_default_poll_and_follows_a_faster_one(tmp_path):
    from coral_hpc.config import load_deployment, slurm_calls_per_min

    def deployment(policy: str = "{}", slurm: str = "{}"):
        path = tmp_path / "models.yaml"
        path.write_text(f"""
deployment: budget
state_dir: {tmp_path}
db_path: {tmp_path / 'coral.db'}
cluster:
  partitions: [{{name: a100}}]
  slurm: {slurm}
policy: {policy}
engine: {{kind: sim}}
models:
  - {{name: m, source: Qwen/Qwen3-8B, architecture: qwen3-8b,
      mix: {{input_tokens: 512, output_tokens: 128}}, demand: {{requests_per_s: 1}},
      slo: {{ttft_s: 2.0, tpot_s: 0.1}}}}
""")
        return load_deployment(path)

    assert slurm_calls_per_min(deployment()) == 30
    # a site that asks for a 2 s poll has asked for three times the calls
    assert slurm_calls_per_min(deployment("{poll_interval_s: 2}")) == 90
    assert slurm_calls_per_min(deployment("{poll_interval_s: 12}")) == 30
    # a stated budget wins: the poll then stretches to keep to it
    assert slurm_calls_per_min(deployment("{poll_interval_s: 2}", "{calls_per_min: 20}")) == 20
