"""Start real stub replicas and a real gateway process (the gateway tests, and the sim-engine
stack of :mod:`harness.slo_stack` that the e2e SLO test and bench/slo.py share)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from coral_hpc.gateway.table import ReplicaRoute, RoutingTable, write_routing_table

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "harness" / "openai_stub_server.py"
#: the installed console script, as a user runs it
CORAL_HPC = str(Path(sys.executable).parent / "coral-hpc")


class Proc:
    """A child process that reported its bound address in a ready file."""

    def __init__(self, popen: subprocess.Popen, address: str, log: Path) -> None:
        self.popen = popen
        self.address = address
        self.url = f"http://{address}"
        self.log = log

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def _wait_ready(ready: Path, popen: subprocess.Popen, log: Path, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists():
            return ready.read_text().strip()
        if popen.poll() is not None:
            raise AssertionError(f"process exited {popen.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no ready file {ready} after {timeout}s: {log.read_text()[-2000:]}")


def start_stub(tmp: Path, name: str, *args: str, port: int = 0) -> Proc:
    """An OpenAI-shaped stub replica in its own process."""
    ready = tmp / f"{name}.addr"
    ready.unlink(missing_ok=True)
    log = tmp / f"{name}.log"
    popen = subprocess.Popen(
        [sys.executable, str(STUB), "--name", name, "--ready-file", str(ready),
         "--port", str(port), *args],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )
    return Proc(popen, _wait_ready(ready, popen, log), log)


def start_sim_engine(tmp: Path, name: str, served: str, *args: str, api_key: str) -> Proc:
    """The project's sim engine (qwen3-8b on a100) in its own process, serving ``served`` on a
    free loopback port with ``args`` added to its command line and ``api_key`` in its
    environment (as vLLM reads ``VLLM_API_KEY``; never in argv); returned once its log says
    where it listens (20 s at most)."""
    log = tmp / f"{name}.log"
    popen = subprocess.Popen(
        [sys.executable, "-m", "coral_hpc.engine.sim", "qwen3-8b", "--sim-gpu-types", "a100",
         "--served-model-name", served, "--host", "127.0.0.1", "--port", "0", *args],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_API_KEY": api_key},
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        match = re.search(r"on http://(127\.0\.0\.1:\d+)", log.read_text())
        if match:
            return Proc(popen, match.group(1), log)
        if popen.poll() is not None:
            break
        time.sleep(0.05)
    popen.kill()
    raise AssertionError(f"sim engine {name} did not start: {log.read_text()[-2000:]}")


def write_models_yaml(tmp: Path, models: list[str], listen: str = "127.0.0.1:8000",
                      api_keys_file: Path | None = None, max_body_bytes: int | None = None,
                      open_on_loopback: bool | None = None, **gateway_extra) -> Path:
    """A small models.yaml (sim engine) naming ``models``; ``gateway_extra`` are more fields of
    its ``gateway`` section (``tls_cert=...``). ``open_on_loopback`` None: true when there is no
    keys file and ``listen`` is loopback (these tests run on a machine of their own), else
    left out; False leaves it out (the gateway then refuses to start without keys)."""
    gateway: dict = {"listen": listen, **gateway_extra}
    if open_on_loopback is None:
        open_on_loopback = api_keys_file is None and listen.startswith("127.0.0.1:")
    if open_on_loopback:
        gateway["open_on_loopback"] = True
    if api_keys_file is not None:
        gateway["api_keys_file"] = str(api_keys_file)
    if max_body_bytes is not None:
        gateway["max_body_bytes"] = max_body_bytes
    data = {
        "deployment": "gwtest",
        "state_dir": str(tmp / "state"),
        "db_path": str(tmp / "db.sqlite"),
        "cluster": {"partitions": [{"name": "gpu"}]},
        "engine": {"kind": "sim"},
        "gateway": gateway,
        "models": [
            {"name": m, "source": f"org/{m}", "architecture": "qwen3-8b",
             "mix": {"input_tokens": 100, "output_tokens": 20},
             "demand": {"requests_per_s": 1}, "slo": {"ttft_s": 2, "tpot_s": 0.1}}
            for m in models
        ],
    }
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def write_table(path: Path, version: int, models: dict[str, list[tuple[str, str, float]]]) -> None:
    """Publish a routing table: model -> [(replica id, url, weight)]."""
    write_routing_table(path, RoutingTable(
        version=version,
        models={m: tuple(ReplicaRoute(i, u, w) for i, u, w in reps) for m, reps in models.items()},
    ))


def start_gateway(tmp: Path, models_yaml: Path, table: Path, *args: str,
                  listen: str = "127.0.0.1:0") -> Proc:
    """``coral-hpc gateway`` as a real process; returns once it listens."""
    ready = tmp / "gateway.addr"
    ready.unlink(missing_ok=True)
    log = tmp / "gateway.log"
    popen = subprocess.Popen(
        [CORAL_HPC, "gateway", str(models_yaml), "--table", str(table),
         "--ready-file", str(ready), "--probe-interval", "0.2", "--listen", listen, *args],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return Proc(popen, _wait_ready(ready, popen, log), log)


def stub_stats(proc: Proc) -> dict:
    """The stub's own counters."""
    import urllib.request

    with urllib.request.urlopen(proc.url + "/stats", timeout=5) as resp:
        return json.loads(resp.read())
