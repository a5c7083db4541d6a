"""Snapshot rules (free GPUs, node groups, own jobs, JSON round trip) and the CLI client's
command discipline, on recorded Slurm 22.05 output replayed through the runner seam (an
unexpected command fails the test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coral_hpc.slurm.build import node_state
from coral_hpc.slurm.cli_backend import CliSlurmClient
from coral_hpc.slurm.errors import classify
from coral_hpc.slurm.runner import CommandResult, CommandRunner, command_kind
from coral_hpc.slurm.snapshot import ClusterSnapshot, JobShape, end_kind
from tests.support.virtual_time import VirtualClock

REC = Path(__file__).resolve().parents[1] / "data" / "slurm" / "22.05"


class ReplayRunner(CommandRunner):
    """Answers each command kind with recorded output; anything unexpected raises."""

    def __init__(self, answers: dict[str, str | list[str]]):
        super().__init__()
        self.answers = {k: list(v) if isinstance(v, list) else [v] for k, v in answers.items()}
        self.argvs: list[list[str]] = []

    def _run_once(self, argv, timeout_s, extra_env, ok_returncodes):
        kind = command_kind(argv)
        self.calls[kind] += 1
        self.argvs.append(list(argv))
        if kind not in self.answers:
            raise AssertionError(f"unexpected Slurm command {argv}")
        queue = self.answers[kind]
        name = queue.pop(0) if len(queue) > 1 else queue[0]
        stdout = (REC / name).read_text() if (REC / name).exists() else ""
        stderr_path = REC / f"{name}.stderr"
        stderr = stderr_path.read_text() if stderr_path.exists() else ""
        rc_path = REC / f"{name}.rc"
        rc = int(rc_path.read_text().strip() or 0) if rc_path.exists() else 0
        if rc != 0:
            raise classify(argv, rc, stderr)
        return CommandResult(tuple(argv), stdout, stderr, 0.0)


GPU_MEMORY = {"a100": 40.0, "a100-80g": 80.0, "v100": 32.0}.get

OBSERVE = {
    "sinfo": "version.txt",
    "scontrol show node": "scontrol_show_node.txt",
    "scontrol show partition": "scontrol_show_partition.txt",
    "squeue": "squeue_own.txt",
    "sacctmgr show assoc": "sacctmgr_assoc.txt",
    "sacctmgr show qos": "sacctmgr_qos.txt",
    "scontrol show reservation": "scontrol_show_reservation_none.txt",
}


def client(answers=None, clock=None) -> tuple[CliSlurmClient, ReplayRunner]:
    runner = ReplayRunner(answers or OBSERVE)
    return CliSlurmClient(runner, user="root", gpu_memory=GPU_MEMORY, clock=clock or VirtualClock(), sleep=lambda s: None), runner


def test_one_call_per_command_kind_per_cycle_and_limits_cached():
    clock = VirtualClock()
    c, runner = client(clock=clock)
    c.snapshot("dep1")
    assert dict(runner.calls) == {k: 1 for k in OBSERVE}
    runner.reset_counters()
    clock.now += 10
    c.snapshot("dep1")  # version and limits are cached
    assert dict(runner.calls) == {"scontrol show node": 1, "scontrol show partition": 1, "squeue": 1}
    runner.reset_counters()
    clock.now += c.limits_ttl_s
    c.snapshot("dep1")
    assert runner.calls["sacctmgr show assoc"] == 1


def test_free_gpus_drained_draining_and_down_are_zero():
    snap = client()[0].snapshot("dep1")
    nodes = {n.name: n for n in snap.nodes}
    assert nodes["a100-02"].state == "drained" and nodes["a100-02"].gpus_free == 0
    assert nodes["v100-02"].state in ("drained", "draining") and nodes["v100-02"].gpus_free == 0
    for node in snap.nodes:
        if node.usable:
            assert node.gpus_free == node.gpus_total - node.gpus_alloc
    down = client({**OBSERVE, "scontrol show node": "scontrol_show_node_down.txt"})[0].snapshot("dep1")
    v100_02 = down.node("v100-02")
    assert v100_02.state == "down" and v100_02.gpus_free == 0 and not v100_02.usable


def test_node_groups_count_each_node_once_despite_overlapping_partitions():
    snap = client()[0].snapshot("dep1")
    grouped = [n for g in snap.node_groups for n in g.nodes]
    assert sorted(grouped) == sorted(n.name for n in snap.nodes if n.gpus_total)
    by_type = {g.gpu_type: g for g in snap.node_groups}
    assert by_type["a100"].gpus_per_node == 4 and by_type["a100"].gpu_memory_gb == 40.0
    assert by_type["a100-80g"].gpus_per_node == 8 and set(by_type["a100"].partitions) == {"a100", "gpu"}
    assert sum(g.gpus_per_node * len(g.nodes) for g in snap.node_groups) == 24
    assert snap.partition("gpu").gpu_types == ("a100", "a100-80g", "v100")


def test_own_jobs_only_and_expected_start():
    snap = client()[0].snapshot("dep1")
    assert snap.jobs and all(j.tag.deployment == "dep1" for j in snap.jobs)
    assert not any(j.name == "somebody" for j in snap.jobs)
    pending = [j for j in snap.jobs if j.state == "PENDING" and j.reason == "Resources"]
    assert pending and all(j.expected_start for j in pending)
    assert snap.limits.qos == "normal" and snap.observed_at == 1000.0


def test_snapshot_json_round_trip():
    snap = client()[0].snapshot("dep1")
    text = snap.to_json()
    data = json.loads(text)
    for key in ("slurm_version", "partitions", "nodes", "jobs"):
        assert key in data
    assert {"name", "state", "nodes", "gpu_types", "max_time_s", "billing_weights"} <= set(data["partitions"][0])
    assert {"name", "state", "partitions", "gpu_type", "gpus_total", "gpus_free"} <= set(data["nodes"][0])
    again = ClusterSnapshot.from_json(text)
    assert again == snap
    with pytest.raises(ValueError, match="nodes"):
        ClusterSnapshot.from_dict({k: v for k, v in data.items() if k != "nodes"})


def test_billing_for_uses_partition_weights():
    snap = client()[0].snapshot("dep1")
    gpu = snap.partition("gpu")
    assert gpu.billing_for(2, "a100", cpus=8, mem_gb=64) == pytest.approx(2 * 3.0 + 8 * 0.05 + 64 * 0.01)
    assert gpu.billing_for(2, "v100", cpus=0, mem_gb=0) == pytest.approx(2.4)


@pytest.mark.parametrize(
    "words, state",
    [(["IDLE"], "idle"), (["MIXED"], "mixed"), (["IDLE", "DRAIN"], "drained"),
     (["MIXED", "DRAIN"], "draining"), (["ALLOCATED", "DRAIN"], "draining"), (["DOWN"], "down"),
     (["DOWN*"], "down"), (["IDLE*"], "down"), (["DOWN", "DRAIN"], "down"),
     (["IDLE", "MAINT"], "maint"), (["IDLE~"], "powered_down"), (["IDLE", "RESERVED"], "reserved"),
     (["FUTURE"], "future"), ([], "unknown")],
)
def test_node_states(words, state):
    assert node_state(words) == state


def test_end_kinds_told_apart():
    assert end_kind("PREEMPTED") == "preempted"
    assert end_kind("NODE_FAIL") == "node_fail"
    assert end_kind("TIMEOUT") == "timeout"
    assert end_kind("CANCELLED by 0") == "cancelled"
    assert end_kind("RUNNING") is None and end_kind(None) is None


def test_job_states_fall_back_to_sacct_and_admit_lag():
    c, runner = client({"squeue": "squeue_job_states.txt", "sacct": "sacct_job_states.txt"})
    squeue_ids = ["50", "53", "63"]
    states = c.job_states(squeue_ids + ["60", "999999"])
    assert states["50"].source == "squeue" and states["50"].state == "RUNNING"
    assert states["63"].end_kind == "timeout"
    assert states["60"].source == "sacct" and states["60"].state == "COMPLETED"
    assert states["999999"].state is None and states["999999"].source == "none"
    assert dict(runner.calls) == {"squeue": 1, "sacct": 1}


def test_job_states_when_squeue_knows_none():
    c, _runner = client({"squeue": "squeue_bad_job.txt", "sacct": "sacct_job_states.txt"})
    states = c.job_states(["61"])
    assert states["61"].state == "FAILED" and states["61"].source == "sacct"


def test_test_only_argv_and_estimate():
    c, runner = client({"sbatch": "sbatch_test_only.txt"})
    est = c.test_only(JobShape("a100-80g", 8, "a100-80g", time_limit_s=3600))
    assert est.partition == "a100-80g" and est.nodes == ("a100-80g-01",)
    argv = runner.argvs[-1]
    assert "--test-only" in argv and "--gres=gpu:a100-80g:8" in argv and "--time=60" in argv


def test_cancel_ignores_jobs_already_gone_and_signals_full():
    c, runner = client({"scancel": "scancel_bad_job.txt"})
    c.cancel(["99999999"], signal="TERM")
    assert runner.argvs[-1] == ["scancel", "--signal=TERM", "--full", "99999999"]
