"""policy.plan_for end to end without Slurm: a percentile buys capacity for a bursty stream and
none for a steady one (the real planner on the recorded cluster, windows counted as
``coral-hpc simulate`` counts them); the daemon plans from the gateway meter's windows and
``status`` and ``plan`` say what each model was sized for and why."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from coral_hpc.cli.status import status as status_command
from coral_hpc.config import load_deployment
from coral_hpc.daemon.core import Daemon
from coral_hpc.daemon.status_file import status_data
from coral_hpc.gateway.metering import DemandMeter
from coral_hpc.plan.planner import Planner, PlanRequest
from coral_hpc.reconcile.act import Actor
from coral_hpc.reconcile.observe import Observer
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.simulate.run import Replanner
from coral_hpc.simulate.traces import ModelWorkload
from coral_hpc.store import open_store
from tests.conftest import REPO
from tests.fakes.slurm import FakeSlurm, recorded_snapshot
from tests.support.virtual_time import VirtualClock

EXAMPLE = REPO / "examples" / "models.yaml"
SNAPSHOT = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"
#: 10 minutes of arrivals
SPAN_S = 600.0


def _idle(snapshot):
    nodes = tuple(replace(n, state="idle", slurm_state="IDLE", gpus_alloc=0, cpus_alloc=0,
                          mem_alloc_gb=0.0, gpus_free=n.gpus_total) for n in snapshot.nodes)
    return replace(snapshot, nodes=nodes, jobs=())


def _deployment(plan_for: str, path=EXAMPLE, **policy):
    deployment = load_deployment(path)
    return deployment.model_copy(update={"policy": deployment.policy.model_copy(
        update={"plan_for": plan_for, **policy})})


def _steady(rate: float) -> np.ndarray:
    return np.arange(0.0, SPAN_S, 1.0 / rate)


def _bursty(rate: float) -> np.ndarray:
    """The same mean as :func:`_steady`, all of it in the first 10 s of every 40 s."""
    per_cycle = int(rate * 40)
    return np.concatenate([start + np.linspace(0.0, 10.0, per_cycle, endpoint=False)
                           for start in np.arange(0.0, SPAN_S, 40.0)])


def _workload(name: str, at: np.ndarray) -> ModelWorkload:
    n = len(at)
    return ModelWorkload(name, at, np.full(n, 512), np.full(n, 128), "synthetic", (512, 128))


def _capacity(planner, plan_for: str, qwen_arrivals: np.ndarray) -> tuple[float, object]:
    """qwen3-8b's planned capacity (req/s) when its arrivals are ``qwen_arrivals`` (4 req/s,
    as declared) and the other models' are steady at their declared rates."""
    deployment = _deployment(plan_for)
    loads = {"qwen3-8b": _workload("qwen3-8b", qwen_arrivals),
             "phi-4": _workload("phi-4", _steady(300 / 256)),
             "llama-70b": _workload("llama-70b", _steady(0.5))}
    replanner = Replanner(deployment, 60.0)
    replanner.count_windows(loads, SPAN_S)
    demand, _ = replanner.due(SPAN_S)
    request = PlanRequest(deployment, _idle(recorded_snapshot()), demand, (), frozenset(),
                          frozenset(), 10.0)
    outcome = planner.solve(request)
    assert outcome.solved is not None and outcome.status in ("optimal", "feasible")
    return outcome.solved.plan.capacity["qwen3-8b"], demand["qwen3-8b"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


@pytest.fixture(scope="module")
def planner(cache):
    return Planner(cache_dir=cache)


def test_p95_buys_capacity_for_a_bursty_stream_and_none_for_a_steady_one(planner):
    steady, bursty = _steady(4.0), _bursty(4.0)
    assert len(steady) == len(bursty) == pytest.approx(4.0 * SPAN_S)
    mean_steady, _ = _capacity(planner, "mean", steady)
    mean_bursty, sized_mean = _capacity(planner, "mean", bursty)
    p95_steady, sized_steady = _capacity(planner, "p95", steady)
    p95_bursty, sized_bursty = _capacity(planner, "p95", bursty)
    # the mean does not see the bursts: the same plan either way
    assert mean_bursty == pytest.approx(mean_steady)
    assert sized_mean.sized == pytest.approx(4.0)
    # a steady stream's p95 window is its mean: nothing more to buy
    assert sized_steady.sized == pytest.approx(4.0)
    assert p95_steady == pytest.approx(mean_steady)
    # bursts of 16 req/s for 10 s of every 40: p95 of the 10-s rate is 16 req/s
    assert sized_bursty.sized == pytest.approx(16.0)
    assert sized_bursty.basis == "declared × 4.00 (p95/mean of 20 windows)"
    assert p95_bursty >= 16.0 * 1.2 > mean_bursty


# --------------------------------------------------------------------------- serve and status


def _files(tmp_path, plan_for: str):
    """The example with its database and state folder under ``tmp_path`` and ``plan_for``."""
    lines = [f"db_path: {tmp_path / 'coral.db'}" if line.startswith("db_path:") else
             f"state_dir: {tmp_path / 'state'}" if line.startswith("state_dir:") else
             f"policy:\n  plan_for: {plan_for}" if line.startswith("policy:") else line
             for line in EXAMPLE.read_text().splitlines()]
    path = tmp_path / "models.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


class _Recording(Planner):
    def __call__(self, request):
        self.request = request
        return super().__call__(request)


def test_the_daemon_sizes_from_the_meters_windows_and_status_says_why(tmp_path, cache):
    path = _files(tmp_path, "p95")
    deployment = load_deployment(path)
    assert deployment.policy.plan_for == "p95"
    clock = VirtualClock(100_000.0)
    meter = DemandMeter(clock=clock, window_s=10.0, windows_kept=deployment.policy.demand_windows,
                        wall=clock)
    store = open_store(deployment.db_path)
    planner = _Recording(cache_dir=cache)
    slurm = FakeSlurm(recorded_snapshot(), clock)
    settings = ReconcileSettings.from_policy(deployment.policy)
    daemon = Daemon(deployment, store, slurm, planner,
                    api_key_file=None, table_path=tmp_path / "routes.json", clock=clock,
                    demand_source=lambda: meter.snapshot(models=("qwen3-8b", "phi-4",
                                                                 "llama-70b")),
                    observer=Observer(deployment, store, slurm, settings, clock,
                                      probe=lambda url: False),
                    actor=Actor(deployment, store, slurm, settings, clock, None,
                                submit=slurm.submit_spec))
    try:
        daemon.scrape_once()
        # 200 s of qwen3-8b traffic: 3 req/s, and 12 req/s in one 10-s window of every 40
        for second in range(200):
            clock.advance(1.0)
            for _ in range(12 if second % 40 < 10 else 3):
                meter.record_arrival("qwen3-8b", "k")
            if second % 6 == 0:
                daemon.scrape_once()
        daemon.reconcile_once()
        demand = planner.request.demand
        qwen = demand["qwen3-8b"]
        assert qwen.basis.startswith("declared × ")
        assert qwen.sized > 4.0 * 1.5  # declared 4 req/s times the bursts' p95/mean
        assert demand["llama-70b"].basis.startswith("the declared rate: nothing arrived")
        stored = store.latest_plan()
        assert stored is not None
        assert stored.demand_basis["qwen3-8b"]["sized_rps"] == pytest.approx(qwen.sized,
                                                                              rel=1e-5)
        data = status_data(deployment, store, clock())
    finally:
        daemon.observer.close()
        store.close()
    assert data["plan_for"] == "p95 of the 10 s rate"
    row = next(m for m in data["models"] if m["name"] == "qwen3-8b")
    assert row["mean_rps"] == pytest.approx(4.0)
    assert row["sized_rps"] == pytest.approx(qwen.sized, rel=1e-5)
    assert row["demand"] == pytest.approx(qwen.sized * 1.2, rel=1e-5)
    assert row["planned_for"] == qwen.basis

    out = CliRunner().invoke(status_command, [str(path)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "mean req/s" in out.output and "sized for" in out.output
    assert "sized for (policy.plan_for: p95 of the 10 s rate):" in out.output
    assert f"  qwen3-8b: {qwen.basis}" in out.output
    as_json = CliRunner().invoke(status_command, [str(path), "--json"])
    assert json.loads(as_json.output)["models"][0]["planned_for"] == qwen.basis


def test_plan_shows_the_mean_the_rate_sized_for_and_why(tmp_path, cache):
    path = _files(tmp_path, "p99")
    args = [str(path), "--snapshot", str(SNAPSHOT), "--cache-dir", str(cache)]
    run = CliRunner().invoke(plan_command, [*args, "--json"])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.stdout)
    assert doc["plan_for"] == "p99 of the 10 s rate"
    qwen = next(m for m in doc["models"] if m["name"] == "qwen3-8b")
    # `plan` meters nothing: the declared rate, and it says so
    assert (qwen["mean_rps"], qwen["sized_rps"]) == (4.0, 4.0)
    assert qwen["demand"] == pytest.approx(4.8)
    assert qwen["planned_for"] == "the mean: no window counted yet"
    table = CliRunner().invoke(plan_command, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "sized for" in table.output and "mean" in table.output
    assert ("sized for the mean: no window counted yet (policy.plan_for: p99 of the 10 s "
            "rate)") in table.output
