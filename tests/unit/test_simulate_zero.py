"""Scale to zero in ``coral-hpc simulate``: the daemon's idle rule in virtual time, on the
recorded dev-cluster snapshot with small synthetic request streams (no Slurm, no trace files)."""

from __future__ import annotations

import numpy as np
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.plan.planner import Planner
from coral_hpc.reconcile import idle_plan
from coral_hpc.simulate import zero as zero_module
from coral_hpc.simulate.compare import against_always_on, always_on, simulate_both
from coral_hpc.simulate.run import simulate
from coral_hpc.simulate.traces import ModelWorkload
from tests.conftest import REPO
from tests.fakes.slurm import recorded_snapshot

EXAMPLE = REPO / "examples" / "models.yaml"
#: the start-up a woken replica takes (policy.startup_time_s), seconds
STARTUP_S = 120.0
IDLE_AFTER_S = 120.0
SPAN_S = 1200.0


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    return Planner(cache_dir=tmp_path_factory.mktemp("templates"), probe=False)


def _deployment(**model):
    """The example's qwen3-8b alone, declared at 1 req/s (so without scale to zero it keeps a
    replica all along), ``idle_after`` 2 min and a 2-min start-up."""
    deployment = load_deployment(EXAMPLE)
    qwen = next(m for m in deployment.models if m.name == "qwen3-8b")
    qwen = qwen.model_copy(update={"idle_after": IDLE_AFTER_S, **model})
    policy = deployment.policy.model_copy(update={"startup_time_s": STARTUP_S,
                                                  "replan_interval_s": 60.0})
    return deployment.model_copy(update={"models": (qwen,), "policy": policy})


def _load(at) -> dict[str, ModelWorkload]:
    at = np.asarray(at, dtype=float)
    n = len(at)
    return {"qwen3-8b": ModelWorkload("qwen3-8b", at, np.full(n, 512), np.full(n, 128),
                                      "synthetic", (512, 128))}


def _run(planner, arrivals, **model):
    return simulate(_deployment(**model), recorded_snapshot(), _load(arrivals), SPAN_S, planner)


def test_a_model_idle_beyond_idle_after_stops_costing(planner):
    # requests in the first 30 s only: cold from the 3rd minute (idle 120 s, checked each minute)
    result = _run(planner, [5.0, 10.0, 30.0])
    qwen = result.models["qwen3-8b"]
    assert qwen.gpu_hours < 0.2 * SPAN_S / 3600.0
    zero = result.scale_to_zero["qwen3-8b"]
    assert zero["hours_without_replica"] >= (SPAN_S - 3 * 60.0) / 3600.0 - 1e-4
    cold = [p for p in result.timeline if p.trigger == "idle"]
    assert cold and cold[0].replicas.get("qwen3-8b", 0) == 0
    assert 120.0 <= cold[0].at_s <= 180.0
    # paid only until it went cold
    per_hour = result.timeline[0].cost_per_hour
    assert qwen.cost == pytest.approx(per_hour * cold[0].at_s / 3600.0, rel=1e-6)
    assert qwen.gpu_hours < 0.2 * SPAN_S / 3600.0


def test_a_request_to_a_cold_model_is_answered_after_the_start_up_and_its_wait_counted(planner):
    result = _run(planner, [5.0, 600.0])
    qwen = result.models["qwen3-8b"]
    # both answered, none refused; the held one missed its 2-s TTFT (it waited 2 min)
    assert qwen.requests == 2 and qwen.refused == 0
    assert qwen.within_slo == pytest.approx(1.0)
    zero = result.scale_to_zero["qwen3-8b"]
    assert zero["wakes"] == 1 and zero["held"] == 1
    assert zero["wake_wait_s"] == {"p50": STARTUP_S, "p95": STARTUP_S, "max": STARTUP_S}
    assert result.wake_waits["qwen3-8b"] == [pytest.approx(STARTUP_S)]
    # a plan for it at once: the wake re-plans in the minute of the request
    wake = [p for p in result.timeline if p.trigger == "wake"]
    assert [p.at_s for p in wake] == [600.0] and wake[0].replicas["qwen3-8b"] >= 1


def test_many_requests_in_one_wake_share_it(planner):
    burst = [610.0 + 5.0 * k for k in range(20)]  # 20 requests over 100 s, within the start-up
    result = _run(planner, [5.0, *burst])
    # every request of the wake waited at least 20 s (past its 2-s TTFT); the first is on time
    assert result.models["qwen3-8b"].within_slo == pytest.approx(1.0)
    zero = result.scale_to_zero["qwen3-8b"]
    assert zero["wakes"] == 1 and zero["held"] == 20
    ready = burst[0] + STARTUP_S
    assert result.wake_waits["qwen3-8b"] == pytest.approx([ready - t for t in burst])
    assert len([p for p in result.timeline if p.trigger == "wake"]) == 1
    assert result.models["qwen3-8b"].requests == 21


def test_wake_reject_refuses_the_requests_of_the_wake_and_serves_those_after(planner):
    result = _run(planner, [5.0, 600.0, 650.0, 800.0], wake="reject")
    assert result.models["qwen3-8b"].refused == 2
    zero = result.scale_to_zero["qwen3-8b"]
    assert zero["wakes"] == 1 and zero["held"] == 0 and zero["refused_reject"] == 2
    assert result.models["qwen3-8b"].refused == 2
    assert result.models["qwen3-8b"].requests == 4


def test_a_request_held_past_wake_timeout_is_refused_and_a_later_one_of_the_wake_held(planner):
    # a 2-min start-up, a 1-min wake_timeout: the request that woke it would wait 120 s
    result = _run(planner, [5.0, 600.0, 690.0], wake_timeout=60.0)
    assert result.models["qwen3-8b"].refused == 1
    zero = result.scale_to_zero["qwen3-8b"]
    assert zero["refused_timeout"] == 1 and zero["held"] == 1
    assert result.wake_waits["qwen3-8b"] == [pytest.approx(30.0)]


def test_always_on_costs_more_on_a_sparse_trace(planner):
    deployment = _deployment()
    arrivals = _load([5.0, 600.0, 1100.0])
    zero, always = simulate_both(deployment, recorded_snapshot(), arrivals, SPAN_S, planner)
    assert always is not None
    report = against_always_on(zero, always)
    total = report["total"]
    assert total["gpu_hours"] < 0.7 * total["always_on_gpu_hours"]
    assert total["cost"] < total["always_on_cost"]
    assert report["models"]["qwen3-8b"]["wakes"] == 2
    # always-on keeps a replica all along and nobody waits
    assert always.models["qwen3-8b"].replica_hours == pytest.approx(SPAN_S / 3600.0)
    assert not always.scale_to_zero


def test_always_on_keeps_the_smallest_replica_and_no_idle_after():
    deployment = always_on(_deployment(demand="auto"))
    qwen = deployment.models[0]
    assert qwen.min_replicas == 1 and qwen.idle_after == 0.0
    assert deployment.policy.idle_after is None


def test_simulate_plans_with_the_daemons_own_idle_rule():
    # the one function, not a copy: simulate's planning inputs are reconcile.idle_plan's
    assert zero_module.planning_inputs is idle_plan.planning_inputs
    assert zero_module.idle_rules is idle_plan.idle_rules
    from coral_hpc.daemon import wake

    assert wake.planning_inputs is idle_plan.planning_inputs
    assert wake.idle_rules is idle_plan.idle_rules


def test_the_command_reports_scale_to_zero_against_always_on(tmp_path):
    from click.testing import CliRunner

    from coral_hpc.cli.simulate import simulate as simulate_command

    text = EXAMPLE.read_text()
    models = text[:text.index("models:")] + """models:
  - name: qwen3-8b
    source: Qwen/Qwen3-8B
    architecture: qwen3-8b
    mix: {input_tokens: 512, output_tokens: 128}
    demand: auto
    idle_after: 2m
    slo: {ttft_s: 2.0, tpot_s: 0.08}
"""
    (tmp_path / "models.yaml").write_text(models)
    # a sparse trace: a few requests at the start, a few after 15 minutes of nothing
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 00:{m:02d}:{s:02d}.0000000,512,128" for m, s in
        [(0, 0), (0, 1), (0, 2), *((15, s) for s in range(0, 60, 2)), (19, 59)]]
    (tmp_path / "trace.csv").write_text("\n".join(rows) + "\n")
    snapshot = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"
    run = CliRunner().invoke(simulate_command, [
        str(tmp_path / "models.yaml"), "--snapshot", str(snapshot), "--trace",
        str(tmp_path / "trace.csv"), "--cache-dir", str(tmp_path / "cache")])
    assert run.exit_code == 0, run.output
    assert "Scale to zero" in run.stdout and "always-on" in run.stdout
    run = CliRunner().invoke(simulate_command, [
        str(tmp_path / "models.yaml"), "--snapshot", str(snapshot), "--trace",
        str(tmp_path / "trace.csv"), "--cache-dir", str(tmp_path / "cache"), "--json"])
    assert run.exit_code == 0, run.output
    import json

    zero = json.loads(run.stdout)["scale_to_zero"]
    qwen = zero["models"]["qwen3-8b"]
    assert qwen["wakes"] >= 1 and qwen["held"] >= 1
    assert zero["total"]["gpu_hours"] < zero["total"]["always_on_gpu_hours"]
