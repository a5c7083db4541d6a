"""``coral-hpc simulate``: a short slice of the Azure and Mooncake traces replayed through the
daemon's planner and re-plan rule on the recorded dev-cluster snapshot (no Slurm)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from coral_hpc.cli.simulate import simulate as simulate_command
from coral_hpc.simulate import run as simulate_run
from coral_hpc.simulate.traces import TraceError, TraceRows, load_rows, scaled_workload

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"
MODELS = REPO / "examples" / "models.yaml"
TRACES = next(
    (base / "shared/data/traces" for base in (REPO.parent, REPO.parents[1])
     if (base / "shared/data/traces/azure-llm-2023").is_dir()),
    REPO / "absent",
)
AZURE = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"
needs_traces = pytest.mark.skipif(
    not AZURE.is_file() or not MOONCAKE.is_file(),
    reason="the Azure and Mooncake traces are not beside this checkout (../shared/data/traces)")
#: 72 s of trace: the example's 30-s re-plan interval re-plans three times
HOURS = "0.02"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("templates")


def _simulate(models: Path, cache: Path, *extra: str):
    return CliRunner().invoke(simulate_command, [
        str(models), "--snapshot", str(SNAPSHOT), "--hours", HOURS, "--json",
        "--cache-dir", str(cache), *extra])


@pytest.fixture(scope="module")
def doc(cache):
    run = _simulate(MODELS, cache, "--trace", str(AZURE))
    assert run.exit_code == 0, run.output
    return json.loads(run.stdout)


def _plan_cost(models: Path, cache: Path) -> float:
    run = CliRunner().invoke(plan_command, [str(models), "--snapshot", str(SNAPSHOT), "--json",
                                            "--cache-dir", str(cache)])
    assert run.exit_code == 0, run.output
    return json.loads(run.stdout)["cost_per_hour"]


@needs_traces
def test_every_model_has_its_attainment_and_the_cost_is_the_plans_cost_times_the_hours(
        doc, cache):
    hours = float(HOURS)
    assert doc["hours"] == pytest.approx(hours)
    assert set(doc["models"]) == {"qwen3-8b", "phi-4", "llama-70b"}
    for name, model in doc["models"].items():
        assert model["requests"] > 0, name
        assert 0.0 <= model["slo_attainment"] <= 1.0, name
        assert model["mean_replicas"] >= 1, name
    # the example's declared demand (4 req/s of qwen3-8b) is what the trace was scaled to
    assert doc["models"]["qwen3-8b"]["demand_rps"] == pytest.approx(4.0, rel=0.2)
    assert doc["models"]["qwen3-8b"]["planned_rps"] == pytest.approx(4.0 * 1.2)
    # the demand is declared, so every re-plan keeps the first plan: cost = that plan × hours,
    # and that plan is the one `coral-hpc plan` makes on the same snapshot
    points = doc["replicas_over_time"]
    assert [p["trigger"] for p in points] == ["start", "interval", "interval"]
    assert {p["cost_per_hour"] for p in points} == {points[0]["cost_per_hour"]}
    assert points[0]["cost_per_hour"] == pytest.approx(_plan_cost(MODELS, cache), rel=1e-3)
    assert doc["cost"]["provisioning"] == pytest.approx(points[0]["cost_per_hour"] * hours,
                                                        rel=1e-3)
    assert sum(m["cost"] for m in doc["models"].values()) == pytest.approx(
        doc["cost"]["provisioning"], rel=1e-3)
    assert sum(doc["gpu_hours_by_partition"].values()) == pytest.approx(
        sum(m["gpu_hours"] for m in doc["models"].values()), rel=1e-3)
    assert doc["cost"]["startup"] > 0  # the first plan's replicas pay their start-up
    assert doc["cost"]["total"] == pytest.approx(
        doc["cost"]["provisioning"] + doc["cost"]["startup"], abs=1e-3)


@needs_traces
def test_more_demand_buys_more_replicas_and_costs_more(doc, cache, tmp_path):
    busy = tmp_path / "models.yaml"
    busy.write_text(MODELS.read_text().replace("demand: {requests_per_s: 4}",
                                               "demand: {requests_per_s: 40}"))
    run = _simulate(busy, cache, "--trace", str(AZURE))
    assert run.exit_code == 0, run.output
    more = json.loads(run.stdout)
    assert more["models"]["qwen3-8b"]["requests"] > 5 * doc["models"]["qwen3-8b"]["requests"]
    assert more["models"]["qwen3-8b"]["mean_replicas"] > doc["models"]["qwen3-8b"]["mean_replicas"]
    assert more["cost"]["provisioning"] > doc["cost"]["provisioning"]
    # the other models' demand did not move: neither did their replicas
    assert more["models"]["llama-70b"]["mean_replicas"] == doc["models"]["llama-70b"][
        "mean_replicas"]


@needs_traces
def test_one_model_replays_its_own_trace(cache):
    run = _simulate(MODELS, cache, "--trace", str(AZURE), "--trace", f"phi-4={MOONCAKE}")
    assert run.exit_code == 0, run.output
    models = json.loads(run.stdout)["models"]
    assert "conversation_trace.jsonl" in models["phi-4"]["trace"]
    assert "AzureLLMInferenceTrace_conv.csv" in models["qwen3-8b"]["trace"]


@needs_traces
def test_the_table_names_every_model_and_partition_and_the_plot_is_a_png(cache, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sim.png"
    run = CliRunner().invoke(simulate_command, [
        str(MODELS), "--snapshot", str(SNAPSHOT), "--hours", HOURS, "--trace", str(AZURE),
        "--cache-dir", str(cache), "--plot", str(png)])
    assert run.exit_code == 0, run.output
    for name in ("qwen3-8b", "phi-4", "llama-70b", "a100", "v100", "GPU-hours by partition",
                 "Replicas over time"):
        assert name in run.stdout, name
    assert "served 0.00-0.02 h" in run.stderr  # progress goes to stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_snapshot_or_a_reachable_slurm_it_fails_saying_what_to_give(cache, tmp_path):
    # the unit lane's PATH has Slurm commands that fail at once (tests/unit/conftest.py)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                     '{"timestamp": 1000, "input_length": 10, "output_length": 5}\n')
    run = CliRunner().invoke(simulate_command, [str(MODELS), "--trace", str(trace), "--json",
                                                "--cache-dir", str(cache)])
    assert run.exit_code in (2, 3), run.output
    assert "--snapshot" in run.stderr and "Slurm" in run.stderr
    assert "simulating" not in run.stderr and run.stdout == ""


def test_a_missing_trace_exits_2_naming_it(cache, tmp_path):
    missing = tmp_path / "no-such-trace.csv"
    run = _simulate(MODELS, cache, "--trace", str(missing))
    assert run.exit_code == 2
    assert str(missing) in run.stderr and "no such trace file" in run.stderr


def test_a_trace_for_an_unknown_model_exits_2_naming_it_and_the_models(cache, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                     '{"timestamp": 1000, "input_length": 10, "output_length": 5}\n')
    run = _simulate(MODELS, cache, "--trace", str(trace), "--trace", f"gpt-9={trace}")
    assert run.exit_code == 2
    assert "gpt-9" in run.stderr and "qwen3-8b" in run.stderr
    no_default = _simulate(MODELS, cache, "--trace", f"phi-4={trace}")
    assert no_default.exit_code == 2 and "qwen3-8b" in no_default.stderr


def test_a_malformed_trace_exits_2_naming_file_and_line(cache, tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                     '{"timestamp": 1000, "input_len": 10}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2: .*input_length"):
        load_rows(trace)
    run = _simulate(MODELS, cache, "--trace", str(trace))
    assert run.exit_code == 2 and f"{trace}:2:" in run.stderr
    other = tmp_path / "trace.parquet"
    other.write_text("x")
    run = _simulate(MODELS, cache, "--trace", str(other))
    assert run.exit_code == 2 and "trace.parquet" in run.stderr and ".jsonl" in run.stderr


def test_the_workload_has_the_declared_rate_and_the_traces_lengths():
    t = np.arange(0.0, 600.0, 0.5)  # 2 req/s for 10 minutes
    prompt = np.where(t < 300, 100, 3000)
    rows = TraceRows("synthetic", t, prompt, np.full(len(t), 20))
    load = scaled_workload("m", rows, 0.0, 10.0, seed=3, run_s=1200.0)  # twice the trace
    assert len(load.at) / 1200.0 == pytest.approx(10.0, rel=0.05)
    assert set(np.unique(load.prompt)) == {100, 3000}  # lengths kept, never invented
    assert np.all(np.diff(load.at) >= 0) and load.at[-1] < 1200.0
    own = scaled_workload("m", rows, 0.0, None, seed=3, run_s=600.0)  # demand: auto
    assert len(own.at) / 600.0 == pytest.approx(2.0, rel=0.1)


def test_the_re_plan_rule_is_the_daemons_own_function():
    from coral_hpc.daemon import core

    assert simulate_run.replan_triggers is core.replan_triggers
    assert simulate_run.changed_models is core.changed_models
    assert simulate_run.deployment_demand is core.deployment_demand


def _jsonl_trace(path: Path, prompt: int, output: int, rows: int = 400) -> Path:
    """``rows`` requests 250 ms apart (timestamps in ms), each ``prompt`` tokens in and
    ``output`` out."""
    path.write_text("".join(
        json.dumps({"timestamp": 250 * i, "input_length": prompt, "output_length": output})
        + "\n" for i in range(rows)))
    return path


def test_a_declared_mix_the_replay_does_not_match_is_named_with_both_mixes(cache, tmp_path):
    """examples/models.yaml declares qwen3-8b's mix as 512 in / 128 out: a replay of 2,000-token
    prompts and 20-token answers is planned for the declared mix (as the daemon would) and the
    report says so, with the field to set; a replay of the declared mix is not flagged."""
    long = _jsonl_trace(tmp_path / "long.jsonl", 2000, 20)
    same = _jsonl_trace(tmp_path / "same.jsonl", 512, 128)
    run = _simulate(MODELS, cache, "--trace", str(same), "--trace", f"qwen3-8b={long}")
    assert run.exit_code == 0, run.output
    models = json.loads(run.stdout)["models"]
    mix = models["qwen3-8b"]["mix"]
    assert mix["planned"] == {"input_tokens": 512, "output_tokens": 128}
    assert mix["planned_from"] == "declared"
    assert mix["replayed"] == {"input_tokens": 2000, "output_tokens": 20}
    assert mix["differs"] is True
    # phi-4 declares 1,024 / 256: the 512 / 128 replay differs too; llama-70b the same
    assert models["phi-4"]["mix"]["differs"] is True
    text = CliRunner().invoke(simulate_command, [
        str(MODELS), "--snapshot", str(SNAPSHOT), "--hours", HOURS, "--cache-dir", str(cache),
        "--trace", str(long)])
    assert text.exit_code == 0, text.output
    words = " ".join(text.stdout.split())  # the console folds long lines
    assert ("note: qwen3-8b was planned for its declared mix, 512 in / 128 out tokens a "
            "request; the requests replayed average 2,000 in / 20 out") in words
    assert "set models[0].mix to that" in words
    matching = tmp_path / "models.yaml"
    matching.write_text(MODELS.read_text().replace(
        "mix: {input_tokens: 1024, output_tokens: 256}",
        "mix: {input_tokens: 512, output_tokens: 128}"))
    run = _simulate(matching, cache, "--trace", str(same))
    assert run.exit_code == 0, run.output
    assert not any(m["mix"]["differs"] for m in json.loads(run.stdout)["models"].values())
