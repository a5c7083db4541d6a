"""Issue 16, Why-1: one daemon per deployment wherever it is started.

Before: the same models.yaml started from another working directory got a second daemon (paths
resolved against the cwd); two copies of the file in two directories adopted and cancelled each
other's replicas (69 jobs in 80 s); a job whose spec.json could not be read was adopted with its
layout unknown and stalled the daemon.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.core import Daemon
from coral_hpc.daemon.lease import (
    RENEW_S,
    STALE_AFTER_S,
    Lease,
    LeaseHeld,
    holder,
    lease_file,
    read_lease,
)
from coral_hpc.daemon.stop_request import StopRequests, request_stop
from coral_hpc.instance import InstanceError, ensure_instance, read_instance
from coral_hpc.launch.spec import replica_spec
from coral_hpc.plan.desired import DesiredPlan
from coral_hpc.plan.planner import PlanOutcome
from coral_hpc.reconcile.act import Actor
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.slurm.snapshot import JobInfo
from coral_hpc.store import open_store
from coral_hpc.types import JobTag, ReplicaLayout, StageLayout
from tests.conftest import REPO
from tests.fakes.slurm import FakeSlurm, recorded_snapshot
from tests.support.virtual_time import VirtualClock

EXAMPLE = REPO / "examples" / "models.yaml"
NOW = 50_000.0


# ------------------------------------------------------------------ paths


def test_the_same_file_from_any_working_directory_names_the_same_paths(tmp_path: Path):
    copy = tmp_path / "site" / "models.yaml"
    copy.parent.mkdir()
    shutil.copy(EXAMPLE, copy)
    seen = set()
    for cwd in (tmp_path, copy.parent, Path("/")):
        out = subprocess.run(
            [sys.executable, "-c", ("import sys; from coral_hpc.config import load_deployment as l;"
                                    " d = l(sys.argv[1]); print(d.state_dir, d.db_path)"),
             os.path.relpath(copy, cwd)],
            cwd=cwd, capture_output=True, text=True, check=True)
        seen.add(out.stdout.strip())
    assert seen == {f"{copy.parent}/.state/shared {copy.parent}/.state/daemon/demo.db"}


@pytest.mark.parametrize("example", ["models.yaml", "vllm-cpu.yaml"])
def test_two_copies_in_two_folders_are_two_instances(tmp_path: Path, example: str):
    """Issue 27.5: each example keeps its state beside itself, so two copies in two sibling
    folders never share a database or a state folder (``../.state`` made them share one)."""
    states, dbs = [], []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(REPO / "examples" / example, tmp_path / name / example)
        deployment = load_deployment(tmp_path / name / example)
        assert Path(deployment.db_path).is_relative_to(tmp_path / name)
        assert deployment.state_path.is_relative_to(tmp_path / name)
        states.append(deployment.state_path)
        dbs.append(deployment.db_path)
    assert states[0] != states[1] and dbs[0] != dbs[1]
    ids = {ensure_instance(p, "demo") for p in states}
    assert len(ids) == 2


def test_relative_paths_in_models_yaml_resolve_against_its_folder(tmp_path: Path, monkeypatch):
    """Issue 29c: profiles_dir (and every other path) means the file's folder, not the working
    directory: from examples/, `plan vllm-cpu.yaml` found no profiles and planned nothing."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "hf-token").write_text("hf_x\n")
    (site / "hf-token").chmod(0o600)
    text = (REPO / "examples" / "vllm-cpu.yaml").read_text()
    text = text.replace("engine:\n", "engine:\n  hf_token_file: hf-token\n  hf_home: hf\n", 1)
    (site / "vllm-cpu.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    deployment = load_deployment("site/vllm-cpu.yaml")
    assert deployment.measured_profiles_path == site / "vllm-cpu.profiles"
    assert deployment.engine.hf_token_file == str(site / "hf-token")
    assert deployment.engine.hf_home == str(site / "hf")
    # the repository's example finds its measured profiles from any working directory
    monkeypatch.chdir(REPO / "examples")
    example = load_deployment("vllm-cpu.yaml")
    assert example.measured_profiles_path == REPO / "examples" / "vllm-cpu.profiles"
    assert any(example.measured_profiles_path.iterdir())


def test_instance_is_created_once_and_read_back(tmp_path: Path):
    assert read_instance(tmp_path) is None
    first = ensure_instance(tmp_path, "demo")
    assert ensure_instance(tmp_path, "demo") == first == read_instance(tmp_path)
    (tmp_path / "instance.json").write_text("garbage")
    with pytest.raises(InstanceError, match="instance.json"):
        read_instance(tmp_path)


def test_tags_carry_the_instance_through_the_comment():
    tag = JobTag("demo", "qwen3-8b", "r1", "t1", "0123456789ab")
    assert "instance=0123456789ab" in tag.comment()
    assert JobTag.from_comment(tag.comment()) == tag
    old = JobTag("demo", "qwen3-8b", "r1", "t1")
    assert JobTag.from_comment(old.comment()).instance == ""


# ------------------------------------------------------------------ the lease


def test_a_second_daemon_is_refused_naming_the_first(tmp_path: Path):
    clock = VirtualClock(NOW)
    first = Lease(tmp_path, "demo", clock=clock, host="login1", pid=4242)
    assert first.acquire(sleep=lambda s: None) is None
    second = Lease(tmp_path, "demo", clock=clock, host="login2", pid=777)
    with pytest.raises(LeaseHeld) as info:
        second.acquire(sleep=lambda s: None)
    assert "host login1 (pid 4242" in str(info.value)
    clock.now += STALE_AFTER_S - 1  # not yet stale
    with pytest.raises(LeaseHeld):
        second.acquire(sleep=lambda s: None)


def test_renewal_keeps_it_and_a_stale_lease_is_taken_over_after_the_stated_time(tmp_path: Path):
    clock = VirtualClock(NOW)
    first = Lease(tmp_path, "demo", clock=clock, host="login1", pid=4242)
    first.acquire(sleep=lambda s: None)
    second = Lease(tmp_path, "demo", clock=clock, host="login2", pid=777)
    for _ in range(20):  # renewed every RENEW_S: never stale
        clock.now += RENEW_S
        assert first.renew()
        with pytest.raises(LeaseHeld):
            second.acquire(sleep=lambda s: None)
    clock.now += STALE_AFTER_S + 1  # the first stopped renewing (host gone, SIGSTOP)
    taken = second.acquire(sleep=lambda s: None)
    assert taken["host"] == "login1" and taken["pid"] == 4242
    assert not first.renew(force=True)  # the old holder learns it lost the lease
    assert not first.ours() and second.ours()


def test_a_dead_pid_on_this_host_is_taken_over_at_once(tmp_path: Path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    clock = VirtualClock(NOW)
    Lease(tmp_path, "demo", clock=clock, pid=dead.pid).acquire(sleep=lambda s: None)  # kill -9
    assert holder(tmp_path, clock()) is None
    taken = Lease(tmp_path, "demo", clock=clock).acquire(sleep=lambda s: None)
    assert taken["pid"] == dead.pid and taken["host"] == socket.gethostname()


def test_release_frees_it_for_anyone(tmp_path: Path):
    clock = VirtualClock(NOW)
    lease = Lease(tmp_path, "demo", clock=clock, host="login1", pid=1)
    lease.acquire(sleep=lambda s: None)
    lease.publish(gateway="127.0.0.1:8123")
    assert read_lease(lease_file(tmp_path))["gateway"] == "127.0.0.1:8123"
    lease.release()
    assert Lease(tmp_path, "demo", clock=clock, host="login2", pid=2).acquire(
        sleep=lambda s: None)["host"] == "login1"


def test_stop_requests_from_another_host_are_seen_once(tmp_path: Path):
    request_stop(tmp_path, "old leftover")
    os.utime(tmp_path / "stop-request.json", (1, 1))
    requests = StopRequests(tmp_path, since=NOW)
    assert requests.pending() is None  # a leftover from before the daemon started
    request_stop(tmp_path, "coral-hpc down")
    seen = requests.pending()
    assert seen is not None and "coral-hpc down" in seen
    assert requests.pending() is None


# ------------------------------------------------------------------ adoption


def _job(job_id: str, tag: JobTag) -> JobInfo:
    return JobInfo(
        job_id=job_id, tag=tag, name=tag.job_name(), state="RUNNING", reason=None,
        partition="a100", nodes=("a100-01",), num_nodes=1, submit_time=NOW - 100,
        start_time=NOW - 90, end_time=None, time_limit_s=7200, time_left_s=7000,
        expected_start=None, restarts=0, gpus=2, gpu_type="a100",
    )


def _daemon(tmp_path: Path, instance: str, slurm: FakeSlurm):
    deployment = load_deployment(EXAMPLE).model_copy(update={"state_dir": str(tmp_path / "shared")})
    store = open_store(tmp_path / f"{instance}.db")
    settings = ReconcileSettings.from_policy(deployment.policy)
    actor = Actor(deployment, store, slurm, settings, lambda: NOW, None,
                  submit=slurm.submit_spec, instance=instance)
    nothing = PlanOutcome(DesiredPlan(time=NOW, slots=()), 0.0, 0.0, "optimal")
    daemon = Daemon(deployment, store, slurm, lambda request: nothing, api_key_file=None,
                    table_path=tmp_path / "routes.json", clock=lambda: NOW, actor=actor,
                    instance=instance)
    return deployment, store, daemon


LAYOUT = ReplicaLayout(2, (StageLayout("a100", "a100", 36),), "auto")


def test_a_daemon_adopts_only_its_own_instance_and_leaves_unreadable_jobs_alone(tmp_path: Path):
    slurm = FakeSlurm(recorded_snapshot(), clock=lambda: NOW)
    deployment, store, daemon = _daemon(tmp_path, "aaaaaaaaaaaa", slurm)
    ours = replica_spec(deployment, "qwen3-8b", "r-ours", "t-ours", LAYOUT, api_key_file=None,
                        instance="aaaaaaaaaaaa")
    ours.write()
    slurm.add_job(_job("501", ours.tag))
    # the same deployment name from another folder: another instance
    slurm.add_job(_job("502", JobTag("demo", "qwen3-8b", "r-other", "t-ours", "bbbbbbbbbbbb")))
    # ours by tag, but its spec.json is gone (deleted, another checkout's state folder)
    slurm.add_job(_job("503", JobTag("demo", "qwen3-8b", "r-nospec", "t-ours", "aaaaaaaaaaaa")))
    # a job from before instances existed
    slurm.add_job(_job("504", JobTag("demo", "qwen3-8b", "r-legacy", "t-ours")))
    # the planner wants nothing: whatever the daemon owns it may drain and cancel
    for _ in range(3):
        daemon.reconcile_once()
    adopted = {r.job_id for r in store.replicas(live_only=False)}
    assert adopted == {"501"}
    cancelled = {job_id for job_id, _, _ in slurm.cancelled}
    assert cancelled <= {"501"}, f"cancelled a job it does not own: {cancelled}"
    left_alone = [e.message for e in store.events(limit=50) if e.kind == "foreign_job"]
    assert len(left_alone) == 3, left_alone  # each reported once, not every cycle
    assert any("502" in m and "another instance" in m for m in left_alone)
    assert any("503" in m and "cannot be read" in m for m in left_alone)
    # the planner does not count the others' GPUs as ours
    assert {j.job_id for j in daemon.last_observed.snapshot.jobs} == {"501"}
    store.close()


def test_a_job_from_before_instance_tags_is_adopted_when_its_spec_in_our_folder_says_so(
        tmp_path: Path):
    """Upgrading must not orphan the replicas serving then: a job whose tag names no instance
    is ours when its spec.json in our state folder names this deployment and replica and was
    written for this folder; one whose spec was written for another folder is left alone."""
    from dataclasses import replace as copy

    slurm = FakeSlurm(recorded_snapshot(), clock=lambda: NOW)
    deployment, store, daemon = _daemon(tmp_path, "aaaaaaaaaaaa", slurm)
    old = replica_spec(deployment, "qwen3-8b", "r-old", "t-old", LAYOUT, api_key_file=None)
    assert old.instance == "" and old.tag.instance == ""   # as every job before instances
    old.write()
    slurm.add_job(_job("601", old.tag))
    # a spec.json copied here from another state folder (another copy of the deployment)
    moved = copy(replica_spec(deployment, "qwen3-8b", "r-moved", "t-old", LAYOUT,
                              api_key_file=None), state_path=str(tmp_path / "elsewhere"))
    spec_file = deployment.state_path / "replicas" / "r-moved" / "spec.json"
    spec_file.parent.mkdir(parents=True)
    spec_file.write_text(moved.to_json())
    slurm.add_job(_job("602", moved.tag))
    for _ in range(2):
        daemon.reconcile_once()
    (adopted,) = store.replicas(live_only=False)
    assert (adopted.id, adopted.job_id, adopted.layout) == ("r-old", "601", LAYOUT)
    assert {j.job_id for j in daemon.last_observed.snapshot.jobs} == {"601"}
    assert "602" not in {job_id for job_id, _, _ in slurm.cancelled}
    left_alone = [e.message for e in store.events(limit=50) if e.kind == "foreign_job"]
    assert len(left_alone) == 1 and "602" in left_alone[0]
    store.close()


def test_logs_find_a_replica_by_job_id_without_the_database(tmp_path: Path):
    """From a login node other than the daemon's there is no database: the shared log folder
    alone answers for a replica id or a job id."""
    from coral_hpc.cli.logs import replica_logs

    for name in ("r1.4242.rank0.log", "r1.4242.rank1.log", "4242_0_log.out", "r2.99.rank0.log"):
        (tmp_path / name).write_text("x\n")
    by_job = [p.name for p in replica_logs(tmp_path, "4242", None)]
    assert by_job == ["4242_0_log.out", "r1.4242.rank0.log", "r1.4242.rank1.log"]
    assert [p.name for p in replica_logs(tmp_path, "r1", None)] == [
        "r1.4242.rank0.log", "r1.4242.rank1.log"]


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_measured_only_without_profiles_is_refused(tmp_path: Path, command: str):
    """Issue 29c: a measured_only deployment whose profiles_dir holds nothing planned nothing,
    exit 0 and no warning; `validate` called it valid. Now: exit 2 naming the folder."""
    from click.testing import CliRunner

    from coral_hpc.cli import cli

    text = (REPO / "examples" / "vllm-cpu.yaml").read_text()
    (tmp_path / "vllm-cpu.yaml").write_text(text)  # no vllm-cpu.profiles beside the copy
    result = CliRunner().invoke(cli, [command, str(tmp_path / "vllm-cpu.yaml")])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path}/vllm-cpu.profiles does not exist" in result.output
