"""The one planner (coral_hpc.plan.planner) without Slurm: solver inputs from a snapshot built
from recorded Slurm 22.05 output, and whole plans for the example deployment on the local
cluster's shape, through the real Stage 1 (cached in a temp folder) and Stage 2."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.demand import Mix, ModelDemand, deployment_demand
from coral_hpc.plan.inputs import excluded_stages, placeable
from coral_hpc.plan.planner import Planner, PlanningError, PlanRequest
from coral_solver.types import Cluster, NodeGroup, Stage, Template
from tests.conftest import REPO
from tests.unit.test_slurm_snapshot import client

EXAMPLE = REPO / "examples" / "models.yaml"


def recorded_snapshot():
    """Recorded output: a100-02 and v100-02 drained; job 50 (a100x2) holds 2 GPUs of a100-01,
    job 56 (a100-80gx8) all of a100-80g-01, jobs 58/59 (v100x1) one each of v100-01."""
    return client()[0].snapshot("dep1")


def idle(snapshot):
    """The same cluster with every node idle and up, and none of our jobs."""
    nodes = tuple(replace(n, state="idle", slurm_state="IDLE", gpus_alloc=0, cpus_alloc=0,
                          mem_alloc_gb=0.0, gpus_free=n.gpus_total) for n in snapshot.nodes)
    return replace(snapshot, nodes=nodes, jobs=())


def request(snapshot, running=(), templates=frozenset(), shapes=frozenset(), demand=None,
            startup_s=10.0):
    deployment = load_deployment(EXAMPLE)
    demand = demand or deployment_demand(deployment, [])
    return PlanRequest(deployment, snapshot, demand, tuple(running), frozenset(templates),
                       frozenset(shapes), startup_s)


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    return Planner(cache_dir=tmp_path_factory.mktemp("templates"))


def solver_inputs(req):
    return Planner().inputs(req)


# --------------------------------------------------------------------------- snapshot → cluster


def cluster_of(snapshot, running=()):
    return solver_inputs(request(snapshot, running=running))[1]


def test_available_gpus_are_free_plus_what_serving_replicas_hold():
    snapshot = recorded_snapshot()
    free = {n.name: n.gpus_free for n in snapshot.nodes}
    cluster = cluster_of(snapshot, (("a100x2", ("a100",)),))
    available = {node: f for g in cluster.node_groups for node, f in zip(g.nodes, g.free)}
    assert available["a100-01"] == free["a100-01"] + 2  # job 50 goes on serving: its 2 GPUs
    assert available["a100-02"] == 0 and available["v100-02"] == 0  # drained
    # job 56 and jobs 58/59 are not listed as going on serving: their GPUs are not offered
    assert available["a100-80g-01"] == free["a100-80g-01"]
    assert available["v100-01"] == free["v100-01"]
    assert [(r.template_id, r.partitions, r.count) for r in cluster.running] == [
        ("a100x2", ("a100",), 1)]
    without = cluster_of(snapshot)
    assert {n: f for g in without.node_groups for n, f in zip(g.nodes, g.free)}["a100-01"] == (
        free["a100-01"])
    assert without.running == ()


def test_partitions_are_the_configured_ones_priced_by_slurm_billing_weights():
    cluster = cluster_of(recorded_snapshot())
    names = {p.name: p for p in cluster.partitions}
    assert sorted(names) == ["a100", "a100-80g", "v100"]  # not the catch-all "gpu"
    a100 = names["a100"]
    # TRESBillingWeights CPU=0.05,Mem=0.01G,GRES/gpu=2.5 with 4 CPUs and 32 GB per GPU
    assert a100.gpu_hour_cost("a100") == pytest.approx(0.05 * 4 + 0.01 * 32 + 2.5)
    groups = {g.name: g for g in cluster.node_groups}
    assert {groups[n].gpu_type for n in a100.node_groups} == {"a100"}
    nodes = [n for g in cluster.node_groups for n in g.nodes]
    assert sorted(nodes) == sorted(set(nodes))  # each node in exactly one group


def test_k_is_the_learnt_startup_over_the_replan_interval():
    _, _, policy = solver_inputs(request(recorded_snapshot(), startup_s=45.0))
    interval = load_deployment(EXAMPLE).policy.replan_interval_s
    assert policy.startup_penalty == pytest.approx(45.0 / interval)


def test_gpus_a_node_offers_are_capped_by_the_cpus_and_memory_a_replica_asks_per_gpu():
    # the example asks 4 CPUs and 32 GB per GPU; the recorded nodes have 16 CPUs and 64 GB
    snapshot = idle(recorded_snapshot())
    nodes = {n.name: n for n in snapshot.nodes}
    available = {n: f for g in cluster_of(snapshot).node_groups for n, f in zip(g.nodes, g.free)}
    for name, free in available.items():
        node = nodes[name]
        assert free == min(node.gpus_total, node.cpus // 4, int(node.mem_gb // 32)), name
    # memory another job holds counts; what our serving replica holds comes back with its GPUs
    busy = replace(snapshot, nodes=tuple(
        replace(n, mem_alloc_gb=40.0, cpus_alloc=4, gpus_alloc=1, gpus_free=n.gpus_total - 1)
        if n.name == "a100-01" else n for n in snapshot.nodes))
    assert {n: f for g in cluster_of(busy).node_groups
            for n, f in zip(g.nodes, g.free)}["a100-01"] == 0  # 24 GB left: no 32 GB stage


def test_a_drained_partition_is_not_usable():
    snapshot = recorded_snapshot()
    drained = replace(snapshot, partitions=tuple(
        replace(p, state="drain") if p.name == "a100" else p for p in snapshot.partitions))
    usable = {p.name: p.usable for p in cluster_of(drained).partitions}
    assert usable == {"v100": True, "a100": False, "a100-80g": True}


# --------------------------------------------------------------------------- library filters


def _template(model, tp, *gpus):
    return Template(model, tp, tuple(Stage(g, 10) for g in gpus), 1.0)


def test_placeable_needs_a_node_with_room_for_every_stage():
    cluster = Cluster((NodeGroup("big", "a100-80g", 8, 80, ("n1",), (8,)),
                       NodeGroup("small", "v100", 4, 16, ("v1", "v2"), (4, 1))), ())
    one_big = _template("m", 2, "a100-80g", "v100")
    two_big = _template("m", 1, "a100-80g", "a100-80g", "v100")  # 2 stages, 1 a100-80g node
    two_v100_tp2 = _template("m", 2, "v100", "v100")  # v2 has 1 GPU free: no room for tp 2
    two_v100_tp1 = _template("m", 1, "v100", "v100")
    kept = placeable({"m": [one_big, two_big, two_v100_tp2, two_v100_tp1]}, cluster)["m"]
    assert kept == [one_big, two_v100_tp1]


def test_excluded_shapes_become_excluded_stages():
    hetero = _template("m", 2, "a100", "v100")
    single = _template("m", 1, "a100")
    shapes = {(hetero.id, ("a100", "v100")), (single.id, ("a100",)), ("gone", ("x",))}
    assert excluded_stages({"m": [hetero, single]}, frozenset(shapes)) == {
        (hetero.id, "a100", "a100"), (hetero.id, "v100", "v100"), (single.id, "a100", "a100")}


# --------------------------------------------------------------------------- whole plans


def test_the_example_is_planned_on_the_local_cluster_shape(planner):
    outcome = planner(request(idle(recorded_snapshot())))
    assert outcome.status == "optimal"
    by_model = {}
    for slot in outcome.desired.slots:
        by_model.setdefault(slot.model, []).append(slot)
        assert slot.layout.pp == len(slot.partitions) == len(slot.layout.stages)
    assert sorted(by_model) == ["llama-70b", "phi-4", "qwen3-8b"]
    demand = deployment_demand(load_deployment(EXAMPLE), [])
    for model, slots in by_model.items():
        assert sum(s.count * s.throughput for s in slots) >= demand[model].planned_rps
        assert outcome.served[model] == pytest.approx(demand[model].planned_rps)
    assert outcome.cost_per_hour == pytest.approx(
        sum(s.count * s.cost_per_hour for s in outcome.desired.slots))
    # every planned template can give each stage a node of its own (one a100-80g node here)
    for slot in outcome.desired.slots:
        assert slot.layout.gpu_types.count("a100-80g") <= 1


def test_a_template_on_cool_down_is_not_planned(planner):
    first = planner(request(idle(recorded_snapshot())))
    qwen = next(s for s in first.desired.slots if s.model == "qwen3-8b")
    again = planner(request(idle(recorded_snapshot()), templates={qwen.template_id}))
    assert qwen.template_id not in {s.template_id for s in again.desired.slots}
    assert any(s.model == "qwen3-8b" for s in again.desired.slots)


def test_an_excluded_shape_moves_the_template_or_the_model_elsewhere(planner):
    first = planner(request(idle(recorded_snapshot())))
    qwen = next(s for s in first.desired.slots if s.model == "qwen3-8b")
    shape = (qwen.template_id, qwen.partitions)
    again = planner(request(idle(recorded_snapshot()), shapes={shape}))
    assert shape not in {(s.template_id, s.partitions) for s in again.desired.slots}
    assert any(s.model == "qwen3-8b" for s in again.desired.slots)


def test_a_running_replica_is_kept_rather_than_moved_to_a_cheaper_place(planner):
    """With K large a running replica of a dearer template stays; with K = 0 it is moved."""
    snapshot = idle(recorded_snapshot())
    first = planner(request(snapshot))
    chosen = {(s.template_id, s.partitions) for s in first.desired.slots}
    # a single-stage phi-4 template the optimal plan left out
    dearer = next(t for t in first.solved.library["phi-4"]
                  if t.pp == 1 and (t.id, (_partition(t),)) not in chosen)
    running = ((dearer.id, (_partition(dearer),)),)
    kept = planner(request(snapshot, running=running, startup_s=1e6))
    assert running[0] in {(s.template_id, s.partitions) for s in kept.desired.slots}
    moved = planner(request(snapshot, running=running, startup_s=0.0))
    assert running[0] not in {(s.template_id, s.partitions) for s in moved.desired.slots}


def _partition(template) -> str:
    return template.stages[0].gpu_type  # the example names each partition after its GPU type


def test_demand_is_planned_with_the_measured_mix(planner):
    snapshot = idle(recorded_snapshot())
    base = deployment_demand(load_deployment(EXAMPLE), [])
    longer = {**base, "qwen3-8b": ModelDemand("qwen3-8b", 4.0, 4.8, Mix(4096, 1024), "measured")}
    outcome = planner(request(snapshot, demand=longer))
    spec = next(m for m in outcome.solved.models if m.name == "qwen3-8b")
    assert (spec.input_tokens, spec.output_tokens, spec.demand_rps) == (4096, 1024, 4.8)


def test_no_plan_at_all_raises_instead_of_an_empty_plan(planner):
    """An empty plan would drain every replica: a plan the daemon must not act on raises."""
    deployment = load_deployment(EXAMPLE)
    everything_drained = replace(idle(recorded_snapshot()), partitions=tuple(
        replace(p, state="drain") for p in recorded_snapshot().partitions))
    strict = deployment.model_copy(update={"models": tuple(
        m.model_copy(update={"min_replicas": 1}) for m in deployment.models)})
    req = PlanRequest(strict, everything_drained, deployment_demand(strict, []), (),
                      frozenset(), frozenset(), 10.0)
    with pytest.raises(PlanningError, match="min_replicas"):
        planner(req)


def test_the_policy_serve_plans_with_sets_every_solver_knob_it_configures():
    """policy: in models.yaml is the one place these defaults live: policy_of passes each of them,
    so solver.Policy's own defaults (for the solver used alone) never decide what serve does."""
    from coral_hpc.config import PolicyConfig
    from coral_hpc.plan.inputs import policy_of

    deployment = load_deployment(EXAMPLE)
    changed = deployment.model_copy(update={"policy": PolicyConfig(
        n_max=3, rho=5.0, heterogeneous=False, solver_time_limit_s=2.0, solver_mip_gap=0.01,
        startup_time_s=120.0, replan_interval_s=60.0)})
    policy = policy_of(changed)
    assert (policy.n_max, policy.rho, policy.heterogeneous, policy.time_limit_s,
            policy.mip_gap, policy.startup_penalty) == (3, 5.0, False, 2.0, 0.01, 2.0)
