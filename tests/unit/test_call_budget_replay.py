"""The daemon keeps to its one Slurm call budget on a big, busy cluster — observe cycles and
start-estimate probes together — replayed from real recorded output.

``tests/data/slurm/big-22.05.json.gz`` is the big local cluster (``scripts/dev-cluster up
--big``: 256 nodes, five GPU types, overlapping partitions, >= 5,000 jobs of two other labs) as
the CLI client's own commands answered it (``tests/data/slurm/record-big.py``). A real daemon
(real CLI client parsing those answers, real planner probing start estimates, the reconcile
loop paced by the budget) runs for several minutes of virtual time: one model fits the free
nodes, the other only the full h100 partition, so every re-plan asks Slurm when it would start.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment, slurm_calls_per_min
from coral_hpc.daemon.core import Daemon
from coral_hpc.plan.planner import Planner
from coral_hpc.slurm import CliSlurmClient, CommandRunner
from coral_hpc.slurm.availability import StartProber
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.errors import classify
from coral_hpc.slurm.runner import CommandResult, command_kind
from coral_hpc.store import open_store
from harness.daemon_setup import big_cluster_yaml
from tests.support.virtual_time import VirtualClock, VirtualStop

RECORDING = Path(__file__).resolve().parents[1] / "data" / "slurm" / "big-22.05.json.gz"
MINUTES = 5


def _key(argv) -> tuple:  # type: ignore[no-untyped-def]
    """A probe is matched by its shape (partition, GRES, nodes); any other command exactly."""
    if argv[:2] == ["sbatch", "--test-only"] or tuple(argv[:2]) == ("sbatch", "--test-only"):
        wanted = [a for a in argv if a.startswith("--gres=")]
        return ("test-only", argv[argv.index("-p") + 1], *wanted, argv[argv.index("-N") + 1])
    return tuple(argv)


class ReplayRunner(CommandRunner):
    """Answers every command from the recording, charging the budget as the real runner does,
    and logs (virtual time, command kind) of each call."""

    def __init__(self, recording: dict, budget: CallBudget, clock):  # type: ignore[no-untyped-def]
        super().__init__(budget=budget)
        self.answers = {_key(c["argv"]): c for c in recording["commands"]}
        # an empty answer (this user's queue was empty) reads the same whatever the format:
        # it also answers the command with another field list (a format changed since)
        self.empty = {command_kind(c["argv"]): c for c in recording["commands"]
                      if not c["stdout"].strip() and not c["rc"]}
        self.clock = clock
        self.log: list[tuple[float, str]] = []

    def _run_once(self, argv, timeout_s, extra_env, ok_returncodes):  # type: ignore[no-untyped-def]
        kind = command_kind(argv)
        self.calls[kind] += 1
        assert self.budget is not None
        self.budget.spend(1)
        self.log.append((self.clock(), kind))
        answer = self.answers.get(_key(list(argv))) or self.empty.get(kind)
        if answer is None:
            raise AssertionError(f"not recorded: {list(argv)} (re-run "
                                 "tests/data/slurm/record-big.py on scripts/dev-cluster up --big)")
        if answer["rc"]:
            raise classify(argv, answer["rc"], answer["stderr"])
        return CommandResult(tuple(argv), answer["stdout"], answer["stderr"], 0.0)


def _run(tmp_path: Path, paced: bool) -> tuple[ReplayRunner, float]:
    recording = json.loads(gzip.decompress(RECORDING.read_bytes()))
    clock = VirtualClock(recording["recorded_at"])
    deployment = load_deployment(big_cluster_yaml(tmp_path, "budget-replay"))
    slurm = deployment.cluster.slurm
    budget = CallBudget(slurm_calls_per_min(deployment),
                        probe_calls_per_min=slurm.probe_calls_per_min,
                        clock=clock)
    runner = ReplayRunner(recording, budget, clock)
    client = CliSlurmClient(runner, user="root", clock=clock)
    prober = StartProber(client, calls_per_min=slurm.probe_calls_per_min,
                         ttl_s=deployment.policy.replan_interval_s, clock=clock,
                         budget=budget if paced else None)
    planner = Planner(cache_dir=tmp_path / "stage1", probe=True, prober=prober)
    store = open_store(deployment.db_path)
    # may_act=False: the steady state of a daemon whose plan waits on Slurm (nothing to submit
    # the recording could answer); observe, plan and probe run as in serve
    daemon = Daemon(deployment, store, client, planner, api_key_file=None,
                    table_path=tmp_path / "routes.json", clock=clock, may_act=lambda: False,
                    budget=budget if paced else None)
    start = clock.now
    try:
        loop = daemon.loops(VirtualStop(clock, start + 60 * MINUTES), monotonic=clock)[0]
        loop.run()
    finally:
        daemon.observer.close()
        store.close()
    return runner, start


def _per_minute(runner: ReplayRunner, start: float) -> list[Counter]:
    minutes = [Counter() for _ in range(MINUTES)]
    for at, kind in runner.log:
        index = int((at - start) // 60)
        if index < MINUTES:
            minutes[index][kind] += 1
    return minutes


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("paced"), paced=True)


def test_the_recording_is_a_big_busy_cluster():
    recording = json.loads(gzip.decompress(RECORDING.read_bytes()))
    assert recording["nodes"] >= 256
    others = sum(n for key, n in recording["jobs_by_user_state_reason"].items()
                 if not key.startswith("root|"))
    assert others >= 5000
    assert {"a100", "v100", "l40s", "h100", "a100-80g", "ampere", "gpu"} <= set(
        recording["partitions"])


def test_observe_and_probes_together_keep_to_30_calls_a_minute(paced):
    runner, start = paced
    minutes = _per_minute(runner, start)
    probes = sum(m["sbatch"] for m in minutes)
    # probes did run: every re-plan asked when the h100 replica would start
    assert probes >= MINUTES * 3, minutes
    assert sum(m["scontrol show node"] for m in minutes) >= MINUTES * 6  # observed throughout
    for index, minute in enumerate(minutes[1:], start=1):  # the first holds the cold cycle
        assert sum(minute.values()) <= 30, (index, minute)
    assert sum(sum(m.values()) for m in minutes) <= 30 * MINUTES + 4  # + one saved-up burst


def test_without_the_budget_the_same_daemon_overspends(tmp_path, paced):
    runner, start = _run(tmp_path, paced=False)
    minutes = _per_minute(runner, start)
    assert any(sum(m.values()) > 30 for m in minutes[1:]), minutes
