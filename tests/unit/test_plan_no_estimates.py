"""Issue 27 item 4: no estimates, no queue. On a full site without Slurm's start estimates (a
saved snapshot without them, or ``sbatch --test-only`` refused or rate-limited), ``plan`` exited
2: "min_replicas: 1 replica(s) of llama-8b cannot all be placed on the GPUs available now". Busy
is not invalid input: a person would still queue. Now every model still gets its best shape
queued, marked "start unknown", and ``plan`` exits 0; a ``min_replicas`` beyond the whole
cluster's GPUs (even if all were free) stays exit 2 naming the field.

The snapshot is tests/data/plan/university-busy-snapshot.json (every GPU held by other users)
with its estimates removed, as ``coral-hpc cluster --json`` writes one."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from coral_hpc.config import load_deployment
from coral_hpc.plan.desired import plan_from_rows, slot_rows
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_solver.queue import queue_unplaced
from coral_solver.types import (
    Cluster,
    ModelSpec,
    NodeGroup,
    Partition,
    Plan,
    QueueOption,
    Stage,
    Template,
)

REPO = Path(__file__).resolve().parents[2]
UNIVERSITY = REPO / "examples" / "university.yaml"
BUSY = REPO / "tests" / "data" / "plan" / "university-busy-snapshot.json"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """The full site's snapshot without a single start estimate."""
    snapshot = ClusterSnapshot.from_json(BUSY.read_text())
    assert snapshot.estimates and not any(n.gpus_free for n in snapshot.nodes)
    path = tmp_path_factory.mktemp("snapshot") / "full-no-estimates.json"
    path.write_text(replace(snapshot, estimates=()).to_json())
    return path


def wanted(deployment) -> set[str]:
    """Models with something to serve: declared demand or min_replicas (``auto`` counts 0)."""
    return {m.name for m in deployment.models
            if m.min_replicas or getattr(m.demand, "requests_per_s", None)
            or getattr(m.demand, "output_tokens_per_s", None)}


def plan_cli(*args: str):
    return CliRunner().invoke(plan_command, list(args), env={"COLUMNS": "250"})


def test_a_full_site_without_estimates_queues_every_model_with_start_unknown(full, cache):
    out = plan_cli(str(UNIVERSITY), "--snapshot", str(full), "--cache-dir", str(cache), "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    queued = {r["model"]: r for r in doc["replicas"] if r["queued"]}
    assert set(queued) == wanted(load_deployment(UNIVERSITY)) and "llama-8b" in queued
    assert all(r["start"] == "start unknown" and r["start_known"] is False
               and r["expected_wait_s"] is None for r in queued.values())
    assert not [r for r in doc["replicas"] if not r["queued"]]  # nothing is free now
    assert doc["checker_problems"] == []
    assert any("start unknown" in b for b in doc["binding"])

    table = plan_cli(str(UNIVERSITY), "--snapshot", str(full), "--cache-dir", str(cache))
    assert table.exit_code == 0, table.output
    assert "start unknown" in table.output and "llama-8b" in table.output


def test_sbatch_test_only_refused_still_queues_with_start_unknown(full, cache):
    class Refused:  # StartProber's interface: Slurm refused or rate-limited every probe
        asked = 0

        def cached(self):
            return ()

        def estimates(self, shapes):
            self.asked += 1
            return ()

    deployment = load_deployment(UNIVERSITY)
    prober = Refused()
    outcome = Planner(cache_dir=cache, prober=prober).solve(PlanRequest.from_snapshot(
        deployment, ClusterSnapshot.from_json(full.read_text())))
    assert prober.asked == 1
    assert outcome.status not in ("infeasible", "no_solution") and outcome.problems == ()
    plan = outcome.solved.plan
    assert {r.model for r in plan.queued} == wanted(deployment)
    assert all(not r.start_known for r in plan.queued)
    assert all(s.queued and s.start_known is False for s in outcome.desired.slots)
    (llama,) = [s for s in outcome.desired.slots if s.model == "llama-8b"]
    assert llama.count == 1
    # a restarted daemon reads the plan back with its starts still unknown
    assert plan_from_rows(slot_rows(outcome.desired), 0.0).slots == outcome.desired.slots


def test_min_replicas_beyond_the_whole_cluster_still_exits_2_naming_the_field(
        full, cache, tmp_path):
    config = yaml.safe_load(UNIVERSITY.read_text())
    config["models"][0]["min_replicas"] = 500  # llama-8b: more GPUs than the site has
    bad = tmp_path / "university.yaml"
    bad.write_text(yaml.safe_dump(config, sort_keys=False))
    out = plan_cli(str(bad), "--snapshot", str(full), "--cache-dir", str(cache))
    assert out.exit_code == 2, out.output
    assert "models[0].min_replicas: " in out.output and "nothing was submitted" in out.output


# --------------------------------------------------------------------------- the solver's choice


def _template(tp: int, throughput: float) -> Template:
    return Template("m", tp, (Stage("a", 32),), throughput)


def test_a_known_start_is_preferred_to_an_unknown_one_even_at_a_higher_cost():
    group = NodeGroup("g", "a", 4, 80.0, ("n1", "n2"), (0, 0))
    cheap = Partition("cheap", ("g",), prices={"a": 1.0})
    dear = Partition("dear", ("g",), prices={"a": 5.0})
    model = ModelSpec("m", "arch", 1024, 256, 2.0, 0.05, demand_rps=1.0)
    library = {"m": [_template(1, 2.0)]}
    unknown = QueueOption("cheap", "a", 1, 1, 0.0, start_known=False)
    known = QueueOption("dear", "a", 1, 1, 7200.0, ("n2",))
    empty = Plan((), {"m": 1.0}, {"m": 0.0}, {"m": 0.0}, 0.0, "scarce", 0.0, 0.0)
    both = queue_unplaced(empty, [model], library,
                          Cluster((group,), (cheap, dear), queue_options=(unknown, known)))
    (row,) = both.queued
    assert row.partitions == ("dear",) and row.start_known and row.wait_s == 7200.0
    alone = queue_unplaced(empty, [model], library,
                           Cluster((group,), (cheap, dear), queue_options=(unknown,)))
    (row,) = alone.queued
    assert row.partitions == ("cheap",) and not row.start_known
    assert any("start unknown" in b for b in alone.binding)


def test_only_shapes_without_an_answer_become_unknown_starts_and_the_nodes_must_hold_them():
    from coral_hpc.plan.availability import with_unknown_starts
    from coral_hpc.slurm.snapshot import JobShape, ShapeEstimate

    group = NodeGroup("g", "a", 4, 80.0, ("n1", "n2"), (0, 0))
    cluster = Cluster((group,), (Partition("p", ("g",), prices={"a": 1.0}),
                                 Partition("down", ("g",), usable=False)))
    shapes = [JobShape("p", 1, "a"), JobShape("p", 2, "a"), JobShape("p", 4, "a", nodes=2),
              JobShape("p", 4, "a", nodes=3), JobShape("p", 8, "a"), JobShape("down", 1, "a")]
    answered = ShapeEstimate("p", "a", 1, 1, 5000.0, ("n1",), 1000.0)
    refused = ShapeEstimate("p", "a", 2, 1, None, (), 1000.0, error="QOSMaxGRESPerJob")
    known = replace(cluster, queue_options=(QueueOption("p", "a", 1, 1, 4000.0, ("n1",)),))
    out = with_unknown_starts(known, shapes, (answered, refused))
    # the answered shape stays known, the refused one is not queued (sbatch would refuse it),
    # three nodes or eight GPUs a node the site does not have, a down partition nothing starts in
    assert [(q.gpus_per_node, q.nodes, q.start_known) for q in out.queue_options] == [
        (1, 1, True), (4, 2, False)]
    # a refusal of every probe is no word on any shape (test-only itself refused): all queue
    out = with_unknown_starts(cluster, shapes, (refused,))
    assert [(q.gpus_per_node, q.nodes) for q in out.queue_options] == [(1, 1), (2, 1), (4, 2)]
