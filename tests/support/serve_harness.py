"""The one harness of the Slurm-backed ``serve`` tests (integration and real-engine): real Slurm
(the local cluster), real replica jobs, the real daemon and SQLite store, and a small rule-based
planner for scenarios that must not depend on what the optimiser prefers.

- :func:`sim_models_yaml` and :func:`one_model_yaml` write the models.yaml those tests serve;
- the daemon three ways: :class:`HeadlessDaemon` (its loops in threads of the test process, no
  gateway), :func:`serve_deployment` (:func:`coral_hpc.daemon.serve`, gateway child process
  included, in a thread) and :class:`ServeProcess` (a process of its own, for tests that signal
  or kill it: ``coral-hpc serve`` itself, or this module as a script with the rule-based
  planner);
- :func:`cli` and :func:`status` run the ``coral-hpc`` command line as the tests drive it;
- :func:`replicas`, :func:`ready`, :func:`events`, :func:`wait_cycles` and
  :func:`wait_every_model_ready` read what the daemon recorded, :func:`tagged_jobs` and
  :func:`live_jobs` what Slurm itself runs for the deployment; :func:`cancel_deployment` cleans
  a deployment up whatever happened.

The planner takes candidate slots in order of preference and picks, for each model, the first
whose partition is up and not excluded — enough to show the reconcile loop moving, replacing,
rotating and cooling down replicas. The solver's own plans are exercised by the serve tests that
run ``coral-hpc serve`` on the examples.

Run as a script (``python -m tests.support.serve_harness CONFIG CANDIDATES_JSON [--headless]``)
it is the daemon process :meth:`ServeProcess.planned` starts: :func:`coral_hpc.daemon.serve`
(gateway, info file, SIGTERM/SIGHUP handlers), or with ``--headless`` the daemon's loops alone
until SIGTERM (the process the kill -9 test kills and restarts).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from coral_hpc.config import Deployment, load_deployment
from coral_hpc.daemon.core import Daemon
from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.plan.layout import layout_dtype
from coral_hpc.plan.planner import PlanOutcome, PlanRequest
from coral_hpc.slurm import make_client
from coral_hpc.store import Store, open_store
from coral_hpc.types import ReplicaLayout, StageLayout
from coral_solver.catalog import model_arch
from harness.daemon_setup import SimModel, headless_daemon, write_models_yaml
from harness.slurm_jobs import (  # noqa: F401 (the tests read them from here)
    cancel_deployment,
    live_jobs,
    tagged_jobs,
)
from tests.conftest import REPO, wait_until

T = TypeVar("T")


def slot(model: str, arch: str, partition: str, gpu: str, tp: int = 1, count: int = 1,
         throughput: float = 2.0) -> Slot:
    """A single-stage slot: ``count`` replicas of ``model`` on one ``gpu`` node of ``partition``."""
    layers = model_arch(arch).layers
    layout = ReplicaLayout(tp, (StageLayout(partition, gpu, layers),), layout_dtype(arch, [gpu]))
    return Slot(model=model, template_id=f"{model}.tp{tp}.{gpu}-{layers}", count=count,
                throughput=throughput, cost_per_hour=float(tp), layout=layout)


class PreferencePlanner:
    """Per model, the first candidate slot whose partition is up and not excluded."""

    def __init__(self, candidates: list[Slot]):
        self.candidates = candidates
        self.requests: list[PlanRequest] = []

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        self.requests.append(request)
        up = {p.name for p in request.snapshot.partitions if p.state == "up"}
        chosen: dict[str, Slot] = {}
        for candidate in self.candidates:
            if candidate.model in chosen or candidate.partitions[0] not in up:
                continue
            if candidate.template_id in request.excluded_templates:
                continue
            if (candidate.template_id, candidate.partitions) in request.excluded_shapes:
                continue
            chosen[candidate.model] = candidate
        slots = tuple(chosen.values())
        return PlanOutcome(DesiredPlan(0.0, slots), sum(s.count * s.cost_per_hour for s in slots),
                           0.0, "rule")


class ConfiguredPreferencePlanner(PreferencePlanner):
    """:class:`PreferencePlanner` over the candidates of configured models only (so a SIGHUP
    that adds a model is what lets its candidate be planned)."""

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        configured = {m.name for m in request.deployment.models}
        return PreferencePlanner([c for c in self.candidates if c.model in configured])(request)


# --------------------------------------------------------------------------- models.yaml


def sim_models_yaml(folder: Path, prefix: str, models: Sequence[str], *, architecture: str,
                    mix: tuple[int, int], time_limit: str, policy: dict[str, object]) -> Path:
    """Write ``folder/models.yaml`` (:func:`~tests.support.daemon_setup.write_models_yaml`) and
    return its path: a deployment of its own (``prefix`` and six random hex digits, so its jobs
    are told apart from every other test's), the local cluster's v100 and a100 partitions at one
    CPU and 4 GB per GPU, ``policy`` as given, and per model ``architecture``, ``mix`` (input,
    output tokens) and 1 req/s."""
    return write_models_yaml(
        folder, f"{prefix}{secrets.token_hex(3)}", time_limit=time_limit,
        partitions=("v100", "a100"), cluster={"cpus_per_gpu": 1, "mem_per_gpu_gb": 4},
        policy=policy, models=[SimModel(m, mix, 1, architecture=architecture) for m in models])


def example_copy(folder: Path, example: Path, prefix: str,
                 lines: dict[str, str] | None = None) -> Path:
    """Write ``example`` (a models.yaml under the repository) to ``folder/models.yaml`` and return
    its path: a deployment of its own (``prefix`` and six random hex digits), state folder
    ``folder/shared`` and database ``folder/daemon/coral.db``, a poll every second, and each
    ``lines`` pattern replaced by its line; every pattern must match exactly one line."""
    text = example.read_text()
    replacements = {
        r"(?m)^deployment: .*$": f"deployment: {prefix}{secrets.token_hex(3)}",
        r"(?m)^state_dir: .*$": f"state_dir: {folder / 'shared'}",
        r"(?m)^db_path: .*$": f"db_path: {folder / 'daemon' / 'coral.db'}",
        r"(?m)^  poll_interval_s: .*$": "  poll_interval_s: 1",
        **(lines or {}),
    }
    for pattern, value in replacements.items():
        text, count = re.subn(pattern, value, text)
        assert count == 1, f"{example.relative_to(REPO)} no longer has {pattern!r}"
    path = folder / "models.yaml"
    path.write_text(text)
    return path


#: the model most scenarios serve, and its slot on one a100 node
MODEL, ARCH = "qwen3-8b", "qwen3-8b"
ON_A100 = slot(MODEL, ARCH, "a100", "a100", tp=1)


def one_model_yaml(folder: Path, time_limit: str = "00:10:00", **policy: object) -> Path:
    """:func:`sim_models_yaml` of :data:`MODEL` alone, with intervals of seconds (poll 1 s,
    pending timeout 20 s, crash limit 2) that ``policy`` overrides or adds to."""
    settings = {"poll_interval_s": 1, "replan_interval_s": 120, "pending_timeout_s": 20,
                "walltime_lead_s": 45, "startup_time_s": 5, "crash_limit": 2,
                "crash_cooldown_s": 300, **policy}
    return sim_models_yaml(folder, "it", [MODEL], architecture=ARCH, mix=(256, 64),
                           time_limit=time_limit, policy=settings)


# --------------------------------------------------------------------------- the daemon


def build_daemon(deployment: Deployment, planner, env: dict[str, str] | None = None) -> Daemon:
    """A daemon with the real CLI Slurm client and a real store, no gateway."""
    return headless_daemon(deployment, make_client("cli", env=env, timeout_s=30), planner)


class HeadlessDaemon:
    """The daemon of ``config`` (:func:`build_daemon`) running in this process, its loops in
    threads, until :meth:`stop`."""

    def __init__(self, config: Path, planner, env: dict[str, str] | None = None):
        self.deployment = load_deployment(config)
        self.daemon = build_daemon(self.deployment, planner, env)
        self.stop_event = threading.Event()
        self.threads = [loop.start() for loop in self.daemon.loops(self.stop_event)]

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(30)
        self.daemon.observer.close()
        self.daemon.store.close()


class ServeThread:
    """:func:`coral_hpc.daemon.serve` of one models.yaml in a thread of this process, with the real
    gateway as its child process on a free loopback port."""

    def __init__(self, config: Path, planner) -> None:
        from coral_hpc.daemon import serve

        self.deployment = load_deployment(config)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(
            target=serve, args=(config, planner),
            kwargs={"gateway_listen": "127.0.0.1:0", "stop": self.stop_event}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Ask serve() to stop (its replicas keep running) and wait up to 60 s for it."""
        self.stop_event.set()
        self.thread.join(60)


@contextmanager
def serve_deployment(config: Path, planner) -> Iterator[ServeThread]:
    """Serve ``config`` with ``planner`` in this process for the ``with`` block, then stop;
    whether serve() ended is ``thread.is_alive()`` afterwards."""
    served = ServeThread(config, planner)
    try:
        yield served
    finally:
        served.stop()


# --------------------------------------------------------------------------- serve processes


#: ``coral-hpc`` in this interpreter (no console script needed in the venv)
CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]


def cli(env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``coral-hpc ARGS`` in the repository; its exit status and output, never raised."""
    return subprocess.run([*CLI, *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


class ServeProcess:
    """A serve daemon in a process of its own, started in the repository with its output
    appended to ``folder/<log_name>``: ``coral-hpc serve`` (:meth:`cli`) or this module as a
    script with the rule-based planner (:meth:`planned`)."""

    def __init__(self, argv: list[str], config: Path, folder: Path, env: dict,
                 log_name: str = "serve.log"):
        self.config, self.env = config, env
        self.deployment = load_deployment(config)
        self.log_path = folder / log_name
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT)

    @classmethod
    def cli(cls, env: dict, config: Path, folder: Path) -> ServeProcess:
        """``coral-hpc serve CONFIG`` on an ephemeral gateway port, its Stage-1 cache in
        ``folder/templates``."""
        return cls([*CLI, "serve", str(config), "--listen", "127.0.0.1:0",
                    "--cache-dir", str(folder / "templates")], config, folder, env)

    @classmethod
    def planned(cls, folder: Path, config: Path, candidates: list[Slot], env: dict, *,
                headless: bool = False) -> ServeProcess:
        """This module as a script: serve() with :class:`ConfiguredPreferencePlanner` over
        ``candidates`` (output in ``serve.log``), or with ``headless`` the daemon's loops alone
        (``daemon.log``)."""
        path = folder / "candidates.json"
        path.write_text(candidates_to_json(candidates))
        argv = [sys.executable, "-m", "tests.support.serve_harness", str(config), str(path)]
        return cls([*argv, "--headless"] if headless else argv, config, folder,
                   {**os.environ, **env}, "daemon.log" if headless else "serve.log")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (unless it already ended); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self, timeout: float = 30) -> None:
        """kill -9: no clean-up at all (its gateway, in a session of its own, lives on)."""
        self.proc.kill()
        self.proc.wait(timeout)

    def close(self, down_grace: int | None = None) -> None:
        """Whatever happened: :meth:`stop`, then ``coral-hpc down --grace DOWN_GRACE`` where
        given, then :func:`cancel_deployment`."""
        try:
            if self.proc.poll() is None:
                self.stop()
            if down_grace is not None:
                cli(self.env, "down", str(self.config), "--grace", str(down_grace), timeout=240)
        finally:
            cancel_deployment(self.env, self.deployment)


def start_serve(env: dict, config: Path, folder: Path) -> subprocess.Popen:
    """:meth:`ServeProcess.cli`'s process, for tests that drive it themselves."""
    return ServeProcess.cli(env, config, folder).proc


# --------------------------------------------------------------------------- what it did


def read_store(deployment: Deployment, read: Callable[[Store], T], default: T) -> T:
    """``read`` of the daemon's database, opened read-only and closed after; ``default`` before
    the daemon has made it."""
    if not Path(deployment.db_path).exists():
        return default
    store = open_store(deployment.db_path, readonly=True)
    try:
        return read(store)
    finally:
        store.close()


def replicas(deployment: Deployment) -> list[dict]:
    """What `coral-hpc status --json` would print under "replicas" ([] before the daemon made
    its database)."""
    from coral_hpc.cli.status import status_data

    return read_store(deployment, lambda s: status_data(deployment, s, time.time())["replicas"],
                      [])


def ready(deployment: Deployment) -> list[dict]:
    """The READY ones of :func:`replicas`."""
    return [r for r in replicas(deployment) if r["state"] == "READY"]


def events(deployment: Deployment, kind: str | None = None, limit: int = 500) -> list:
    """The daemon's last ``limit`` events (of ``kind``), newest first; [] before its database
    exists."""
    return read_store(deployment, lambda s: s.events(limit=limit, kind=kind), [])


def _last_observed(deployment: Deployment) -> float | None:
    """When the daemon last observed any live replica in Slurm (it stamps every live replica's
    ``last_seen_at`` once per reconcile cycle); None before it has."""
    return read_store(deployment, lambda s: max(
        (r.last_seen_at or 0.0 for r in s.replicas(live_only=True)), default=None), None)


def wait_cycles(deployments: Sequence[Deployment], cycles: int, timeout: float = 180.0) -> None:
    """Return once each daemon of ``deployments`` has run ``cycles`` more reconcile cycles that
    observed a live replica (each stamps a new ``last_seen_at``).

    A check that something does *not* happen ("still one job", "no second submit") is made over
    the daemon's cycles, not over a fixed sleep: a slow host fits fewer cycles into the same
    seconds and the check would prove less; a fast one more. ``timeout`` only bounds a daemon
    that stopped cycling. A missed stamp (two cycles between polls) only makes this wait longer."""
    baseline = {d.db_path: _last_observed(d) for d in deployments}
    stamps: dict[str, set[float]] = {d.db_path: set() for d in deployments}

    def counted() -> dict[str, int] | None:
        for d in deployments:
            stamp = _last_observed(d)
            first = baseline[d.db_path]
            if stamp is not None and (first is None or stamp > first):
                stamps[d.db_path].add(stamp)
        seen = {str(d.db_path): len(stamps[d.db_path]) for d in deployments}
        return None if min(seen.values()) < cycles else seen

    try:
        wait_until(counted, timeout, f"{cycles} more reconcile cycles of each daemon",
                   interval=0.05)
    except AssertionError as exc:
        got = {str(d.db_path): len(stamps[d.db_path]) for d in deployments}
        raise AssertionError(f"{exc}; cycles seen: {got}") from None


def status(env: dict, config: Path) -> dict:
    """``coral-hpc status --json``, which must succeed."""
    out = cli(env, "status", str(config), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def status_if_any(env: dict, config: Path) -> dict | None:
    """``coral-hpc status --json``, or None while serve has not made its database yet (or
    status fails)."""
    if not Path(load_deployment(config).db_path).exists():
        return None
    out = cli(env, "status", str(config), "--json")
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_every_model_ready(env: dict, config: Path, timeout_s: float) -> dict:
    """``status --json`` once every configured model has a READY replica (fails the test after
    ``timeout_s``)."""
    db_path = Path(load_deployment(config).db_path)

    def every_ready() -> dict | None:
        if not db_path.exists():
            return None
        data = status(env, config)
        return data if all(m["ready_replicas"] >= 1 for m in data["models"]) else None

    data = wait_until(every_ready, timeout_s, "a READY replica of every model")
    assert isinstance(data, dict)
    return data


def complete(address: str, model: str) -> tuple[int, dict | str]:
    """POST one completion through the gateway at ``address``: (HTTP status, body); status 0 when
    nothing answered."""
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://{address}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


# ------------------------------------------------- candidates as JSON (for the daemon processes)


def candidates_to_json(candidates: list[Slot]) -> str:
    return json.dumps([{"model": c.model, "template_id": c.template_id, "count": c.count,
                        "throughput": c.throughput, "cost_per_hour": c.cost_per_hour,
                        "layout": c.layout.to_dict()} for c in candidates])


def candidates_from_json(text: str) -> list[Slot]:
    return [Slot(model=c["model"], template_id=c["template_id"], count=c["count"],
                 throughput=c["throughput"], cost_per_hour=c["cost_per_hour"],
                 layout=ReplicaLayout.from_dict(c["layout"])) for c in json.loads(text)]


# --------------------------------------------------------------------------- as a script


def main(argv: list[str]) -> int:
    """serve() of ``argv[0]`` with the candidates of ``argv[1]``; with ``--headless`` the daemon's
    loops alone, under its lock, until SIGTERM (or until killed)."""
    from coral_hpc.daemon import serve
    from coral_hpc.daemon.process import DaemonLock, lock_path

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    planner = ConfiguredPreferencePlanner(candidates_from_json(Path(argv[1]).read_text()))
    if "--headless" not in argv[2:]:
        serve(argv[0], planner, gateway_listen="127.0.0.1:0")
        return 0
    lock = DaemonLock(lock_path(load_deployment(argv[0])))
    lock.acquire()
    daemon = HeadlessDaemon(Path(argv[0]), planner)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    daemon.stop()
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
