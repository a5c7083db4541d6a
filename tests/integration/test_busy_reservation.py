"""A reservation for this user on the local cluster made busy by another lab: with every other
GPU held, ``serve`` plans on the reservation's node and submits there with ``--reservation``
(submitit), and a heterogeneous replica placed in it is a hetjob whose every component names
it. Real ``scontrol create reservation`` (deleted after), real Slurm jobs, the sim engine."""

from __future__ import annotations

import getpass
import os
import secrets
import subprocess
import time
from contextlib import contextmanager

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.launch.spec import replica_spec
from coral_hpc.launch.submit import submit_replica
from coral_hpc.slurm import make_client
from coral_hpc.types import ReplicaLayout, StageLayout
from harness import busy_cluster
from tests.conftest import wait_until
from tests.integration.test_busy_cluster import config_copy, some_model_ready
from tests.support.serve_harness import ServeProcess, tagged_jobs

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(env, other_lab):
    """The integration tests' environment over this process's own, the other lab ready."""
    return {**os.environ, **env}


@contextmanager
def reservation(env: dict, nodes: tuple[str, ...]):
    """An active 15-minute reservation for this user on ``nodes`` (waited for to be idle); its
    name. Deleted after, whatever happened."""
    name = f"coral-test-{secrets.token_hex(3)}"
    wait_until(lambda: all(n.free == n.gpus for n in busy_cluster.gpu_nodes() if n.name in nodes),
               90, f"{', '.join(nodes)} idle")
    subprocess.run(["scontrol", "create", "reservation", f"ReservationName={name}",
                    "StartTime=now", "Duration=00:15:00", f"Nodes={','.join(nodes)}",
                    f"Users={getpass.getuser()}"],
                   check=True, capture_output=True, text=True, env=env, timeout=30)
    try:
        yield name
    finally:
        # our jobs in it first: Slurm refuses to delete a reservation jobs still run in
        def in_it() -> list[str]:
            return subprocess.run(["squeue", "-h", "-R", name, "-o", "%i"], capture_output=True,
                                  text=True, env=env, timeout=30).stdout.split()

        ids = in_it()
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, env=env, timeout=30)
            # until Slurm has let them go (COMPLETING ones too), not a fixed 3 s; never raising
            # here, where it would hide the test's own failure
            deadline = time.monotonic() + 60
            while in_it() and time.monotonic() < deadline:
                time.sleep(0.2)
        subprocess.run(["scontrol", "delete", f"ReservationName={name}"], capture_output=True,
                       env=env, timeout=30)


def test_serve_plans_on_the_users_reservation_when_every_other_gpu_is_held(tmp_path, env):
    with reservation(env, ("v100-02",)) as reserved:
        _serve_in(tmp_path, env, reserved)


def _serve_in(tmp_path, env, reserved: str) -> None:
    others = busy_cluster.fill_every_gpu(240, [n for n in busy_cluster.gpu_nodes()
                                               if n.name != "v100-02"])
    # RUNNING, not just listed: while they are PENDING a plan sees their GPUs free
    wait_until(lambda: busy_cluster.other_jobs_running(others.values()), 30,
               "the other lab's jobs running")
    config = config_copy(tmp_path, models="qwen3-8b")
    serve = ServeProcess.cli(env, config, tmp_path)
    try:
        jobs = wait_until(lambda: [j for j in tagged_jobs(env, serve.deployment)
                                   if j.state == "RUNNING"], 60, "a replica running")
        assert all(j.reservation == reserved and j.nodes == ("v100-02",) for j in jobs), [
            (j.job_id, j.reservation, j.nodes) for j in jobs]
        wait_until(lambda: some_model_ready(env, config), 60,
                   "the replica in the reservation READY")
    finally:
        serve.close()


def test_a_hetjob_replica_in_the_reservation_names_it_in_every_component(tmp_path, env):
    # a pipeline over a v100 and an a100 node, both in the reservation: a hetjob (two
    # partitions) whose every component must name it to run on those nodes
    with reservation(env, ("v100-02", "a100-02")) as reserved:
        deployment = load_deployment(config_copy(tmp_path, models="qwen3-8b"))
        layout = ReplicaLayout(1, (StageLayout("v100", "v100", 18, reserved),
                                   StageLayout("a100", "a100", 18, reserved)), "half")
        spec = replica_spec(deployment, "qwen3-8b", f"r{secrets.token_hex(4)}",
                            "qwen3-8b.tp1.v100-18.a100-18", layout, api_key_file=None,
                            time_limit_s=600)  # within the window, as the plan clips it
        client = make_client("cli", env=env)
        job_id = submit_replica(spec, client)
        try:
            def both_running():
                out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%v|%N"],
                                     capture_output=True, text=True, env=env, timeout=30).stdout
                rows = [line.split("|") for line in out.splitlines() if line.strip()]
                return rows if len(rows) == 2 and all(r[1] == "RUNNING" for r in rows) else None

            rows = {r[0]: r for r in wait_until(both_running, 60, "both components running")}
            assert rows[f"{job_id}+0"][2:] == [reserved, "v100-02"], rows
            assert rows[f"{job_id}+1"][2:] == [reserved, "a100-02"], rows
            (job,) = [j for j in client.snapshot(deployment.deployment).jobs
                      if j.job_id == job_id]
            assert [c.reservation for c in job.components] == [reserved, reserved]
            assert job.tag is not None and job.tag.replica_id == spec.replica_id
        finally:
            client.cancel([job_id])
