"""``cost``/``report``: only this deployment instance's jobs are billed (issue 29a), and the
plans' prediction stops when the deployment is brought down (issue 29b).

Two copies of a deployment under one name (two folders) each have their own instance
(``coral_hpc.instance``); sacct lists both copies' jobs under the same deployment name. The rows
are the REAL recording of tests/data/accounting/22.05 with instance ids written into two jobs'
comments, as a daemon of each copy writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coral_hpc.cli import cost as cost_cli
from coral_hpc.config import parse_deployment
from coral_hpc.slurm.parse_jobs import parse_sacct_accounting
from coral_hpc.store import open_store

DATA = Path(__file__).resolve().parent.parent / "data" / "accounting" / "22.05"
OURS, THEIRS = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def _recording_with_instances() -> str:
    lines = []
    for line in (DATA / "sacct_own.txt").read_text().splitlines():
        if line.startswith("43|") and line.endswith("template=v100x2"):
            line += f";instance={OURS}"
        elif line.startswith("44|") and line.endswith("template=a100x2"):
            line += f";instance={THEIRS}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class _Client:
    def __init__(self, now: float) -> None:
        self.now = now

    def accounting(self, deployment: str, since: float, until: float):  # noqa: ANN201
        return parse_sacct_accounting(_recording_with_instances(), deployment, self.now)


def _deployment(tmp_path: Path):
    return parse_deployment(
        f"""
deployment: acctrec
state_dir: {tmp_path / 'state'}
db_path: {tmp_path / 'coral.db'}
engine: {{kind: sim}}
cluster:
  partitions:
    - {{name: v100, gpu_types: [v100], price: {{v100: 1.0}}}}
    - {{name: a100, gpu_types: [a100], price: {{a100: 2.5}}}}
models:
  - {{name: done, source: x, architecture: x, mix: {{input_tokens: 100, output_tokens: 10}},
      demand: auto, slo: {{ttft_s: 1, tpot_s: 0.1}}}}
"""
    )


def test_cost_counts_only_this_instances_jobs(tmp_path: Path, monkeypatch) -> None:
    now = float((DATA / "now.txt").read_text())
    dep = _deployment(tmp_path)
    dep.state_path.mkdir(parents=True)
    (dep.state_path / "instance.json").write_text(f'{{"instance": "{OURS}"}}\n')
    monkeypatch.setattr("coral_hpc.slurm.client_for_deployment", lambda d: _Client(now))
    inputs = cost_cli.Inputs(dep, None, now - 3600, now, now)
    report, _ = cost_cli.build(inputs)
    # job 43 (ours: 2 V100 for 4 s) only; not job 44 (the other copy's), nor the untagged-by-
    # instance jobs whose spec.json is not in this state folder
    assert [run.job_id for run in report.runs] == ["43"]
    assert report.total().gpu_seconds == 8
    assert report.total().cost == pytest.approx(8 / 3600 * 1.0)


def test_predicted_cost_stops_when_the_deployment_is_brought_down(tmp_path, monkeypatch):
    """issue 29: 2.31 -> 2.43 in 20 s after `down`, the gap all put down to "other"."""
    dep = _deployment(tmp_path)
    store = open_store(dep.db_path)
    t0 = 1_800_000_000.0
    store.add_plan(t0, 36.0, [], {"done": 1.0}, solve_s=0.1, status="optimal")  # 0.01 per s
    store.add_event(t0 + 100, "down", "coral-hpc down: 1 job(s) stopped")
    store.add_event(t0 + 101, "stop", "daemon stopped; replicas left running")
    monkeypatch.setattr("coral_hpc.slurm.client_for_deployment", lambda d: _Client(t0))
    seen = []
    for now in (t0 + 200, t0 + 220):
        report, _ = cost_cli.build(cost_cli.Inputs(dep, store, t0, now, now))
        seen.append(report.comparison.predicted)
    assert seen == [pytest.approx(1.0), pytest.approx(1.0)]  # 100 s at 36/h, then nothing


def test_predicted_cost_resumes_with_the_next_plan(tmp_path):
    from coral_hpc.accounting.predicted import predicted_cost

    store = open_store(_deployment(tmp_path).db_path)
    store.add_plan(0.0, 36.0, [], {}, solve_s=0.1, status="optimal")
    store.add_plan(300.0, 72.0, [], {}, solve_s=0.1, status="optimal")
    plans = store.plans_between(0.0, 400.0)
    # stopped at 100 s, served again from the plan at 300 s
    assert predicted_cost(plans, 0.0, 400.0, stops=[100.0]) == pytest.approx(1.0 + 2.0)
