"""Chaos soak: ``coral-hpc serve`` under continuous load on the local cluster while faults land at
random times, and what that cost.

A real ``coral-hpc serve`` process (the real planner, daemon and gateway) serves two sim-engine
models on the local cluster's ``a100`` and ``v100`` partitions, each with ``min_replicas: 2`` so
that losing one replica never has to leave a model without one. Two client threads send a
completion through the gateway every 0.4 s each, the whole time, and every answer is recorded.
The deployment's time limit is short (``--time-limit``), so **walltime expiry** comes by itself:
every replica reaches it and is rotated. On top of that, at exponentially distributed gaps
(mean ``--mean-gap-s``, seeded), one of these faults, in a shuffled round so each kind comes as
often as the others:

- ``kill_daemon``: ``kill -9`` of the serve process; started again after 5 s, as a service
  manager would (``Restart=always``, ``RestartSec=5``);
- ``kill_gateway``: ``kill -9`` of the gateway (the daemon starts a new one on the same port);
- ``scancel``: ``scancel`` of a READY replica's job;
- ``drain_node``: ``scontrol update state=DRAIN`` of a node a READY replica runs on, resumed
  after ``--drain-s``;
- ``ctld_outage``: slurmctld stopped for ``--outage-s`` (``scripts/dev-cluster ctld-outage``),
  jobs running on;
- ``partition_taken``: another lab's jobs (``coral-other``) take every free GPU of one partition
  for ``--taken-s``.

Reported (``bench/results/chaos.json`` and ``chaos.md``): requests sent and failed, each failure
with its reason and the faults active when it happened; a failure is excused only while the
gateway itself was killed (nothing listens on the port then: no replica choice can help) — every
other one counts; duplicate jobs (two live jobs of one replica id) and orphaned ones (a live job
the daemon's database does not know, or that it ended more than two minutes ago, and any job
left after ``down``); processes left after ``down``; the daemon's and the gateway's RSS over time;
and per fault kind the time until every model had its READY replicas again.

    .venv/bin/python bench/chaos.py [--minutes 120] [--seed 1] [--mean-gap-s 240]
    .venv/bin/python bench/chaos.py --short --out /tmp/chaos   # one of each fault, ~6 min

``--short`` is the version CI runs (tests/integration/test_chaos_short.py): one fault of each
kind in turn, a 5-minute time limit, and the same report. Every drain is resumed, slurmctld
always started again, the other lab's jobs cancelled and the deployment brought ``down``, in
``finally`` blocks, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coral_hpc.config import Deployment, load_deployment  # noqa: E402
from coral_hpc.daemon.process import recorded_gateway  # noqa: E402
from coral_hpc.slurm import make_client  # noqa: E402
from coral_hpc.store import open_store  # noqa: E402

RESULTS = REPO / "bench" / "results"
DEV_SLURM_CONF = "/var/tmp/coral-dev-cluster/etc/slurm.conf"
CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]
OTHER_USER = "coral-other"  # scripts/dev-cluster other-user
FAULTS = ("kill_daemon", "kill_gateway", "scancel", "drain_node", "ctld_outage",
          "partition_taken")
MODELS = ("chat", "code")
#: a service manager's restart delay for the killed daemon (systemd's RestartSec default is
#: 100 ms; 5 s is the common setting in unit files for daemons that hold locks)
RESTART_DELAY_S = 5.0
#: a job the daemon ended this long ago and Slurm still runs is orphaned (a drain's grace is 60 s
#: and scancel's signal escalation a few seconds more)
ORPHAN_AFTER_S = 120.0
#: each client thread's pause between requests: two threads, ~5 requests/s in all, ~2.5 per
#: model, the demand each model declares
PAUSE_S = 0.4
#: a model counts as recovered once it has this many READY replicas again (its min_replicas)
MIN_REPLICAS = 2


@dataclass
class Answer:
    """One request through the gateway: when it ended, its HTTP status (0: no answer at all)."""

    at: float
    model: str
    status: int
    detail: str = ""


@dataclass
class Fault:
    """One injected fault: its kind, when it began and ended, what it hit, how long until every
    model had MIN_REPLICAS READY replicas again (None: not within the run)."""

    kind: str
    began: float
    ended: float = 0.0
    target: str = ""
    #: the replica it took down, where it took one
    replica_id: str = ""
    recovered_s: float | None = None


@dataclass
class Run:
    """What the soak saw, filled as it goes."""

    answers: list[Answer] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    rss: list[dict] = field(default_factory=list)
    duplicates: list[dict] = field(default_factory=list)
    orphans: list[dict] = field(default_factory=list)
    gateway_down: list[tuple[float, float]] = field(default_factory=list)


def free_port() -> int:
    """A TCP port nothing listens on now, for the gateway to keep across its restarts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(folder: Path, time_limit: str, port: int) -> Path:
    """Two sim-engine models (Qwen3-8B weights, 2 s TTFT / 0.1 s TPOT), min_replicas 2 each, on
    the a100 and v100 partitions, the gateway on a fixed loopback port; the policy defaults but
    for a walltime lead that fits a short time limit."""
    models = "".join(f"""  - name: {name}
    source: Qwen/Qwen3-8B
    architecture: qwen3-8b
    mix: {{input_tokens: 256, output_tokens: 16}}
    demand: {{requests_per_s: 2.5}}
    slo: {{ttft_s: 2.0, tpot_s: 0.1}}
    min_replicas: {MIN_REPLICAS}
""" for name in MODELS)
    path = folder / "models.yaml"
    path.write_text(f"""deployment: chaos{secrets.token_hex(3)}
state_dir: {folder / 'shared'}
db_path: {folder / 'daemon' / 'coral.db'}
cluster:
  time_limit: "{time_limit}"
  partitions:
    - {{name: a100, gpu_types: [a100]}}
    - {{name: v100, gpu_types: [v100]}}
engine: {{kind: sim}}
gateway: {{listen: "127.0.0.1:{port}", open_on_loopback: true}}
policy:
  walltime_lead_s: 45
models:
{models}""")
    return path


def run_quiet(env: dict, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A command, its output captured, never raising on a non-zero exit."""
    return subprocess.run(list(argv), check=False, capture_output=True, text=True,
                          timeout=timeout, env=env)


class Serve:
    """``coral-hpc serve CONFIG`` as a process, started again after a kill as a service manager
    would; its output appended to ``folder/serve.log``."""

    def __init__(self, config: Path, folder: Path, env: dict):
        self.config, self.folder, self.env = config, folder, env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.folder / "serve.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*CLI, "serve", str(self.config), "--cache-dir", str(self.folder / "templates")],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait(30)
        return pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Traffic:
    """Two threads, each sending one completion through the gateway every 0.4 s, alternating
    models; every answer recorded in ``run.answers``."""

    def __init__(self, port: int, run: Run):
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.run = run
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(2)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _loop(self, offset: int) -> None:
        i = offset
        while not self.stop_event.is_set():
            model = MODELS[i % len(MODELS)]
            i += 1
            self.run.answers.append(self._one(model, i))
            self.stop_event.wait(PAUSE_S)

    def _one(self, model: str, i: int) -> Answer:
        body = json.dumps({"model": model, "prompt": f"q{i}", "max_tokens": 4}).encode()
        request = urllib.request.Request(self.url, data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
                return Answer(time.time(), model, resp.status)
        except urllib.error.HTTPError as exc:
            return Answer(time.time(), model, exc.code,
                          exc.read()[:200].decode("utf-8", "replace"))
        except Exception as exc:  # noqa: BLE001 - every failure is a failed request
            return Answer(time.time(), model, 0, repr(exc)[:200])

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(35)


class Soak:
    """The deployment under test, the faults and the watchers."""

    def __init__(self, args: argparse.Namespace, folder: Path, env: dict):
        self.args, self.env, self.folder = args, env, folder
        self.port = free_port()
        self.config = write_config(folder, args.time_limit, self.port)
        self.deployment: Deployment = load_deployment(self.config)
        self.serve = Serve(self.config, folder, env)
        self.client = make_client("cli", env=env)
        self.run = Run()
        self.traffic = Traffic(self.port, self.run)
        self.rng = random.Random(args.seed)
        self.stop_event = threading.Event()
        self.drained: set[str] = set()
        self.taken_jobs: list[str] = []

    # ------------------------------------------------------------------ reading what is

    def replicas(self) -> list:
        """The daemon's replica records (live and ended), read-only; [] before it has any."""
        if not Path(self.deployment.db_path).exists():
            return []
        store = open_store(self.deployment.db_path, readonly=True)
        try:
            return store.replicas(live_only=False)
        finally:
            store.close()

    def ready(self) -> list:
        """READY replicas: ready, not asked to drain, not cancelled, not ended."""
        return [r for r in self.replicas() if r.ready_at is not None and r.ended_at is None
                and r.cancelled_at is None and r.drain_requested_at is None]

    def serving(self) -> bool:
        """Every model has MIN_REPLICAS READY replicas and the gateway runs."""
        counts = Counter(r.model for r in self.ready())
        return (all(counts[m] >= MIN_REPLICAS for m in MODELS)
                and recorded_gateway(self.deployment) is not None)

    def live_jobs(self) -> list:
        """This deployment's jobs Slurm still runs or queues (read independently)."""
        return [j for j in self.client.snapshot(self.deployment.deployment).jobs
                if j.end_kind is None]

    def wait(self, predicate: Callable[[], object], timeout_s: float,
             poll_s: float = 1.0) -> object:
        """``predicate()`` once truthy, polling every ``poll_s``; None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stop_event.is_set():
            value = predicate()
            if value:
                return value
            time.sleep(poll_s)
        return None

    # ------------------------------------------------------------------ the faults

    def inject(self, kind: str) -> Fault:
        """Inject one fault of ``kind``; returns once it has landed (a killed daemon started
        again, the controller back); a drain is resumed and the other lab's jobs end later, on
        timers."""
        fault = Fault(kind, time.time())
        getattr(self, f"_fault_{kind}")(fault)
        fault.ended = time.time()
        return fault

    def _fault_kill_daemon(self, fault: Fault) -> None:
        fault.target = f"pid {self.serve.kill()}"
        time.sleep(RESTART_DELAY_S)
        self.serve.start()

    def _fault_kill_gateway(self, fault: Fault) -> None:
        record = recorded_gateway(self.deployment)
        if record is None:
            fault.target = "no gateway running"
            return
        os.kill(record["pid"], signal.SIGKILL)
        fault.target = f"pid {record['pid']}"
        # down from the kill until a new gateway accepts connections on the port (its record
        # is written when it starts, a moment before it listens); the killed one's socket may
        # accept for a few milliseconds more, so first until that has gone
        self.wait(lambda: not self.listening(), 10, poll_s=0.05)
        back = self.wait(lambda: recorded_gateway(self.deployment) and self.listening(), 120,
                         poll_s=0.2)
        self.run.gateway_down.append((fault.began, time.time() if back else fault.began + 120))

    def listening(self) -> bool:
        """Whether something accepts TCP connections on the gateway's port."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def _a_ready_replica(self):
        ready = [r for r in self.ready() if r.job_id]
        return self.rng.choice(ready) if ready else None

    def _fault_scancel(self, fault: Fault) -> None:
        replica = self._a_ready_replica()
        if replica is None:
            fault.target = "no READY replica"
            return
        fault.target = f"job {replica.job_id} ({replica.model})"
        fault.replica_id = replica.id
        run_quiet(self.env, "scancel", str(replica.job_id))

    def _fault_drain_node(self, fault: Fault) -> None:
        replica = self._a_ready_replica()
        if replica is None or not replica.nodes:
            fault.target = "no READY replica"
            return
        node = replica.nodes.split(",")[0]
        fault.target = f"node {node} ({replica.model})"
        fault.replica_id = replica.id
        self.drained.add(node)
        run_quiet(self.env, "scontrol", "update", f"NodeName={node}", "State=DRAIN",
                  "Reason=chaos soak")
        self.later(self.args.drain_s, self._resume, node)

    def _resume(self, node: str) -> None:
        run_quiet(self.env, "scontrol", "update", f"NodeName={node}", "State=RESUME")
        self.drained.discard(node)

    def later(self, delay_s: float, undo: Callable[..., None], *args: object) -> None:
        """Undo a fault after ``delay_s`` in a thread of its own (clean_up undoes it sooner)."""
        timer = threading.Timer(delay_s, undo, args)
        timer.daemon = True
        timer.start()

    def _fault_ctld_outage(self, fault: Fault) -> None:
        fault.target = f"slurmctld for {self.args.outage_s:g} s"
        run_quiet(self.env, str(REPO / "scripts" / "dev-cluster"), "ctld-outage",
                  str(int(self.args.outage_s)), timeout=self.args.outage_s + 120)

    def _fault_partition_taken(self, fault: Fault) -> None:
        partition = self.rng.choice(("a100", "v100"))
        fault.target = f"partition {partition}"
        jobs = take_partition(self.env, partition, self.args.taken_s)
        self.taken_jobs += jobs
        self.later(self.args.taken_s, self._give_back, jobs)

    def _give_back(self, jobs: list[str]) -> None:
        if jobs:
            run_quiet(self.env, "scancel", *jobs)
        self.taken_jobs = [j for j in self.taken_jobs if j not in jobs]

    def recovered(self, fault: Fault) -> bool:
        """Every model serving again as the daemon sees it after the fault: MIN_REPLICAS READY
        each, a gateway, every live replica observed since the fault, and the replica it took
        down no longer counted."""
        if not self.serving():
            return False
        live = [r for r in self.replicas() if r.ended_at is None]
        if any((r.last_seen_at or 0.0) < fault.ended for r in live):
            return False
        return fault.replica_id not in {r.id for r in self.ready()}

    # ------------------------------------------------------------------ the watchers

    def watch_jobs(self) -> None:
        """Every 10 s: duplicate jobs (two live jobs of one replica id) and orphans (a live job
        the database does not know, or ended more than ORPHAN_AFTER_S ago)."""
        while not self.stop_event.wait(10.0):
            try:
                self._check_jobs()
            except Exception as exc:  # noqa: BLE001 - Slurm away during an outage: look again
                print(f"job watch: {exc!r}", flush=True)

    def _check_jobs(self) -> None:
        jobs = self.live_jobs()
        records = {r.id: r for r in self.replicas()}
        now = time.time()
        per_replica = Counter(j.tag.replica_id for j in jobs if j.tag)
        for replica_id, count in per_replica.items():
            if count > 1 and not any(d["replica"] == replica_id for d in self.run.duplicates):
                self.run.duplicates.append({"at": now, "replica": replica_id, "jobs": count})
        for job in jobs:
            record = records.get(job.tag.replica_id) if job.tag else None
            ended = record is not None and record.ended_at is not None
            unknown = record is None and job.submit_time is not None \
                and now - job.submit_time > ORPHAN_AFTER_S
            if (unknown or (ended and now - record.ended_at > ORPHAN_AFTER_S)) \
                    and not any(o["job"] == job.job_id for o in self.run.orphans):
                self.run.orphans.append({"at": now, "job": job.job_id, "state": job.state,
                                         "known": record is not None})

    def watch_rss(self) -> None:
        """Every 30 s: the daemon's and the gateway's resident memory (MiB)."""
        while True:
            gateway = recorded_gateway(self.deployment)
            daemon = self.serve.proc.pid if self.serve.proc else None
            self.run.rss.append({"at": time.time(), "daemon_mib": rss_mib(daemon),
                                 "gateway_mib": rss_mib(gateway["pid"] if gateway else None)})
            if self.stop_event.wait(30.0):
                return

    # ------------------------------------------------------------------ the run

    def schedule(self) -> list[str]:
        """The faults in the order they come: shuffled rounds of every kind (``--short``: one
        round)."""
        rounds = 1 if self.args.short else 10_000
        order: list[str] = []
        for _ in range(rounds):
            kinds = list(FAULTS)
            self.rng.shuffle(kinds)
            order += kinds
        return order

    def soak(self) -> None:
        """Serve, load, inject faults until the time is up; every fault's recovery timed."""
        self.serve.start()
        if not self.wait(self.serving, 300):
            raise RuntimeError(f"not serving after 300 s: see {self.folder / 'serve.log'}")
        self.traffic.start()
        watchers = [threading.Thread(target=w, daemon=True)
                    for w in (self.watch_jobs, self.watch_rss)]
        for thread in watchers:
            thread.start()
        end = time.monotonic() + self.args.minutes * 60.0
        for kind in self.schedule():
            gap = 20.0 if self.args.short else self.rng.expovariate(1.0 / self.args.mean_gap_s)
            if time.monotonic() + gap >= end or self.stop_event.wait(gap):
                break
            fault = self.inject(kind)
            recovered = self.wait(lambda f=fault: self.recovered(f), self.args.recover_timeout_s)
            fault.recovered_s = round(time.time() - fault.began, 1) if recovered else None
            self.run.faults.append(fault)
            print(f"{time.strftime('%H:%M:%S')} {kind} {fault.target}: recovered in "
                  f"{fault.recovered_s} s", flush=True)
        if self.args.short:  # a walltime rotation of every replica at least once
            self.wait(lambda: self.rotations() >= len(MODELS) * MIN_REPLICAS, 240)
        remaining = end - time.monotonic()
        if remaining > 0 and not self.args.short:
            self.stop_event.wait(remaining)
        self.traffic.stop()

    def rotations(self) -> int:
        """Replicas drained for their walltime so far (the daemon's events say so)."""
        if not Path(self.deployment.db_path).exists():
            return 0
        store = open_store(self.deployment.db_path, readonly=True)
        try:
            events = store.events(limit=10_000)
        finally:
            store.close()
        return len({e.replica_id for e in events if e.replica_id and "walltime" in e.message})

    def clean_up(self) -> dict:
        """Whatever happened: every fault undone, ``coral-hpc down``, then what was left."""
        self.stop_event.set()
        self.traffic.stop()
        rotations = self.rotations()
        for node in list(self.drained):
            run_quiet(self.env, "scontrol", "update", f"NodeName={node}", "State=RESUME")
        if self.taken_jobs:
            run_quiet(self.env, "scancel", *self.taken_jobs)
        run_quiet(self.env, str(REPO / "scripts" / "dev-cluster"), "ctld-start", timeout=120)
        self.serve.stop()
        down = run_quiet(self.env, *CLI, "down", str(self.config), "--grace", "30",
                         timeout=300)
        time.sleep(5.0)
        left = [j.job_id for j in self.live_jobs()]
        leaked = leaked_processes(str(self.config), str(self.folder))
        if left:
            run_quiet(self.env, "scancel", *left)
        return {"walltime_rotations": rotations, "down_exit": down.returncode,
                "jobs_left_after_down": left, "leaked_processes": leaked}


def take_partition(env: dict, partition: str, seconds: float) -> list[str]:
    """As the other lab, hold every free GPU of ``partition``'s nodes for ``seconds``."""
    out = run_quiet(env, "sinfo", "-h", "-N", "-p", partition, "-O",
                    "NodeList:40,Gres:40,GresUsed:60")
    jobs = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        node, gres, used = parts[0], parts[1], parts[2]
        total, busy = _gpu_count(gres), _gpu_count(used)
        if total - busy <= 0:
            continue
        gpu_type = gres.split(":")[1]
        minutes = max(1, int(seconds // 60) + 1)
        sbatch = run_quiet(env, "runuser", "-u", OTHER_USER, "--", "sbatch", "--parsable",
                           "--chdir=/tmp", "-o", "/dev/null", "-e", "/dev/null", "-J", "other-lab",
                           "-A", "other-lab", "-p", partition, "-w", node,
                           f"--gres=gpu:{gpu_type}:{total - busy}", "-N", "1", "-n", "1",
                           "--cpus-per-task=1", "--mem=1G", f"--time={minutes}",
                           f"--wrap=sleep {int(seconds)}")
        if sbatch.returncode == 0:
            jobs.append(sbatch.stdout.strip().split(";")[0])
    return jobs


def _gpu_count(gres: str) -> int:
    """The count in sinfo's ``gpu:TYPE:N`` or ``gpu:TYPE:N(IDX:...)``; 0 without one."""
    match = re.match(r"gpu:[^:]+:(\d+)", gres)
    return int(match.group(1)) if match else 0


def rss_mib(pid: int | None) -> float | None:
    """VmRSS of ``pid`` in MiB; None when it does not run."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        return None
    return None


def leaked_processes(*needles: str) -> list[str]:
    """Processes still running whose command line names this run's config or folder."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(f"{proc.name}: {cmdline.strip()[:160]}")
    return found


def summarise(run: Run, left: dict, args: argparse.Namespace, seconds: float) -> dict:
    """The figures: requests and failures by reason, duplicates, orphans, leaks, RSS, recovery
    per fault kind."""
    def excused(answer: Answer) -> bool:
        return any(a <= answer.at <= b + 1.0 for a, b in run.gateway_down)

    failed = [a for a in run.answers if a.status != 200]
    counted = [a for a in failed if not excused(a)]
    reasons = Counter(f"{a.status} {a.detail[:80]}" for a in counted)
    by_kind: dict[str, list[float | None]] = {}
    for fault in run.faults:
        by_kind.setdefault(fault.kind, []).append(fault.recovered_s)
    rss = {key: [r[key] for r in run.rss if r[key] is not None]
           for key in ("daemon_mib", "gateway_mib")}
    return {
        "bench": "chaos",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "settings": {"minutes": args.minutes, "short": args.short, "seed": args.seed,
                     "mean_gap_s": args.mean_gap_s, "time_limit": args.time_limit,
                     "drain_s": args.drain_s, "outage_s": args.outage_s,
                     "taken_s": args.taken_s},
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True, check=False).stdout.strip(),
        "wall_s": round(seconds, 1),
        "requests": {"sent": len(run.answers), "failed": len(failed),
                     "failed_while_gateway_killed": len(failed) - len(counted),
                     "failed_counted": len(counted), "reasons": dict(reasons.most_common(10))},
        "failures": [_failure_row(a, run) for a in counted[:100]],
        "faults": [asdict(f) for f in run.faults],
        "recovery_s_by_kind": by_kind,
        "duplicates": run.duplicates,
        "orphans": run.orphans,
        **left,
        "rss_mib": {k: {"first": v[0] if v else None, "last": v[-1] if v else None,
                        "max": max(v) if v else None, "samples": len(v)}
                    for k, v in rss.items()},
    }


def _failure_row(answer: Answer, run: Run) -> dict:
    """A counted failure: when, what, and the last fault that began before it."""
    before = [f for f in run.faults if f.began <= answer.at]
    return {"at": time.strftime("%H:%M:%S", time.localtime(answer.at)), "model": answer.model,
            "status": answer.status, "detail": answer.detail[:120],
            "after_fault": f"{before[-1].kind} at "
                           f"{time.strftime('%H:%M:%S', time.localtime(before[-1].began))}"
                           if before else None}


def _recovery_rows(r: dict) -> str:
    def shown(s: float | None) -> str:
        return "-" if s is None else f"{s:g}"

    return "\n".join(f"| {kind} | {len(v)} | {', '.join(shown(s) for s in v)} |"
                     for kind, v in r["recovery_s_by_kind"].items())


def _rss_row(r: dict, key: str) -> str:
    figures = r["rss_mib"][key]
    return f"{figures['first']}, {figures['last']}, {figures['max']}"


def markdown(r: dict) -> str:
    """The results page."""
    req, settings = r["requests"], r["settings"]
    faults = ("the short CI version, one fault of each kind" if settings["short"] else
              f"faults at exponential gaps, mean {settings['mean_gap_s']:g} s")
    return f"""# Chaos soak (`bench/chaos.py`)

{r['when']} (code {r['commit']}): `coral-hpc serve` of two sim-engine models
(min_replicas 2 each) on the local cluster's a100 and v100 partitions for
{r['wall_s'] / 60:.0f} min ({faults}), time limit {settings['time_limit']} (every
replica rotated for its walltime), two clients each sending a
request every {PAUSE_S:g} s through the gateway; {r['host']['cpus']} CPUs, load average
{r['host']['load_avg_1m_at_end']} at the end.

| | |
|---|---|
| requests sent | {req['sent']} |
| failed | {req['failed']} |
| of those, while the gateway itself was killed | {req['failed_while_gateway_killed']} |
| failed, counted | {req['failed_counted']} |
| replicas rotated for their walltime | {r['walltime_rotations']} |
| duplicate jobs | {len(r['duplicates'])} |
| orphaned jobs | {len(r['orphans'])} |
| jobs left after `down` | {len(r['jobs_left_after_down'])} |
| processes left after `down` | {len(r['leaked_processes'])} |
| daemon RSS MiB (first, last, max) | {_rss_row(r, 'daemon_mib')} |
| gateway RSS MiB (first, last, max) | {_rss_row(r, 'gateway_mib')} |

Time from each fault until every model had {MIN_REPLICAS} READY replicas again (s; - = not
within the run):

| fault | count | recovered after (s) |
|---|---|---|
{_recovery_rows(r)}

Counted failures by reason: {req['reasons'] or 'none'}.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--short", action="store_true",
                        help="one fault of each kind, 5-minute time limit (the CI version)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mean-gap-s", type=float, default=240.0)
    parser.add_argument("--time-limit", default=None,
                        help="the replicas' time limit (default 00:10:00; --short 00:05:00)")
    parser.add_argument("--drain-s", type=float, default=120.0)
    parser.add_argument("--outage-s", type=float, default=45.0)
    parser.add_argument("--taken-s", type=float, default=150.0)
    parser.add_argument("--recover-timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None,
                        help="where chaos.json and chaos.md go (default bench/results)")
    args = parser.parse_args(argv)
    if args.short:
        args.minutes = min(args.minutes, 8.0)
        args.drain_s, args.outage_s, args.taken_s = 40.0, 25.0, 40.0
    # a replica serves until Slurm's warning 90 s before its limit: 5 minutes leave it 3.5, room
    # for a successor's start-up (up to ~50 s measured here with the faults on) and the lead
    args.time_limit = args.time_limit or ("00:05:00" if args.short else "00:10:00")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (a CI timeout, a kill) ends the run through the finally below: nothing left up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = dict(os.environ)
    env.setdefault("SLURM_CONF", DEV_SLURM_CONF)
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    folder = Path(tempfile.mkdtemp(prefix="coral-chaos-"))
    os.chmod(folder, 0o700)
    soak = Soak(args, folder, env)
    began = time.monotonic()
    try:
        soak.soak()
    finally:
        left = soak.clean_up()
    result = summarise(soak.run, left, args, time.monotonic() - began)
    out = args.out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "chaos.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
