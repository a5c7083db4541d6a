"""Packing by every resource a replica job asks for (issue 27, item 2): free GPUs, CPUs and memory
per node, with the per-GPU shape from one function (coral_hpc.slurm.job_shape) that the planner,
the ``sbatch --test-only`` probes and the replica's own sbatch all use.

``22.05/scontrol_show_node_memfull.txt`` is recorded from the local cluster while a job of ours
held all of v100-02's memory (``--mem=64G``, one CPU, no GPU): its 4 GPUs are idle, and nothing
that asks memory can start there."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.launch.spec import replica_spec
from coral_hpc.plan.availability import probe_shapes
from coral_hpc.plan.desired import plan_from_rows, slot_rows
from coral_hpc.plan.inputs import cluster_from_snapshot, fit_job_shape, job_shape, running_replicas
from coral_hpc.plan.planner import Planner
from coral_hpc.slurm.build import build_partitions
from coral_hpc.slurm.job_shape import ReplicaShape, replica_shape
from coral_hpc.slurm.parse_nodes import (
    parse_nodes_json,
    parse_nodes_text,
    parse_partitions_json,
    parse_partitions_text,
)
from coral_hpc.types import ReplicaLayout, StageLayout
from coral_solver.check import check_plan
from tests.unit.test_plan_planner import EXAMPLE, idle, recorded_snapshot, request
from tests.unit.test_slurm_snapshot import OBSERVE, REC, client

MEMFULL = "scontrol_show_node_memfull.txt"


def memfull_snapshot():
    """The recorded cluster with v100-02's memory all held; none of our jobs."""
    snapshot = client({**OBSERVE, "scontrol show node": MEMFULL})[0].snapshot("dep1")
    return replace(snapshot, jobs=())


def available(snapshot, running=()):
    cluster = Planner().inputs(request(snapshot, running=running))[1]
    return {n: f for g in cluster.node_groups for n, f in zip(g.nodes, g.free)}


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    return Planner(cache_dir=tmp_path_factory.mktemp("templates"))


# --------------------------------------------------------------------------- Slurm's figures


def test_recorded_node_with_idle_gpus_and_all_memory_held():
    nodes = {n.name: n for n in parse_nodes_text((REC / MEMFULL).read_text())}
    full = nodes["v100-02"]
    assert (full.gpus_total, full.gpus_alloc) == (4, 0)
    assert full.mem_alloc_gb == full.mem_gb == 64.0
    assert (full.cpus, full.cpus_alloc) == (16, 1)


def test_cpus_are_the_effective_ones_and_memory_less_what_slurm_keeps():
    line = (REC / MEMFULL).read_text().splitlines()[0]
    assert "CPUEfctv=16" in line and "RealMemory=65536" in line
    line = line.replace("CPUEfctv=16", "CPUEfctv=12").replace(
        "RealMemory=65536", "RealMemory=65536 MemSpecLimit=8192")
    node = parse_nodes_text(line)[0]
    assert (node.cpus, node.mem_gb) == (12, 56.0)
    # 23.02+ JSON: effective_cpus and specialized_memory
    data = {"nodes": [{"name": "n1", "state": ["IDLE"], "gres": "gpu:a100:4", "cpus": 16,
                       "effective_cpus": 12, "alloc_cpus": 0, "real_memory": 65536,
                       "specialized_memory": 8192, "alloc_memory": 0}]}
    node = parse_nodes_json(json.dumps(data))[0]
    assert (node.cpus, node.mem_gb) == (12, 56.0)


def test_partition_job_defaults_are_read_from_text_and_json():
    line = (REC / "scontrol_show_partition.txt").read_text().splitlines()[0]
    assert "JobDefaults=(null)" in line and "DefMemPerNode=UNLIMITED" in line
    bare = parse_partitions_text(line)[0]
    assert (bare.def_cpu_per_gpu, bare.def_mem_per_gpu_mb, bare.def_mem_per_cpu_mb) == (
        None, None, None)
    # hand-edited (the shared cluster's partitions are not changed to record it): the 22.05
    # spelling of JobDefaults and of a partition DefMemPerCPU
    line = line.replace("JobDefaults=(null)", "JobDefaults=DefCpuPerGPU=8,DefMemPerGPU=65536")
    line = line.replace("DefMemPerNode=UNLIMITED", "DefMemPerCPU=2048")
    part = parse_partitions_text(line)[0]
    assert (part.def_cpu_per_gpu, part.def_mem_per_gpu_mb, part.def_mem_per_cpu_mb) == (
        8, 65536, 2048)
    info = build_partitions([part], ())[0]
    assert (info.def_cpu_per_gpu, info.def_mem_per_gpu_mb, info.def_mem_per_cpu_mb) == (
        8, 65536, 2048)
    data = {"partitions": [{"name": "p", "partition": {"state": ["UP"]}, "nodes": {
        "configured": "n1"}, "defaults": {"job": "DefCpuPerGPU=8,DefMemPerGPU=65536",
                                          "partition_memory_per_cpu": {
                                              "set": True, "infinite": False, "number": 2048}}}]}
    part = parse_partitions_json(json.dumps(data))[0]
    assert (part.def_cpu_per_gpu, part.def_mem_per_gpu_mb, part.def_mem_per_cpu_mb) == (
        8, 65536, 2048)


# --------------------------------------------------------------------------- the one shape


def _site(cpu=None, mem_gpu=None, mem_cpu=None):
    part = recorded_snapshot().partitions[0]
    return replace(part, def_cpu_per_gpu=cpu, def_mem_per_gpu_mb=mem_gpu,
                   def_mem_per_cpu_mb=mem_cpu)


def test_models_yaml_wins_then_the_partition_defaults_then_ours():
    unset = load_deployment(EXAMPLE).cluster  # sets neither cpus_per_gpu nor mem_per_gpu_gb
    assert replica_shape(unset) == ReplicaShape(4, 32)  # the configured defaults
    assert replica_shape(unset, [_site()]) == ReplicaShape(4, 32)
    assert replica_shape(unset, [_site(cpu=8, mem_gpu=81920)]) == ReplicaShape(8, 80)
    # DefMemPerCPU × the CPUs per GPU, rounded up to whole GB
    assert replica_shape(unset, [_site(cpu=6, mem_cpu=1500)]) == ReplicaShape(6, 9)
    assert replica_shape(unset, [_site(mem_cpu=2048)]) == ReplicaShape(4, 8)
    # over several partitions the largest of each, so no stage asks more than was planned
    assert replica_shape(unset, [_site(cpu=8, mem_gpu=16384), _site(cpu=2, mem_gpu=32768)]) == (
        ReplicaShape(8, 32))
    given = unset.model_copy(update={"cpus_per_gpu": 2, "mem_per_gpu_gb": 10})
    given = type(unset).model_validate(given.model_dump())  # as if written in models.yaml
    assert replica_shape(given, [_site(cpu=8, mem_gpu=81920)]) == ReplicaShape(2, 10)


# --------------------------------------------------------------------------- the planner


def test_a_node_whose_memory_is_held_offers_no_gpus_however_many_are_idle():
    snapshot = memfull_snapshot()
    assert snapshot.node("v100-02").gpus_free == 4
    offered = available(snapshot)
    assert offered["v100-02"] == 0
    assert offered["v100-01"] == 2  # idle: 64 GB hold two 32 GB stages' worth


def test_our_replica_holding_a_nodes_memory_keeps_only_its_own_gpus():
    """The issue's case: a node with 2 idle GPUs whose memory our own replica's job holds. Its
    GPUs and the memory they asked for come back (it goes on serving); the idle ones do not."""
    snapshot = idle(recorded_snapshot())
    big = replace(snapshot.node("a100-01"), mem_gb=256.0)
    ours = replace(big, gpus_alloc=2, gpus_free=2, cpus_alloc=8, mem_alloc_gb=256.0)
    running = (("a100x2", ("a100",)),)

    def with_node(node, held):
        snap = replace(snapshot, nodes=tuple(node if n.name == node.name else n
                                             for n in snapshot.nodes))
        deployment = load_deployment(EXAMPLE)
        # the planner's own steps, with the GPUs held_gpus would read from squeue given
        cluster = cluster_from_snapshot(deployment, snap, running_replicas(running), held)
        cluster = fit_job_shape(cluster, snap, held, job_shape(deployment, snap))
        return {n: f for g in cluster.node_groups for n, f in zip(g.nodes, g.free)}[node.name]

    assert with_node(big, {}) == 4  # 256 GB idle: memory is no bound
    assert with_node(ours, {"a100-01": 2}) == 2  # the replica's own two, not the idle two
    # had its job asked only what the shape says (2 × 32 GB), the idle two could be planned
    assert with_node(replace(ours, mem_alloc_gb=64.0), {"a100-01": 2}) == 4


def test_the_plan_places_no_stage_on_the_node_without_memory(planner):
    snapshot = memfull_snapshot()
    outcome = planner(request(snapshot))
    solved = outcome.solved
    assert not check_plan(solved.plan, solved.models, solved.cluster)
    placed = [node for row in solved.plan.rows for nodes in row.nodes for node in nodes]
    assert placed and "v100-02" not in placed
    # every planned node has the CPUs and memory for the stages put on it
    used: dict[str, int] = {}
    for row in solved.plan.rows:
        for nodes in row.nodes:
            for node in nodes:
                used[node] = used.get(node, 0) + row.template.tp
    for name, gpus in used.items():
        node = snapshot.node(name)
        assert gpus * 4 <= node.cpus - node.cpus_alloc, name
        assert gpus * 32 <= node.mem_gb - node.mem_alloc_gb, name
    # the same cluster with v100-02's memory free: a GPU-only count would have used it
    freed = replace(snapshot, nodes=tuple(
        replace(n, mem_alloc_gb=0.0, cpus_alloc=0) if n.name == "v100-02" else n
        for n in snapshot.nodes))
    again = planner(request(freed)).solved.plan
    assert "v100-02" in [n for row in again.rows for nodes in row.nodes for n in nodes]


def test_site_defaults_decide_packing_billing_probes_and_what_the_job_asks(planner, tmp_path):
    """models.yaml sets no shape; the partitions say 8 CPUs and 16 GB per GPU. The planner packs
    16-CPU nodes with 2 GPUs each, bills 8 CPUs and 16 GB per GPU, and each slot carries the shape
    into the replica's sbatch request."""
    snapshot = idle(recorded_snapshot())
    snapshot = replace(snapshot, partitions=tuple(
        replace(p, def_cpu_per_gpu=8, def_mem_per_gpu_mb=16384) for p in snapshot.partitions))
    offered = available(snapshot)
    nodes = {n.name: n for n in snapshot.nodes}
    for name, free in offered.items():
        assert free == min(nodes[name].gpus_total, nodes[name].cpus // 8), name
    cluster = Planner().inputs(request(snapshot))[1]
    a100 = next(p for p in cluster.partitions if p.name == "a100")
    # TRESBillingWeights CPU=0.05,Mem=0.01G,GRES/gpu=2.5 with 8 CPUs and 16 GB per GPU
    assert a100.gpu_hour_cost("a100") == pytest.approx(0.05 * 8 + 0.01 * 16 + 2.5)
    outcome = planner(request(snapshot))
    assert outcome.desired.slots
    for slot in outcome.desired.slots:
        assert (slot.cpus_per_gpu, slot.mem_per_gpu_gb) == (8, 16)
    probes = probe_shapes(load_deployment(EXAMPLE), snapshot, outcome.solved.library)
    assert probes and {(p.cpus_per_gpu, p.mem_per_gpu_gb) for p in probes} == {(8, 16)}
    # a restarted daemon reads the shape back with its plan
    assert plan_from_rows(slot_rows(outcome.desired), 0.0).slots == outcome.desired.slots
    deployment = load_deployment(EXAMPLE)
    layout = ReplicaLayout(2, (StageLayout("a100", "a100", 80),), "auto")
    spec = replica_spec(deployment, "llama-70b", "r1", "t", layout, api_key_file=None,
                        shape=ReplicaShape(8, 16))
    request_ = spec.stage_request(spec.stages[0])
    assert (request_.cpus, request_.mem) == (16, "32G")
    plain = replica_spec(deployment, "llama-70b", "r2", "t", layout, api_key_file=None)
    assert (plain.cpus_per_gpu, plain.mem_per_gpu_gb) == (4, 32)  # a plan without a shape
