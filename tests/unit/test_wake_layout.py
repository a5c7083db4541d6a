"""Start-up per layout and the layout a wake from zero gets (coral_hpc.plan.layout_startup):
through the real planner (Stage 1 cached in a temp folder, Stage 2, the checker) on the example
deployment over the recorded local cluster, and the Retry-After the daemon then publishes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from coral_hpc.config import load_deployment
from coral_hpc.daemon.temperature import model_temperatures
from coral_hpc.daemon.wake import wake_infos
from coral_hpc.demand import deployment_demand
from coral_hpc.gateway.wake import retry_after_s
from coral_hpc.plan.layout_startup import (
    LayoutStartup,
    layout_startup,
    own_layout_startups,
    profile_startups,
)
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.reconcile import ReplicaFacts, ReplicaState
from coral_hpc.reconcile.idle import IdleRule, IdleTracker
from coral_hpc.reconcile.status import ReplicaStatus
from coral_hpc.records import ReplicaRecord
from coral_hpc.types import ReplicaLayout, StageLayout
from tests.unit.test_plan_planner import EXAMPLE, idle, recorded_snapshot

MODEL = "qwen3-8b"
DEFAULT_S = 600.0  # the deployment-wide start-up layouts never seen fall back to


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    return Planner(cache_dir=tmp_path_factory.mktemp("templates"))


def wake_request(own=None, waking=True, alone=False):
    """The example with qwen3-8b woken from zero: no demand measured yet, one replica asked
    (what the idle rule plans for a woken model), nothing running. ``alone``: the example's
    other models left out, so every layout of qwen3-8b has GPUs free."""
    base = load_deployment(EXAMPLE)
    models = tuple(m.model_copy(update={"min_replicas": 1}) if m.name == MODEL else m
                   for m in base.models if m.name == MODEL or not alone)
    deployment = base.model_copy(update={"models": models})
    demand = deployment_demand(deployment, [])
    demand[MODEL] = replace(demand[MODEL], requests_per_s=0.0, planned_rps=0.0, sized_rps=0.0)
    return PlanRequest(deployment, idle(recorded_snapshot()), demand, (), frozenset(),
                       frozenset(), DEFAULT_S, frozenset({MODEL}) if waking else frozenset(),
                       own or {})


def chosen(outcome):
    (slot,) = [s for s in outcome.desired.slots if s.model == MODEL]
    return slot


def test_a_wake_takes_the_cheapest_layout_when_start_ups_are_alike(planner):
    plain = planner(wake_request(waking=False))
    woken = planner(wake_request())
    assert woken.status == "optimal" and not woken.problems
    assert chosen(woken).template_id == chosen(plain).template_id
    assert any(f"model {MODEL} woken from zero" in line for line in woken.solved.plan.binding)


def test_a_wake_takes_a_dearer_layout_that_loads_in_40_s_over_a_cheap_one_of_6_min(planner):
    # qwen3-8b alone: the other models' replicas would decide which GPU types have room
    plain = planner(wake_request(alone=True))
    cheap, library = chosen(plain), plain.solved.library[MODEL]
    dearer = next(t for t in library if t.id != cheap.template_id and t.pp == 1)
    own = {cheap.template_id: LayoutStartup(360.0, "replicas"),
           dearer.id: LayoutStartup(40.0, "replicas")}
    woken = planner(wake_request(own, alone=True))
    assert woken.status == "optimal" and not woken.problems
    slot = chosen(woken)
    assert slot.template_id == dearer.id and slot.cost_per_hour > cheap.cost_per_hour
    # not a wake (the model has a replica, or does not scale to zero): cost decides, as before
    assert chosen(planner(wake_request(own, waking=False, alone=True))).template_id == (
        cheap.template_id)


def test_start_up_per_layout_comes_from_own_replicas_then_a_measured_profile_then_default(
        tmp_path):
    layout = ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto")
    records = [ReplicaRecord(f"r{i}", MODEL, "qwen3-8b.tp1.a100-36", layout, ("a100",), 2.0,
                             1.0, 0.0, started_at=100.0 * i, ready_at=100.0 * i + s)
               for i, s in enumerate((50.0, 40.0, 45.0))]
    own = own_layout_startups(records)
    assert own["qwen3-8b.tp1.a100-36"].seconds == 45.0
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "Qwen3-8B__v100__tp2.yaml").write_text(yaml.safe_dump(
        {"arch": "Qwen/Qwen3-8B", "gpu": "v100", "tp": 2, "startup_s": 95.0}))
    profiles = profile_startups([folder])
    default = LayoutStartup(DEFAULT_S, "default")
    arch = load_deployment(EXAMPLE).models[0].arch_key
    assert layout_startup("qwen3-8b.tp1.a100-36", arch, ["a100"], 1, own, profiles,
                          default).seconds == 45.0
    found = layout_startup("qwen3-8b.tp2.v100-36", arch, ["v100"], 2, own, profiles, default)
    assert (found.seconds, found.source) == (95.0, "measured profile Qwen3-8B__v100__tp2.yaml")
    assert layout_startup("qwen3-8b.tp1.a100-80g-36", arch, ["a100-80g"], 1, own, profiles,
                          default) is default


def test_retry_after_uses_the_start_up_of_the_layout_the_wake_chose():
    """A woken model's replica queued on a layout that loads in 40 s, Slurm expecting it to
    start in 100 s: Retry-After 140 s, not Slurm's start plus the deployment-wide 600 s."""
    now = 10_000.0
    layout = ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto")
    record = ReplicaRecord("r1", MODEL, "qwen3-8b.tp1.a100-36", layout, ("a100",), 2.0, 1.0,
                           now, submitted_at=now, expected_start=now + 100.0)
    statuses = {"r1": ReplicaStatus("r1", ReplicaState.PENDING)}
    tracker = IdleTracker({MODEL: IdleRule(1200.0, 300.0)})
    tracker.seed({MODEL: now}, [], now)
    startups = {"qwen3-8b.tp1.a100-36": 40.0}
    info = wake_infos(tracker, [ReplicaFacts(record)], statuses, DEFAULT_S, now, {},
                      lambda r: startups[r.template_id])[MODEL]
    assert (info.state, info.startup_s, info.ready_by) == ("waking", 40, now + 140.0)
    assert retry_after_s(info, 10, now=now) == 140
    # without a layout's own figure: the deployment-wide start-up
    plain = wake_infos(tracker, [ReplicaFacts(record)], statuses, DEFAULT_S, now, {})[MODEL]
    assert retry_after_s(plain, 10, now=now) == 700
    # `status` says the same READY time
    base = load_deployment(EXAMPLE)
    deployment = base.model_copy(update={"policy": base.policy.model_copy(
        update={"idle_after": 1200.0})})
    shown = model_temperatures(deployment, [record], statuses, {}, DEFAULT_S,
                               lambda r: startups[r.template_id])[MODEL]
    assert (shown["state"], shown["ready_by"]) == ("waking", now + 140.0)


class RecordingProber:
    """A prober that answers nothing new and says which shapes it was asked about."""

    def __init__(self):
        self.asked = []

    def cached(self):
        return ()

    def estimates(self, shapes):
        self.asked.extend(shapes)
        return ()


def test_a_wake_asks_slurm_when_the_woken_models_shapes_would_start(tmp_path):
    """On a cluster with room a plan asks Slurm nothing; a wake asks about the woken model's
    shapes: where its first replica starts soonest is Slurm's to say."""
    prober = RecordingProber()
    planner = Planner(cache_dir=tmp_path, prober=prober)
    plain = planner(wake_request(waking=False))
    assert plain.status == "optimal" and prober.asked == []
    woken = planner(wake_request())
    assert woken.status == "optimal" and prober.asked
    # every homogeneous layout of the woken model that could start now is asked about (and
    # those that wait for busy nodes too)
    shapes = {(t.stages[0].gpu_type, t.tp, t.pp) for t in plain.solved.library[MODEL]
              if not t.heterogeneous}
    assert shapes <= {(s.gpu_type, s.gpus_per_node, s.nodes) for s in prober.asked}
