"""The job side of a replica: start the engine, publish its endpoint once healthy, drain on signal.

Runs once per node of the replica (``SLURM_PROCID`` = node rank = pipeline stage): submitit calls
:func:`run_replica` for single-node and homogeneous multi-node replicas; the hetjob batch script
runs ``python -m coral_hpc.launch.entrypoint SPEC_FILE`` on every component.

Rank 0 (the head) picks an API port, renders the engine launch script for its layout and
environment kind, starts it, and waits for ``/health`` over HTTP. If the engine exits before it is
healthy and the port turned out to be taken, it retries on another port: the engine itself binds
the port, so there is no probe-before-bind race. Once healthy it writes the endpoint file.
In a pipeline the head publishes its address in a per-job rendezvous file on the shared state
folder; the other ranks start headless workers that join it.

Signals: submitit's own handlers ignore SIGTERM and requeue on SIGUSR2. This module replaces
both: SIGUSR2 (the daemon's drain, see :mod:`coral_hpc.launch.stop`, and Slurm's walltime
warning) and SIGTERM drain the engine, and nothing is ever requeued. The engine ignores SIGUSR2;
the head turns it into one SIGTERM to the engine's API server, which finishes the requests in
flight (``--shutdown-timeout``); worker nodes keep their stage serving until the head is done.
A SIGTERM from Slurm reaches every engine process itself (real vLLM's workers then exit at once).
Secrets reach the engine through its environment only.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from coral_hpc.atomic import private_dir, write_atomic
from coral_hpc.errors import CoralError
from coral_hpc.launch.endpoint import (
    Endpoint,
    http_health,
    read_endpoint,
    write_endpoint,
    write_json_atomic,
)
from coral_hpc.launch.render import render_engine_script
from coral_hpc.launch.secrets import engine_secrets
from coral_hpc.launch.spec import ReplicaSpec

#: API and master ports come from below Linux's ephemeral range (32768+), where outgoing
#: connections would take them at random.
PORT_RANGE = (20000, 32767)
PORT_ATTEMPTS = 5
#: after SIGTERM, how long to watch for the engine draining on its own before signalling it
SELF_DRAIN_WAIT_S = 3.0
#: errno EADDRINUSE on Linux; the sim engine exits with it when its port is taken
EXIT_ADDRINUSE = 98
POLL_S = 0.5

log = logging.getLogger("coral_hpc.replica")


class EngineFailed(CoralError):
    """The engine exited or never became healthy: the job ends FAILED so the daemon sees a crash."""


# --------------------------------------------------------------------------- signals


class StopFlag:
    """Set by SIGTERM or SIGUSR2; remembers which signal asked the engine to drain."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name: str | None = None

    def install(self) -> None:
        """Replace submitit's handlers (SIGTERM ignored, SIGUSR2 requeue) with a drain request."""
        for sig in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        self.event.set()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(seconds)

    def is_set(self) -> bool:
        return self.event.is_set()


# --------------------------------------------------------------------------- small helpers


def _job_id() -> str:
    # In a heterogeneous job every component has its own SLURM_JOB_ID; the job is the leader's.
    return (
        os.environ.get("SLURM_HET_JOB_ID")
        or os.environ.get("SLURM_JOB_ID")
        or f"local{os.getpid()}"
    )


def _rank() -> int:
    return int(os.environ.get("SLURM_PROCID", "0"))


def pick_port(rng: random.Random) -> int:
    """A port for the engine to bind; the engine binds it itself (a failed bind is retried)."""
    return rng.randint(*PORT_RANGE)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something else listens on ``port`` now (used after a failed start, to tell a
    port clash from an engine crash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def health_ok(port: int, timeout: float = 2.0) -> bool:
    """Whether the engine on this node answers ``GET /health`` with 200."""
    return http_health(f"http://127.0.0.1:{port}", timeout=timeout)


def _setup_logging(spec: ReplicaSpec, job_id: str, rank: int) -> Path:
    private_dir(spec.logs_dir)
    path = spec.logs_dir / f"{spec.replica_id}.{job_id}.rank{rank}.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False  # submitit's own log is not ours
    return path


def _engine_env(spec: ReplicaSpec) -> dict[str, str]:
    """The engine's environment: the job's, without secrets it may have inherited from the
    daemon's shell, plus the secrets read from their files (``VLLM_API_KEY``, and ``HF_TOKEN``
    from ``engine.hf_token_file``) and ``HF_HOME``. This process never holds them in its own
    environment, so nothing else it starts (or logs) sees them."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN")}
    env.update(engine_secrets(spec.api_key_file, spec.hf_token_file))
    if spec.hf_home:
        env["HF_HOME"] = spec.hf_home
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Engine:
    """One engine (or worker) process started from a rendered launch script."""

    def __init__(self, script: Path, log_path: Path, env: dict[str, str]) -> None:
        self.started_at = time.time()
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                ["/bin/bash", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: killed whole on timeout
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> int | None:
        return self.proc.poll()

    def drain(self, timeout: float, *, send_term: bool = True) -> int:
        """SIGTERM the engine (unless it already has one) so it finishes what it can; SIGKILL its
        group after ``timeout``."""
        if self.proc.poll() is None:
            if send_term:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("engine did not exit %.0fs after SIGTERM; killing it", timeout)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # helpers it left behind
        except (ProcessLookupError, PermissionError):
            pass
        return self.proc.wait()


def _write_script(spec: ReplicaSpec, job_id: str, rank: int, attempt: int, text: str) -> Path:
    folder = spec.replica_dir / "scripts"
    private_dir(folder)
    path = folder / f"engine.{job_id}.rank{rank}.try{attempt}.sh"
    write_atomic(path, text)  # no secrets inside: they travel in the environment
    return path


# --------------------------------------------------------------------------- head (rank 0)


def _run_head(spec: ReplicaSpec, job_id: str, stop: StopFlag) -> dict[str, Any]:
    env = _engine_env(spec)
    host = socket.gethostname()
    engine_log = spec.logs_dir / f"{spec.replica_id}.{job_id}.rank0.engine.log"
    engine: Engine | None = None
    try:
        started = _start_head_engine(spec, job_id, stop, env, host, engine_log)
        if started is None:
            return {"replica_id": spec.replica_id, "job_id": job_id, "ready": False}
        engine, port = started
        endpoint = Endpoint(
            replica_id=spec.replica_id,
            job_id=job_id,
            url=f"http://{host}:{port}",
            host=host,
            port=port,
            model=spec.model,
            pid=engine.pid,
            started_at=engine.started_at,
            ready_at=time.time(),
            node=os.environ.get("SLURMD_NODENAME", ""),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        )
        key = env.get("VLLM_API_KEY")  # signs the endpoint file: the daemon checks it
        write_endpoint(spec.endpoint_file, endpoint, key)
        log.info(
            "engine healthy after %.1fs; endpoint %s written to %s",
            endpoint.ready_at - endpoint.started_at,
            endpoint.url,
            spec.endpoint_file,
        )
        while not stop.wait(POLL_S):
            code = engine.exited()
            if code is not None:
                _remove_endpoint(spec, job_id)
                raise EngineFailed(
                    f"engine exited with code {code} while serving; see {engine_log}"
                )
        log.info(
            "%s received: draining the engine (up to %.0fs)", stop.signal_name, spec.drain_timeout_s
        )
        write_endpoint(spec.endpoint_file, replace(endpoint, draining_at=time.time()), key)
        code = engine.drain(
            spec.drain_timeout_s, send_term=not _engine_draining(engine, port, stop)
        )
        _remove_endpoint(spec, job_id)
        log.info("engine exited with code %s after draining; not requeueing", code)
        return {**asdict(endpoint), "ready": True, "stopped_by": stop.signal_name}
    finally:
        if engine is not None and engine.exited() is None:
            engine.drain(spec.drain_timeout_s)
        if spec.pp > 1:
            write_json_atomic(spec.run_dir(job_id) / "done.json", {"at": time.time()})


def _start_head_engine(spec: ReplicaSpec, job_id: str, stop: StopFlag, env: dict[str, str],
                       host: str, engine_log: Path) -> tuple[Engine, int] | None:
    """Start rank 0's engine on a free port (telling pipeline workers where to meet it) and wait
    for /health: (engine, port) once healthy, None when a signal came first. Raises
    :class:`EngineFailed` when it cannot start."""
    rng = random.Random()
    needs_master = spec.pp > 1 and spec.env_kind != "sim"
    for attempt in range(PORT_ATTEMPTS):
        port = pick_port(rng)
        master_port = pick_port(rng) if needs_master else None
        if spec.pp > 1:
            write_json_atomic(
                spec.run_dir(job_id) / "head.json",
                {"attempt": attempt, "master_addr": host, "master_port": master_port},
            )
        script = _write_script(
            spec, job_id, 0, attempt,
            render_engine_script(spec, rank=0, port=port, master_addr=host,
                                 master_port=master_port),
        )
        log.info("starting engine (attempt %d) on port %d: %s", attempt, port, script)
        engine = Engine(script, engine_log, env)
        try:
            outcome = _wait_healthy(engine, port, stop, spec.health_timeout_s)
        except BaseException:
            engine.drain(spec.drain_timeout_s)  # never leave an engine behind the job
            raise
        if outcome == "healthy":
            return engine, port
        if outcome == "stopped":
            log.info("%s before the engine was healthy; stopping it", stop.signal_name)
            engine.drain(spec.drain_timeout_s)
            return None
        code = engine.exited()
        clash = [p for p in (port, master_port) if p and port_in_use(p)]
        if outcome == "exited" and (clash or code == EXIT_ADDRINUSE):
            log.warning(
                "engine exited (%s); port(s) %s taken by another process: retrying", code, clash
            )
            continue
        engine.drain(spec.drain_timeout_s)
        raise EngineFailed(
            f"engine {outcome} before answering /health (exit code {code}); see {engine_log}"
        )
    raise EngineFailed(f"no free port after {PORT_ATTEMPTS} attempts; see {engine_log}")


def _wait_healthy(engine: Engine, port: int, stop: StopFlag, timeout: float) -> str:
    """``healthy``, ``exited`` (the engine died), ``stopped`` (a signal) or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.exited() is not None:
            return "exited"
        if health_ok(port):
            return "healthy"
        if stop.wait(POLL_S):
            return "stopped"
    return "timeout"


def _engine_draining(engine: Engine, port: int, stop: StopFlag) -> bool:
    """Whether the engine is already draining by itself, so it must not get a second SIGTERM
    (vLLM's server and the sim both treat a second one as "stop now, drop the requests").

    Under Slurm a SIGTERM to a step reaches every process in it, the engine included, while the
    walltime warning SIGUSR2 is ignored by the engine (its launch script traps it) and reaches it
    only as our SIGTERM. A draining engine stops answering /health with 200 within moments.
    """
    if stop.signal_name != "SIGTERM":
        return False
    deadline = time.monotonic() + SELF_DRAIN_WAIT_S
    while time.monotonic() < deadline:
        if engine.exited() is not None or not health_ok(port, timeout=1.0):
            return True
        time.sleep(0.2)
    return False


def _remove_endpoint(spec: ReplicaSpec, job_id: str) -> None:
    """Remove the endpoint file if it is still this job's (a successor may own the name)."""
    current = read_endpoint(spec.endpoint_file)
    if current is not None and current.job_id == job_id:
        spec.endpoint_file.unlink(missing_ok=True)


# --------------------------------------------------------------------------- workers (rank > 0)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run_worker(spec: ReplicaSpec, job_id: str, rank: int, stop: StopFlag) -> dict[str, Any]:
    env = _engine_env(spec)
    run_dir = spec.run_dir(job_id)
    engine_log = spec.logs_dir / f"{spec.replica_id}.{job_id}.rank{rank}.engine.log"
    deadline = time.monotonic() + spec.health_timeout_s
    engine: Engine | None = None
    attempt = -1
    try:
        while not stop.is_set():
            if (run_dir / "done.json").exists():
                log.info("the head node finished; this worker ends")
                break
            head = _read_json(run_dir / "head.json")
            if head is not None and head["attempt"] != attempt:
                if engine is not None:
                    engine.drain(spec.drain_timeout_s)  # the head restarted on new ports
                attempt = head["attempt"]
                script = _write_script(
                    spec,
                    job_id,
                    rank,
                    attempt,
                    render_engine_script(
                        spec,
                        rank=rank,
                        master_addr=head["master_addr"],
                        master_port=head["master_port"],
                    ),
                )
                log.info("joining head %s (attempt %d): %s", head["master_addr"], attempt, script)
                engine = Engine(script, engine_log, env)
            elif head is None and time.monotonic() > deadline:
                raise EngineFailed(f"the head never published {run_dir / 'head.json'}")
            if engine is not None and engine.exited() is not None:
                if (run_dir / "done.json").exists():
                    break
                head = _read_json(run_dir / "head.json")
                if head is None or head["attempt"] == attempt:
                    stop.wait(2.0)  # the head may be about to retry or finish
                    if (run_dir / "done.json").exists():
                        break
                    head = _read_json(run_dir / "head.json")
                    if head is None or head["attempt"] == attempt:
                        raise EngineFailed(
                            f"worker exited with code {engine.exited()}; see {engine_log}"
                        )
                continue
            stop.wait(POLL_S)
        if stop.is_set() and engine is not None and stop.signal_name != "SIGTERM":
            # The head drains the requests in flight through every stage: this stage must
            # serve until the head is done, or the head waits on a dead stage.
            log.info("%s received: serving until the head has drained", stop.signal_name)
            _wait_head_done(run_dir, engine, spec.drain_timeout_s)
        if stop.is_set():
            log.info("%s received: stopping the worker", stop.signal_name)
    finally:
        if engine is not None:
            # under Slurm the worker got the step's SIGTERM itself; give it a moment to go
            got_term = stop.signal_name == "SIGTERM" and _exits_within(engine, SELF_DRAIN_WAIT_S)
            engine.drain(spec.drain_timeout_s, send_term=not got_term)
    return {"replica_id": spec.replica_id, "job_id": job_id, "rank": rank}


def _wait_head_done(run_dir: Path, engine: Engine, timeout: float) -> None:
    """Wait until the head wrote ``done.json`` (its engine drained and exited), this worker's
    engine exited, or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "done.json").exists() or engine.exited() is not None:
            return
        time.sleep(POLL_S)
    log.warning("the head did not finish within %.0fs; stopping the worker anyway", timeout)


def _exits_within(engine: Engine, seconds: float) -> bool:
    try:
        engine.proc.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


# --------------------------------------------------------------------------- entry points


def run_replica(spec_file: str) -> dict[str, Any]:
    """The job-side callable (submitit submits it; the hetjob script runs :func:`main`).

    Returns a summary for submitit's result file; raises :class:`EngineFailed` when the engine
    crashed or never became healthy, so Slurm records the job as FAILED.
    """
    stop = StopFlag()
    stop.install()  # first: a SIGTERM during start-up must drain, not be ignored
    os.umask(0o077)  # the endpoint file, logs and scripts it writes: the service account's alone
    spec = ReplicaSpec.from_json(Path(spec_file).read_text())
    job_id, rank = _job_id(), _rank()
    log_path = _setup_logging(spec, job_id, rank)
    log.info(
        "replica %s job %s rank %d/%d on %s, CUDA_VISIBLE_DEVICES=%s (log %s)",
        spec.replica_id,
        job_id,
        rank,
        spec.pp,
        os.environ.get("SLURMD_NODENAME", "?"),
        os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        log_path,
    )
    try:
        if rank == 0:
            return _run_head(spec, job_id, stop)
        return _run_worker(spec, job_id, rank, stop)
    except Exception:
        log.exception("replica %s rank %d failed", spec.replica_id, rank)
        raise


def main(argv: list[str] | None = None) -> int:
    """``python -m coral_hpc.launch.entrypoint SPEC_FILE`` (the hetjob script's command)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m coral_hpc.launch.entrypoint SPEC_FILE", file=sys.stderr)
        return 2
    try:
        run_replica(args[0])
    except CoralError as exc:
        print(f"coral-hpc replica: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
