"""The CLI at 80 columns: every id, partition, layout, state and endpoint appears whole, no line is
longer than the terminal, ``--wide`` keeps one line per row, ``--json`` prints nothing but JSON,
and an infeasible ``min_replicas`` exits 2 naming the field.

The commands run as real processes with ``COLUMNS`` set, on the recorded dev-cluster snapshot
and a database written through the store's own API."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from coral_hpc.cli._output import Column, fit_widths, render_table
from coral_hpc.store import ReplicaRecord, open_store
from coral_hpc.types import ReplicaLayout, StageLayout
from tests.support.no_slurm import no_slurm_env

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"
MODELS = REPO / "examples" / "models.yaml"


def run_cli(*args: str, columns: int = 80, cwd: Path = REPO, **extra_env: str
            ) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb", **extra_env}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False,
    )


def assert_fits(text: str, columns: int) -> None:
    long = [line for line in text.splitlines() if len(line.rstrip()) > columns]
    assert not long, f"lines wider than {columns}: {long}"


def tokens(text: str) -> set[str]:
    """Every whitespace-separated word of the output (a value cut in two is not among them)."""
    return set(text.split())


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


# --------------------------------------------------------------------------- pure layout


def test_fit_widths_wraps_headers_before_values_and_never_goes_below_a_word():
    # three columns: natural 20 / 12 / 30, longest words 8 / 12 / 6, whole values 8 / 12 / 30
    widths = fit_widths([8, 12, 6], [20, 12, 30], available=50, wholes=[8, 12, 30])
    assert widths is not None and sum(widths) <= 50
    assert widths[0] >= 8 and widths[1] == 12 and widths[2] >= 6
    assert widths[0] == 8  # the header-only slack went first
    assert fit_widths([30, 30], [40, 40], available=50) is None


def render(columns, rows, width: int, wide: bool = False) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=1000 if wide else width, record=True, file=sink)
        console.print(render_table(columns, rows, width=width, wide=wide), crop=False)
        return console.export_text()


def test_a_table_too_wide_for_the_terminal_folds_into_records_with_every_value_whole():
    columns = [Column("replica", "id"), Column("endpoint", "id"), Column("partition"),
               Column("state", "id")]
    rows = [("r0123abcd", "http://gpu-node-017.cluster.example.edu:23456",
             "a100, a100-80g", "STARTING")]
    narrow = render(columns, rows, width=40)
    assert "replica: r0123abcd" in narrow
    assert "endpoint: http://gpu-node-017.cluster.example.edu:23456" in narrow
    assert "STARTING" in tokens(narrow) and "a100-80g" in tokens(narrow)
    fits = render(columns, rows, width=100)
    assert len(fits.splitlines()) == 3  # header, rule, one row
    for value in ("r0123abcd", "http://gpu-node-017.cluster.example.edu:23456", "STARTING"):
        assert value in tokens(fits)


def test_values_are_data_not_markup():
    out = render([Column("layout [layers]")], [("a100[36] + v100[12]",)], width=80)
    assert "layout [layers]" in out and "a100[36] + v100[12]" in out


# --------------------------------------------------------------------------- cluster


def test_cluster_at_80_columns_shows_every_partition_state_and_gpu_type_whole():
    snapshot = json.loads(SNAPSHOT.read_text())
    out = run_cli("cluster", "--snapshot", str(SNAPSHOT))
    assert out.returncode == 0, out.stderr
    assert_fits(out.stdout, 80)
    words = tokens(out.stdout)
    for partition in snapshot["partitions"]:
        assert partition["name"] in words and partition["state"] in words
        for gpu in partition.get("gpu_types") or ():
            assert gpu in words
    # human times, never a raw epoch; billing says what it is per and what it includes
    assert str(int(snapshot["observed_at"])) not in out.stdout
    assert re.search(r"observed \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", out.stdout)
    assert "billing per GPU-h" in " ".join(out.stdout.split())
    assert "CPU weight" in out.stdout and "memory weight" in out.stdout


def test_cluster_wide_keeps_one_line_per_row():
    snapshot = json.loads(SNAPSHOT.read_text())
    rows = sum(len(p.get("gpu_types") or [""]) for p in snapshot["partitions"])
    out = run_cli("cluster", "--snapshot", str(SNAPSHOT), "--wide", columns=40)
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines()
             if line.split() and line.split()[0] in {p["name"] for p in snapshot["partitions"]}]
    assert len(table) == rows


# --------------------------------------------------------------------------- plan


def test_plan_at_80_columns_shows_models_partitions_and_layouts_whole(cache):
    doc = run_cli("plan", str(MODELS), "--snapshot", str(SNAPSHOT), "--json",
                  "--cache-dir", str(cache))
    assert doc.returncode == 0, doc.stderr
    plan = json.loads(doc.stdout)  # nothing but JSON on stdout
    assert "HiGHS" not in doc.stderr and "HiGHS" not in doc.stdout  # no solver banner
    assert "Stage 1: templates for" in doc.stderr  # progress: a line per model when not a TTY
    out = run_cli("plan", str(MODELS), "--snapshot", str(SNAPSHOT), "--cache-dir", str(cache))
    assert out.returncode == 0, out.stderr
    assert_fits(out.stdout, 80)
    words = tokens(out.stdout)
    assert plan["replicas"]
    for replica in plan["replicas"]:
        assert replica["model"] in words
        for stage in replica["stages"]:
            assert stage["partition"] in words or f"{stage['partition']}," in words
            assert f"{stage['gpu_type']}[{stage['layers']}]" in words
        assert f"{replica['tp']}×{replica['pp']}" in words


def test_an_infeasible_min_replicas_exits_2_naming_the_field(tmp_path, cache):
    config = yaml.safe_load(MODELS.read_text())
    config["models"][2]["min_replicas"] = 40
    config["models"][2].pop("max_replicas", None)
    bad = tmp_path / "models.yaml"
    bad.write_text(yaml.safe_dump(config, sort_keys=False))
    out = run_cli("plan", str(bad), "--snapshot", str(SNAPSHOT), "--cache-dir", str(cache))
    assert out.returncode == 2, out.stderr
    line = next(i + 1 for i, text in enumerate(bad.read_text().splitlines())
                if "min_replicas" in text)
    assert f"{bad}:{line}: models[2].min_replicas: 40" in out.stderr
    assert "nothing was submitted" in out.stderr
    assert "checker" not in out.stderr  # not reported as a solver bug


# --------------------------------------------------------------------------- status


def status_deployment(tmp_path: Path) -> Path:
    config = yaml.safe_load(MODELS.read_text())
    config["state_dir"] = str(tmp_path / "shared")
    config["db_path"] = str(tmp_path / "daemon" / "demo.db")
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    store = open_store(config["db_path"])
    now = time.time()
    layouts = [
        ("qwen3-8b", ReplicaLayout(1, (StageLayout("a100", "a100", 36),), "auto")),
        ("phi-4", ReplicaLayout(1, (StageLayout("a100", "a100", 28),
                                    StageLayout("v100", "v100", 12)), "half")),
        ("llama-70b", ReplicaLayout(2, (StageLayout("a100", "a100", 35),
                                        StageLayout("a100-80g", "a100-80g", 45)), "auto")),
    ]
    for index, (model, layout) in enumerate(layouts):
        ready = index != 1
        store.add_replica(ReplicaRecord(
            id=f"r{index:02d}c0ffee", model=model, template_id=f"{model}-t{index}",
            layout=layout, partitions=layout.partitions, throughput=2.0,
            cost_per_hour=3.0, created_at=now - 3600 * (index + 1), job_id=f"{123450 + index}",
            time_limit_s=7200.0 * (index + 1), submitted_at=now - 3600 * (index + 1),
            started_at=now - 3000 * (index + 1) if ready else None,
            ready_at=now - 2900 * (index + 1) if ready else None,
            endpoint=f"http://gpu-node-{index:03d}.cluster.example.edu:2{index}345" if ready
            else None,
            slurm_state="RUNNING" if ready else "PENDING",
            slurm_reason=None if ready else "Resources",
            last_seen_at=now, health_ok_at=now if ready else None,
        ))
    store.add_event(now - 5, "submit", "job 123451: phi-4 on a100,v100 (demand)",
                    model="phi-4", replica_id="r01c0ffee")
    store.close()
    return path


def test_status_at_80_columns_shows_replica_ids_jobs_states_and_endpoints_whole(tmp_path):
    path = status_deployment(tmp_path)
    # no daemon and no Slurm to ask: the stored states, marked last known (the widest rows)
    no_slurm = no_slurm_env(tmp_path)
    doc = run_cli("status", str(path), "--json", **no_slurm)
    assert doc.returncode == 0, doc.stderr
    data = json.loads(doc.stdout)
    assert len(data["replicas"]) == 3 and data["source"] == "last-known"
    for columns in (80, 60):
        out = run_cli("status", str(path), columns=columns, **no_slurm)
        assert out.returncode == 0, out.stderr
        assert_fits(out.stdout, columns)
        words = tokens(out.stdout)
        for replica in data["replicas"]:
            assert replica["id"] in words and replica["job_id"] in words
            assert replica["state"] in words
            for partition in replica["partition"].split(","):
                assert partition in words or f"{partition}," in words
            if replica["endpoint"]:
                assert replica["endpoint"] in words
        assert str(int(data["events"][0]["time"])) not in out.stdout  # human times



def test_status_says_the_unit_of_the_plans_cost(tmp_path):
    """Issue 29d: `status` printed "21.6/h": per hour of what."""
    path = status_deployment(tmp_path)
    config = yaml.safe_load(path.read_text())
    store = open_store(config["db_path"])
    store.add_plan(time.time(), 21.6, [{"model": "qwen3-8b", "template_id": "qwen3-8b-t0",
                                        "partitions": ["a100"], "count": 1,
                                        "cost_per_hour": 21.6}], {"qwen3-8b": 1.0})
    store.close()
    out = run_cli("status", str(path), columns=200)
    assert out.returncode == 0, out.stderr
    assert "21.6 billing units/h (Slurm's billing)" in out.stdout  # models.yaml: billing
    data = json.loads(run_cli("status", str(path), "--json").stdout)
    assert data["plan"]["cost_unit"] == "billing"


def test_json_output_is_nothing_but_json(tmp_path):
    path = status_deployment(tmp_path)
    for args in (("validate", str(MODELS), "--json"), ("status", str(path), "--json"),
                 ("cluster", "--snapshot", str(SNAPSHOT), "--json")):
        out = run_cli(*args, **no_slurm_env(tmp_path))
        assert out.returncode == 0, (args, out.stderr)
        json.loads(out.stdout)


def test_every_help_lists_the_exit_statuses():
    from coral_hpc.cli import COMMANDS

    for name in COMMANDS:
        out = run_cli(name, "--help")
        assert out.returncode == 0, out.stderr
        text = " ".join(out.stdout.split())
        for code in ("0 done", "1 a bug", "2 invalid input", "another daemon (host, pid)",
                     "3 Slurm"):
            assert code in text, (name, code)
        assert " 4 " not in text, (name, "exit 4 is gone: a second daemon exits 2")
        assert "5 an engine job (coral-hpc profile) failed" in text, name
    cost = " ".join(run_cli("cost", "--help").stdout.split())
    assert "YYYY-MM-DD" in cost and "@EPOCH" in cost and "now-2days" in cost and "noon" in cost



@pytest.mark.parametrize("columns", [80, 60, 200])
def test_help_fits_the_terminal_or_80_columns(columns: int):
    """Issue 29d: the exit-status epilog ran to 128 columns whatever the terminal."""
    out = run_cli("cost", "--help", columns=columns)
    assert out.returncode == 0, out.stderr
    assert "already serves this deployment" in out.stdout
    assert_fits(out.stdout, min(columns, 80))


# --------------------------------------------------------------------------- cost


COST_TABLE = """
import json, sys
from tests.unit.test_accounting import recorded, report, t
from coral_hpc.cli.cost import _print_table
records, now = recorded.__wrapped__() if hasattr(recorded, "__wrapped__") else recorded()
data = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
json.dump(data, open(sys.argv[1], "w"), default=str)
_print_table(data)
"""


def test_cost_at_80_columns_shows_every_model_partition_gpu_type_and_day_whole(tmp_path):
    doc = tmp_path / "cost.json"
    out = subprocess.run(
        [sys.executable, "-c", COST_TABLE, str(doc)], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "COLUMNS": "80"}, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert_fits(out.stdout, 80)
    data = json.loads(doc.read_text())
    words = tokens(out.stdout)
    assert data["rows"]
    for row in data["rows"]:
        for key in ("model", "partition", "gpu_type", "day"):
            assert str(row[key]) in words, (key, row[key])


# --------------------------------------------------------------------------- Stage-1 progress


def test_stage1_progress_logs_a_line_per_model_first_then_only_at_debug(caplog):
    import logging

    from coral_hpc.cli._output import Stage1Progress

    progress = Stage1Progress(terminal=False)
    with caplog.at_level(logging.DEBUG, logger="coral_hpc.stage1"):  # a handler, as serve has
        for _ in range(2):  # serve's first plan, then a re-plan
            for done, name in enumerate(("qwen3-8b", "llama-70b")):
                progress(name, done, 2)
            progress("", 2, 2)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "coral_hpc.stage1"]
    assert lines[:2] == [(logging.INFO, "Stage 1: templates for qwen3-8b (1/2)"),
                         (logging.INFO, "Stage 1: templates for llama-70b (2/2)")]
    assert [level for level, _ in lines[2:]] == [logging.DEBUG, logging.DEBUG]


def test_stage1_progress_on_a_terminal_draws_on_stderr_only(capsys):
    from coral_hpc.cli._output import Stage1Progress

    progress = Stage1Progress(terminal=True)
    progress("qwen3-8b", 0, 1)
    assert progress._bar is not None  # a bar while Stage 1 runs
    progress("", 1, 1)
    assert progress._bar is None  # gone when it is done
    assert capsys.readouterr().out == ""


def test_cluster_jobs_at_80_columns_show_every_job_state_and_replica_whole(tmp_path):
    from tests.unit.test_slurm_snapshot import client

    path = tmp_path / "snap.json"
    path.write_text(client()[0].snapshot("dep1").to_json())  # recorded squeue/sacct output
    jobs = json.loads(path.read_text())["jobs"]
    assert jobs
    out = run_cli("cluster", "--snapshot", str(path))
    assert out.returncode == 0, out.stderr
    assert_fits(out.stdout, 80)
    words = tokens(out.stdout)
    for job in jobs:
        assert job["job_id"] in words and job["state"] in words and job["partition"] in words
        assert job["tag"]["replica_id"] in words
        for node in job["nodes"]:
            assert node in words or f"{node}," in words
