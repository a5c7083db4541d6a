"""Replica jobs on the real local cluster, with the sim engine: submitit submission, the hetjob
path, the endpoint file, the API key, the GPUs Slurm hands out, and drain-on-SIGTERM without
requeue. Every job submitted is tracked by the `slurm` fixture and cancelled at teardown."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from coral_hpc.engine.vllm_metrics import fetch_engine_load
from coral_hpc.launch.endpoint import read_endpoint
from coral_hpc.launch.spec import ReplicaSpec, StageSpec
from coral_hpc.launch.stop import DRAIN_SIGNAL, stop_replicas
from coral_hpc.launch.submit import submit_replica
from coral_hpc.slurm import make_client
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

API_KEY = "sk-launch-test-7f3a"


@pytest.fixture
def client(slurm_cluster, monkeypatch):
    # submitit runs sbatch with this process's environment: point it at the local cluster too
    monkeypatch.setenv("SLURM_CONF", slurm_cluster["SLURM_CONF"])
    return make_client("cli", env=slurm_cluster)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "replica.key"
    path.write_text(API_KEY + "\n")
    path.chmod(0o600)
    return path


def _spec(tmp_path: Path, key_file: Path, replica_id: str, stages, tp=2, **extra) -> ReplicaSpec:
    return ReplicaSpec(
        deployment="launchtest",
        model="qwen3-8b",
        model_source="Qwen/Qwen3-8B",
        replica_id=replica_id,
        template_id="t0",
        stages=tuple(stages),
        tp=tp,
        engine_kind="sim",
        state_path=str(tmp_path / "state" / "launchtest"),
        time_limit_s=600,
        api_key_file=str(key_file),
        sim_arch="qwen3-8b",
        drain_timeout_s=20,
        **extra,
    )


def _get(url: str, key: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _slurm_job(slurm, job_id: str) -> dict[str, str]:
    out = slurm.run("scontrol", "show", "job", "-o", job_id).stdout
    fields: dict[str, str] = {}
    for line in out.splitlines():  # a hetjob prints one line per component
        for word in line.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
    return fields


def test_submitit_replica_serves_then_drains_without_requeue(slurm, client, tmp_path, key_file):
    spec = _spec(tmp_path, key_file, "sub-1", [StageSpec("a100", "a100", 2, 36)])
    job_id = submit_replica(spec, client)
    slurm.track(job_id)

    endpoint = wait_until(
        lambda: read_endpoint(spec.endpoint_file), 60, f"endpoint file of job {job_id}"
    )
    assert endpoint.job_id == job_id
    assert endpoint.replica_id == "sub-1" and endpoint.model == "qwen3-8b"
    # Slurm gave the job's task exactly the two GPUs it asked for
    assert len(endpoint.cuda_visible_devices.split(",")) == 2
    assert endpoint.node in ("a100-01", "a100-02")
    assert endpoint.ready_at >= endpoint.started_at

    status, body = _get(endpoint.url + "/v1/models", API_KEY)
    assert status == 200 and [m["id"] for m in body["data"]] == ["qwen3-8b"]
    assert _get(endpoint.url + "/v1/models", None)[0] == 401  # only key holders may use it
    assert _get(endpoint.url + "/v1/models", "wrong")[0] == 401

    job = _slurm_job(slurm, job_id)
    assert job["JobName"] == spec.tag.job_name()
    assert job["Requeue"] == "0"
    assert "gres/gpu:a100=2" in job["TRES"] or "gres/gpu=2" in job["TRES"]

    # the key never shows in the job's logs or rendered scripts
    for path in Path(spec.state_path).rglob("*"):
        if path.is_file() and path.suffix != ".pkl":
            assert API_KEY not in path.read_text(errors="replace"), path

    # a request in flight when the drain signal arrives still completes: the engine drains
    result: dict = {}

    def long_request() -> None:
        payload = json.dumps({"model": "qwen3-8b", "prompt": "hello", "max_tokens": 120}).encode()
        request = urllib.request.Request(
            endpoint.url + "/v1/completions", data=payload,
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                result["status"], result["body"] = resp.status, json.loads(resp.read())
        except OSError as exc:  # reported by the assertion below (URLError is an OSError)
            result["error"] = repr(exc)

    worker = threading.Thread(target=long_request)
    worker.start()
    # wait for the engine to hold the request (its own running gauge), not a fixed 0.5 s that
    # a slow host may not reach the engine in
    wait_until(lambda: "status" in result or "error" in result
               or ((load := fetch_engine_load(endpoint.url)) is not None and load.running + load.waiting >= 1),
               30, "the engine to report the long request held")
    assert not result, f"the request ended before the drain signal, nothing to drain: {result}"
    outcome = stop_replicas(client, [job_id], grace_s=40)
    worker.join(60)
    assert outcome == {job_id: "exited"}, "the replica ended by itself within the grace period"
    assert result.get("status") == 200, result
    assert result["body"]["usage"]["completion_tokens"] == 120

    final = wait_until(lambda: _finished(slurm, job_id), 30, f"job {job_id} to finish")
    assert final["JobState"] == "COMPLETED", final["JobState"]
    assert final["Restarts"] == "0" and final["Requeue"] == "0"
    assert not spec.endpoint_file.exists(), "a drained replica takes its endpoint down"
    log = (spec.logs_dir / f"sub-1.{job_id}.rank0.log").read_text()
    # stop_replicas sends DRAIN_SIGNAL (SIGUSR2: Slurm's SIGTERM would reach every vLLM process);
    # the entrypoint logs the signal it received and SIGTERMs the engine itself
    assert f"SIG{DRAIN_SIGNAL} received: draining" in log and "not requeueing" in log


def _finished(slurm, job_id: str) -> dict[str, str] | None:
    job = _slurm_job(slurm, job_id)
    return job if job.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None


def test_hetjob_replica_spans_a100_and_v100_and_writes_its_endpoint(
    slurm, client, tmp_path, key_file
):
    spec = _spec(
        tmp_path, key_file, "het-1",
        [StageSpec("a100", "a100", 2, 20), StageSpec("v100", "v100", 2, 16)],
        dtype="half",
    )  # fmt: skip
    assert spec.layout.kind == "hetero"
    job_id = submit_replica(spec, client)
    slurm.track(job_id)

    endpoint = wait_until(
        lambda: read_endpoint(spec.endpoint_file), 60, f"endpoint file of hetjob {job_id}"
    )
    assert endpoint.job_id == job_id
    assert endpoint.node.startswith("a100-")  # stage 0 (the API) runs on the a100 component
    assert len(endpoint.cuda_visible_devices.split(",")) == 2
    status, body = _get(endpoint.url + "/v1/models", API_KEY)
    assert status == 200 and body["data"][0]["id"] == "qwen3-8b"

    worker_log = spec.logs_dir / f"het-1.{job_id}.rank1.log"
    text = wait_until(lambda: worker_log.exists() and worker_log.read_text(), 30, "worker log")
    assert "on v100-" in text  # stage 1 runs on the v100 component
    lines = slurm.run("scontrol", "show", "job", "-o", job_id).stdout.splitlines()
    partitions = sorted(w.split("=", 1)[1] for l in lines for w in l.split() if w.startswith("Partition="))
    assert partitions == ["a100", "v100"]

    outcome = stop_replicas(client, [job_id], grace_s=40)
    assert outcome == {job_id: "exited"}
    wait_until(lambda: not spec.endpoint_file.exists(), 20, "the endpoint file to go")
    assert "not requeueing" in (spec.logs_dir / f"het-1.{job_id}.rank0.log").read_text()


def test_two_node_replica_runs_one_entrypoint_per_node(slurm, client, tmp_path, key_file):
    """A homogeneous pipeline goes through submitit with one task per node: rank 0 serves,
    rank 1 joins it from the other a100 node, and both stop on the grace signal."""
    spec = _spec(
        tmp_path, key_file, "two-1",
        [StageSpec("a100", "a100", 1, 18), StageSpec("a100", "a100", 1, 18)], tp=1,
    )  # fmt: skip
    assert spec.layout.kind == "multinode"
    job_id = submit_replica(spec, client)
    slurm.track(job_id)
    endpoint = wait_until(lambda: read_endpoint(spec.endpoint_file), 60, "the endpoint file")
    assert _get(endpoint.url + "/v1/models", API_KEY)[0] == 200
    worker_log = spec.logs_dir / f"two-1.{job_id}.rank1.log"
    text = wait_until(lambda: worker_log.exists() and worker_log.read_text(), 30, "worker log")
    other = "a100-02" if endpoint.node == "a100-01" else "a100-01"
    assert f"rank 1/2 on {other}" in text and "joining head" in text

    assert stop_replicas(client, [job_id], grace_s=40) == {job_id: "exited"}
    assert "stopping the worker" in worker_log.read_text()
    assert not spec.endpoint_file.exists()
