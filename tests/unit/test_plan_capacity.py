"""A ``min_replicas`` the whole cluster could never hold is refused, not queued for ever.

On tests/data/plan/local-busy-snapshot.json, recorded on the local cluster with every GPU held
by another lab's jobs (tests/data/plan/record_local_busy.py): its 5 nodes have 24 GPUs (8 each
of v100, a100 and a100-80g), none free. A minimum beyond what starts now is queued (issue 12);
one beyond what the model's layouts fit on the 24 GPUs, busy or not, is refused by ``plan``
and ``validate`` with exit 2 naming the file, line and field, and by ``serve``'s planner as
:class:`InfeasiblePlan`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from coral_hpc.config import load_deployment
from coral_hpc.plan import capacity
from coral_hpc.plan.planner import InfeasiblePlan, Planner, PlanRequest
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_solver.capacity import most_replicas
from coral_solver.templates import PerfThroughput, build_library

REPO = Path(__file__).resolve().parents[2]
LOCAL_BUSY = REPO / "tests" / "data" / "plan" / "local-busy-snapshot.json"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


@pytest.fixture(scope="module")
def busy() -> ClusterSnapshot:
    return ClusterSnapshot.from_json(LOCAL_BUSY.read_text())


@pytest.fixture(scope="module")
def library(busy, cache):
    """Stage 1's whole library for examples/models.yaml on the recording (``solve``'s is
    narrowed to what fits in the GPUs available now)."""
    deployment = load_deployment(REPO / "examples" / "models.yaml")
    planner = Planner(cache_dir=cache)
    models, cluster, policy = planner.inputs(PlanRequest.from_snapshot(deployment, busy))
    return build_library(models, cluster.gpu_types(), policy, PerfThroughput(), cache_dir=cache)


def models_yaml(tmp_path: Path, **models: dict[str, object]) -> Path:
    """examples/models.yaml with extra fields per model (``qwen3_8b={"min_replicas": 40}``)."""
    text = (REPO / "examples" / "models.yaml").read_text()
    for name, fields in models.items():
        name = name.replace("_", "-")
        head = f"  - name: {name}\n"
        assert head in text, name
        extra = "".join(f"    {k}: {v}\n" for k, v in fields.items())
        text = text.replace(head, head + extra, 1)
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def solve(path: Path, snapshot: ClusterSnapshot, cache: Path):
    deployment = load_deployment(path)
    return deployment, Planner(cache_dir=cache).solve(
        PlanRequest.from_snapshot(deployment, snapshot))


def test_the_recording_is_a_full_cluster_of_24_gpus(busy):
    gpus = [n for n in busy.nodes if n.gpus_total]
    assert sum(n.gpus_total for n in gpus) == 24
    assert all(n.gpus_free == 0 for n in gpus)


def homogeneous_most(templates, gpus: dict[str, int]) -> int:
    """Most replicas at once of the homogeneous templates alone: each GPU type on its own, its
    GPUs over its smallest such template's (a lower bound of the LP's answer)."""
    smallest: dict[str, int] = {}
    for t in templates:
        if not t.heterogeneous:
            (gpu,) = t.stage_counts()
            smallest[gpu] = min(smallest.get(gpu, t.gpus), t.gpus)
    return int(sum(gpus[g] // n for g, n in smallest.items() if g in gpus))


def qwen_most(library, gpus: dict[str, int]) -> int:
    """What the LP (coral_solver.capacity, tested by hand in test_solver_capacity.py) fits,
    checked here between two bounds a reader can work out."""
    most = most_replicas(library["qwen3-8b"], gpus)
    smallest = min(t.gpus for t in library["qwen3-8b"])
    assert homogeneous_most(library["qwen3-8b"], gpus) <= most <= sum(gpus.values()) // smallest
    return most


EVERY_GPU = {"v100": 8, "a100": 8, "a100-80g": 8}


def test_a_minimum_beyond_every_gpu_of_the_cluster_is_refused_naming_the_field(
        tmp_path, busy, cache, library):
    most = qwen_most(library, EVERY_GPU)
    assert most < 24  # some layouts take more than one GPU
    path = models_yaml(tmp_path, qwen3_8b={"min_replicas": 40})
    deployment, outcome = solve(path, busy, cache)
    assert outcome.status == "infeasible"
    assert outcome.desired.slots == ()  # nothing to submit, not 37 queued replicas
    (short,) = outcome.solved.shortfalls
    assert short.models == (0,) and short.total_gpus == 24 and short.most == {0: most}
    assert short.partitions == ("a100", "a100-80g", "v100")
    assert any("could never hold" in line for line in outcome.solved.plan.binding)
    # serve's seam: the daemon stops on its first plan with these lines (exit 2)
    with pytest.raises(InfeasiblePlan) as raised:
        Planner(cache_dir=cache)(PlanRequest.from_snapshot(deployment, busy))
    assert raised.value.shortfalls == outcome.solved.shortfalls

    result = CliRunner().invoke(plan_command, [str(path), "--snapshot", str(LOCAL_BUSY),
                                               "--cache-dir", str(cache)])
    assert result.exit_code == 2, result.output
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                if "min_replicas: 40" in text)
    assert re.search(rf"{re.escape(str(path))}:{line}: models\[0\]\.min_replicas: 40 "
                     rf"replica\(s\) of qwen3-8b: .*fit at most {most} at once .*24 GPU\(s\) in "
                     rf"total, busy or not.*valid: at most {most};", result.output), result.output
    assert "nothing was submitted" in result.output


def test_a_minimum_the_cluster_could_hold_is_still_queued(tmp_path, busy, cache, library):
    """Up to what fits, the busy-cluster behaviour holds: what cannot start now is queued."""
    most = qwen_most(library, EVERY_GPU)
    _, outcome = solve(models_yaml(tmp_path, qwen3_8b={"min_replicas": most}), busy, cache)
    assert outcome.status != "infeasible" and outcome.solved.shortfalls == ()
    plan = outcome.solved.plan
    assert plan.replicas("qwen3-8b") + sum(r.count for r in plan.queued
                                           if r.model == "qwen3-8b") >= most


def test_busy_draining_and_down_nodes_all_count(tmp_path, busy, library):
    """Every node Slurm lists counts, whatever its state: drained or down nodes may come back,
    and none of them is in the solver's node groups as available."""
    down = replace(busy, nodes=tuple(
        replace(n, state="down", slurm_state="DOWN", gpus_free=0) if n.name.startswith("a100")
        else n for n in busy.nodes))
    most = qwen_most(library, EVERY_GPU)
    fits = load_deployment(models_yaml(tmp_path, qwen3_8b={"min_replicas": most}))
    assert capacity.never_held(fits, down, library) == []
    over = load_deployment(models_yaml(tmp_path, qwen3_8b={"min_replicas": most + 1}))
    (short,) = capacity.never_held(over, down, library)
    assert short.total_gpus == 24 and short.most == {0: most}


def test_the_models_partitions_bound_it(tmp_path, busy, library):
    """qwen3-8b kept to v100: v100's 8 GPUs over its v100 layouts (more than one GPU each:
    Stage 1's library says so, not this test)."""
    fits = qwen_most(library, {"v100": 8})
    assert 0 < fits < 8  # else this test would not tell the layouts' size apart
    ok = load_deployment(models_yaml(
        tmp_path, qwen3_8b={"partitions": "[v100]", "min_replicas": fits}))
    assert capacity.never_held(ok, busy, library) == []
    over = load_deployment(models_yaml(
        tmp_path, qwen3_8b={"partitions": "[v100]", "min_replicas": fits + 1}))
    (short,) = capacity.never_held(over, busy, library)
    assert short.partitions == ("v100",) and short.total_gpus == 8 and short.most == {0: fits}


def test_minimums_that_each_fit_but_not_together_are_refused_naming_both(
        tmp_path, busy, cache, library):
    """qwen3-8b's most fills every GPU of the cluster, so one phi-4 more does not fit."""
    most = qwen_most(library, EVERY_GPU)
    path = models_yaml(tmp_path, qwen3_8b={"min_replicas": most}, phi_4={"min_replicas": 1})
    deployment = load_deployment(path)
    (short,) = capacity.never_held(deployment, busy, library)
    assert short.models == (0, 1) and short.most[0] == most and short.most[1] >= 1
    result = CliRunner().invoke(plan_command, [str(path), "--snapshot", str(LOCAL_BUSY),
                                               "--cache-dir", str(cache)])
    assert result.exit_code == 2, result.output
    for index, name, other in ((0, "qwen3-8b", "phi-4"), (1, "phi-4", "qwen3-8b")):
        assert re.search(rf"models\[{index}\]\.min_replicas: \d+ replica\(s\) of {name} "
                         rf"\(at most \d+ alone\) with the minimums of {other} do not fit "
                         "together", result.output), result.output


def test_validate_refuses_what_plan_would_and_passes_a_minimum_the_cluster_holds(
        tmp_path, cache):
    from coral_hpc.cli.validate import validate

    bad = models_yaml(tmp_path, qwen3_8b={"min_replicas": 40})
    result = CliRunner().invoke(validate, [str(bad), "--snapshot", str(LOCAL_BUSY),
                                           "--cache-dir", str(cache)])
    assert result.exit_code == 2, result.output
    assert re.search(rf"{re.escape(str(bad))}:\d+: models\[0\]\.min_replicas: 40 replica\(s\) "
                     r"of qwen3-8b: its layouts .* could never hold them", result.output), \
        result.output
    (tmp_path / "ok").mkdir()
    ok = models_yaml(tmp_path / "ok", qwen3_8b={"min_replicas": 8})
    result = CliRunner().invoke(validate, [str(ok), "--snapshot", str(LOCAL_BUSY),
                                           "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output
