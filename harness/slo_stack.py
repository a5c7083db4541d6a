"""A planned deployment running for real on this machine, without Slurm: the solver's plan for the
local cluster's GPUs, one sim engine process per planned replica with that replica's layout, the
routing table with the planned throughputs as weights, and the gateway in front.

Used by ``tests/e2e/test_slo_under_load.py`` and ``bench/slo.py``. The plan is computed exactly as
the daemon's is meant to (Stage 1 + Stage 2 of the solver, demand = declared × (1 + headroom) from
:func:`coral_hpc.demand.deployment_demand`), but for a *fixed* availability: every GPU of the local
dev cluster free (``scripts/dev-cluster``: 2 nodes × 4 V100, 2 × 4 A100, 1 × 8 A100-80G, its
TRESBillingWeights as prices). No Slurm job runs; the engines are plain processes.

**Time scale.** A model's engines may run at ``--sim-speed k``: every step takes 1/k of the modelled
time. Its replay then arrives k times faster and is judged against SLO/k. The engine's scheduler
has no notion of time — it orders arrivals and step completions — so that system is the same
queueing system with its clock divided by k: the same batches, the same requests within SLO
(``tests/unit/test_replay.py`` checks this on the engine's own scheduler). What does not scale is
what the machine adds (HTTP, the gateway hop, event-loop wake-ups: a few ms), which is why k stays
small and is used only where a model's requests would otherwise outlast the test (Llama-70B's
hundreds of tokens at 150 ms each).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from coral_hpc.config import Deployment, load_deployment
from coral_hpc.demand import deployment_demand
from coral_hpc.loadtest.replay import ReplayJob, Slo
from coral_hpc.loadtest.workload import Mix, workload
from coral_solver import catalog
from coral_solver.allocate import allocate
from coral_solver.templates import build_library
from coral_solver.types import Billing, Cluster, ModelSpec, NodeGroup, Partition, Plan, PlanRow
from harness.gateway import REPO, Proc, start_gateway, write_table

EXAMPLE = REPO / "examples" / "models.yaml"

#: The local dev cluster (scripts/dev-cluster): node group → (GPU type, GPUs per node, nodes).
DEV_NODES = {
    "v100": ("v100", 4, ("v100-01", "v100-02")),
    "a100": ("a100", 4, ("a100-01", "a100-02")),
    "a100-80g": ("a100-80g", 8, ("a100-80g-01",)),
}
#: Its partitions' TRESBillingWeights: CPU=0.05, Mem=0.01G and GRES/gpu per partition.
DEV_GPU_WEIGHT = {"v100": 1.0, "a100": 2.5, "a100-80g": 3.5}


def dev_cluster(deployment: Deployment) -> Cluster:
    """Every GPU of the local dev cluster available, priced by its billing weights."""
    groups = tuple(
        NodeGroup(name, gpu, per_node, catalog.gpu_spec(gpu).memory_gb, nodes,
                  tuple(per_node for _ in nodes))
        for name, (gpu, per_node, nodes) in DEV_NODES.items()
    )
    shape = deployment.cluster
    partitions = tuple(
        Partition(p.name, (p.name,), billing=Billing(
            cpu=0.05, mem_gb=0.01, gpu=DEV_GPU_WEIGHT[p.name],
            cpus_per_gpu=shape.cpus_per_gpu, mem_per_gpu_gb=shape.mem_per_gpu_gb))
        for p in shape.partitions
    )
    return Cluster(groups, partitions)


def model_specs(deployment: Deployment) -> list[ModelSpec]:
    """The solver's view of the deployment's models at their planned (declared + headroom)
    demand."""
    demand = deployment_demand(deployment, [])
    return [
        ModelSpec(m.name, m.architecture, m.mix.input_tokens, m.mix.output_tokens,
                  m.slo.ttft_s, m.slo.tpot_s, demand_rps=demand[m.name].planned_rps,
                  priority=m.priority, min_replicas=m.min_replicas, max_replicas=m.max_replicas,
                  gpu_types=tuple(m.gpu_types or ()), partitions=tuple(m.partitions or ()))
        for m in deployment.models
    ]


def plan_for(deployment: Deployment, cache_dir: Path | None = None) -> Plan:
    """Stage 1 + Stage 2 for the deployment on the whole dev cluster."""
    cluster = dev_cluster(deployment)
    models = model_specs(deployment)
    library = build_library(models, cluster.gpu_types(), cache_dir=cache_dir)
    return allocate(models, library, cluster)


@dataclass
class Replica:
    """One running sim engine standing for one planned replica."""

    id: str
    model: str
    row: PlanRow
    proc: Proc


@dataclass
class Stack:
    """The running deployment: replicas, gateway, and what the plan promised."""

    deployment: Deployment
    plan: Plan
    replicas: list[Replica]
    gateway: Proc
    max_model_len: dict[str, int]
    speeds: dict[str, float]

    def mix(self, model: str) -> Mix:
        m = self.deployment.model(model)
        return Mix(m.mix.input_tokens, m.mix.output_tokens)

    def speed(self, model: str) -> float:
        return self.speeds.get(model, 1.0)

    def slo(self, model: str) -> Slo:
        """The model's SLO on its engines' clock (divided by their ``--sim-speed``)."""
        m = self.deployment.model(model)
        return Slo(m.slo.ttft_s / self.speed(model), m.slo.tpot_s / self.speed(model))

    def planned_rps(self, model: str) -> float:
        """The demand the plan serves for ``model`` (requests/s of its mix, real time)."""
        return float(self.plan.served.get(model, 0.0))

    def capacity_rps(self, model: str) -> float:
        """What the planned replicas of ``model`` sustain within its SLO, per the plan."""
        return float(self.plan.capacity.get(model, 0.0))

    def replay_job(self, model: str, load_factor: float, duration_s: float,
                   start: int) -> ReplayJob:
        """``model``'s trace slice at ``load_factor`` × its planned demand (on its engines'
        clock), arriving over ``duration_s`` wall seconds."""
        rate = self.planned_rps(model) * load_factor * self.speed(model)
        load = workload(self.mix(model), rate, duration_s, start=start,
                        max_model_len=self.max_model_len[model])
        return ReplayJob(model, load, self.slo(model))

    def stop(self) -> None:
        self.gateway.stop()
        for rep in self.replicas:
            rep.proc.stop()


def engine_argv(deployment: Deployment, row: PlanRow, served_name: str,
                speed: float = 1.0) -> list[str]:
    """The sim engine command line of one replica of ``row`` (layout as the launcher passes it)."""
    model = deployment.model(row.model)
    t = row.template
    length = ["--max-model-len", str(model.max_model_len)] if model.max_model_len else []
    return [
        sys.executable, "-m", "coral_hpc.engine.sim", model.source,
        "--sim-arch", model.architecture,
        "--sim-gpu-types", ",".join(s.gpu_type for s in t.stages),
        "--sim-layers", t.layer_partition,
        "--served-model-name", served_name,
        "--tensor-parallel-size", str(t.tp), "--pipeline-parallel-size", str(t.pp),
        "--host", "127.0.0.1", "--port", "0", "--sim-speed", repr(speed), *length,
    ]


def _await_sims(starting: list[tuple[str, subprocess.Popen, Path]], timeout: float) -> list[Proc]:
    deadline = time.monotonic() + timeout
    ready: dict[str, Proc] = {}
    while len(ready) < len(starting) and time.monotonic() < deadline:
        for rid, popen, log in starting:
            if rid in ready:
                continue
            match = re.search(r"on http://(127\.0\.0\.1:\d+)", log.read_text())
            if match:
                ready[rid] = Proc(popen, match.group(1), log)
            elif popen.poll() is not None:
                raise AssertionError(f"sim engine {rid} exited {popen.returncode}: "
                                     f"{log.read_text()[-2000:]}")
        time.sleep(0.05)
    missing = [rid for rid, _, _ in starting if rid not in ready]
    if missing:
        for _, popen, _ in starting:
            popen.kill()
        raise AssertionError(f"sim engines {missing} did not start within {timeout:.0f}s")
    return [ready[rid] for rid, _, _ in starting]


def _served_max_model_len(url: str, key: str) -> int:
    request = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return int(json.loads(resp.read())["data"][0]["max_model_len"])


def start_stack(tmp: Path, models_yaml: Path = EXAMPLE, plan: Plan | None = None,
                speeds: dict[str, float] | None = None) -> Stack:
    """Plan ``models_yaml`` for the dev cluster (unless ``plan`` is given), start one sim engine
    per planned replica (at ``speeds[model]``, default 1), publish the routing table (weight =
    planned throughput) and start the gateway. The deployment's state paths go into ``tmp``."""
    speeds = dict(speeds or {})
    tmp.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load(Path(models_yaml).read_text())
    data["state_dir"], data["db_path"] = str(tmp / "state"), str(tmp / "daemon.db")
    local_yaml = tmp / "models.yaml"
    local_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    deployment = load_deployment(local_yaml)
    plan = plan if plan is not None else plan_for(deployment, cache_dir=tmp / "templates")
    key = secrets.token_hex(16)
    key_file = tmp / "replica.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    starting, rows = [], []
    for r, row in enumerate(plan.rows):
        for i in range(row.count):
            rid = f"{row.model}-r{r}.{i}"
            log = tmp / f"{rid}.log"
            popen = subprocess.Popen(
                engine_argv(deployment, row, row.model, speeds.get(row.model, 1.0)),
                stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=REPO,
                env={**os.environ, "VLLM_API_KEY": key},  # the key never goes in argv
            )
            starting.append((rid, popen, log))
            rows.append(row)
    procs = _await_sims(starting, timeout=30)
    replicas = [Replica(rid, row.model, row, proc)
                for (rid, _, _), row, proc in zip(starting, rows, procs)]
    max_len: dict[str, int] = {}
    for rep in replicas:
        length = _served_max_model_len(rep.proc.url, key)
        max_len[rep.model] = min(length, max_len.get(rep.model, length))
    table = tmp / "routing-table.json"
    write_table(table, 1, {
        m.name: [(rep.id, rep.proc.url, rep.row.throughput) for rep in replicas
                 if rep.model == m.name]
        for m in deployment.models
    })
    try:
        gateway = start_gateway(tmp, local_yaml, table, "--replica-key-file", str(key_file))
    except BaseException:
        for rep in replicas:
            rep.proc.stop()
        raise
    return Stack(deployment, plan, replicas, gateway, max_len, speeds)
