"""The job-side entrypoint with real processes (the sim engine, real HTTP), outside Slurm: health
before the endpoint, secrets only in the engine's environment, drain on SIGTERM and SIGUSR2,
retry on a taken port, a crash reported as a failure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from coral_hpc.launch import entrypoint
from coral_hpc.launch.endpoint import read_endpoint
from coral_hpc.launch.spec import ReplicaSpec, StageSpec
from tests.conftest import wait_until

KEY = "sk-entrypoint-5150"


def _spec(tmp_path: Path) -> ReplicaSpec:
    key = tmp_path / "key"
    key.write_text(KEY)
    key.chmod(0o600)
    return ReplicaSpec(
        deployment="ut",
        model="qwen3-8b",
        model_source="Qwen/Qwen3-8B",
        replica_id="e1",
        template_id="t",
        stages=(StageSpec("a100", "a100", 1, 36),),
        tp=1,
        engine_kind="sim",
        state_path=str(tmp_path / "state"),
        time_limit_s=600,
        api_key_file=str(key),
        python=sys.executable,
        sim_arch="qwen3-8b",
        drain_timeout_s=15,
        health_timeout_s=60,
    )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def _start(spec: ReplicaSpec) -> subprocess.Popen:
    spec_file = spec.write()
    return subprocess.Popen(
        [sys.executable, "-m", "coral_hpc.launch.entrypoint", str(spec_file)],
        env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _models(url: str, key: str | None) -> int:
    request = urllib.request.Request(url + "/v1/models")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_serves_after_health_then_drains_on_signal(tmp_path, sig):
    spec = _spec(tmp_path)
    proc = _start(spec)
    try:
        endpoint = wait_until(lambda: read_endpoint(spec.endpoint_file), 30, "the endpoint file")
        assert endpoint.job_id.startswith("local")
        assert _models(endpoint.url, KEY) == 200
        assert _models(endpoint.url, None) == 401

        # the key is in the engine's environment, never in its argv nor in any file we wrote
        argv = Path(f"/proc/{endpoint.pid}/cmdline").read_bytes().split(b"\0")
        assert b"coral_hpc.engine.sim" in argv and not any(KEY.encode() in a for a in argv)
        environ = Path(f"/proc/{endpoint.pid}/environ").read_bytes().split(b"\0")
        assert f"VLLM_API_KEY={KEY}".encode() in environ
        for path in Path(spec.state_path).rglob("*"):
            if path.is_file():
                assert KEY not in path.read_text(errors="replace"), path

        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert not spec.endpoint_file.exists()
        with pytest.raises(OSError):  # the engine is gone, not left behind
            os.kill(endpoint.pid, 0)
        log = (spec.logs_dir / f"e1.{endpoint.job_id}.rank0.log").read_text()
        assert f"{sig.name} received: draining the engine" in log
        assert "not requeueing" in log
    finally:
        if proc.poll() is None:
            proc.kill()


def test_taken_port_is_retried_on_another(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    spec.write()
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    with socket.socket() as probe:  # a port free right now for the second attempt
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    ports = iter([taken, free])
    monkeypatch.setattr(entrypoint, "pick_port", lambda rng: next(ports))
    entrypoint._setup_logging(spec, "t1", 0)
    stop = entrypoint.StopFlag()

    def stop_when_ready() -> None:
        wait_until(lambda: read_endpoint(spec.endpoint_file), 30, "the endpoint file")
        stop.signal_name = "SIGINT"
        stop.event.set()

    watcher = threading.Thread(target=stop_when_ready)
    watcher.start()
    try:
        result = entrypoint._run_head(spec, "t1", stop)
    finally:
        busy.close()
        watcher.join(30)
    assert result["port"] == free and result["ready"]
    log = (spec.logs_dir / "e1.t1.rank0.log").read_text()
    assert f"port(s) [{taken}] taken by another process: retrying" in log
    scripts = sorted(p.name for p in (spec.replica_dir / "scripts").iterdir())
    assert scripts == ["engine.t1.rank0.try0.sh", "engine.t1.rank0.try1.sh"]


def test_engine_crash_before_health_fails_the_job(tmp_path):
    spec = replace(_spec(tmp_path), sim_arch="no-such-architecture")
    proc = _start(spec)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "engine exited before answering /health" in out
    assert not spec.endpoint_file.exists()
    # a crash is not mistaken for a port clash: one attempt only
    assert len(list((spec.replica_dir / "scripts").iterdir())) == 1


def test_loose_key_file_stops_before_starting_anything(tmp_path):
    spec = _spec(tmp_path)
    Path(spec.api_key_file).chmod(0o644)
    proc = _start(spec)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "chmod 600" in out
    assert not (spec.replica_dir / "scripts").exists()
    assert KEY not in out


def test_usage_error_without_spec_file():
    assert entrypoint.main([]) == 2


def test_spec_json_is_what_the_job_reads(tmp_path):
    spec = _spec(tmp_path)
    data = json.loads(spec.write().read_text())
    assert data["api_key_file"] == spec.api_key_file and KEY not in json.dumps(data)
