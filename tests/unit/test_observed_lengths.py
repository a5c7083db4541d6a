"""A model's observed request lengths (issue 24 item 1): Stage 1's simulated capacity is judged
on them (a trace's, or the lengths ``coral-hpc simulate`` replays) instead of exponential
lengths with the mix's means; they key the Stage-1 library; ``models[].lengths.trace`` reads
them with simulate's trace readers and refuses a bad trace naming the file and the field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from coral_hpc.config import load_deployment
from coral_hpc.errors import ConfigError
from coral_hpc.model_archs import derived_deployment
from coral_hpc.model_lengths import read_lengths, trace_lengths
from coral_hpc.plan import inputs
from coral_hpc.plan.planner import PlanningError
from coral_hpc.simulate import run as simulate_run
from coral_hpc.simulate.traces import TraceRows
from coral_solver import simcap
from coral_solver.stage1 import Spec
from coral_solver.templates import PerfThroughput, _cache_key
from coral_solver.types import (
    OBSERVED_PAIRS,
    ModelSpec,
    ObservedLengths,
    Policy,
    Stage,
    Template,
)

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "examples" / "models.yaml"
SNAPSHOT = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"

# llama-3.1-8b on one A100, 1,024 in / 256 out, TTFT 2 s, TPOT 80 ms
MODEL = ModelSpec("m", "llama-3.1-8b", 1024, 256, 2.0, 0.08)
ONE_A100 = Template("m", 1, (Stage("a100", 32),), 0.0)
#: half short and half long requests with exactly the model's means (1,024 in, 256 out)
BIMODAL = ObservedLengths("bimodal", ((64, 16), (1984, 496)))


def test_observed_lengths_change_the_simulated_capacity_against_exponential_same_means():
    tm = PerfThroughput()
    exponential = tm.simulated_throughput(MODEL, ONE_A100, 0.95)
    observed = tm.simulated_throughput(replace(MODEL, lengths=BIMODAL), ONE_A100, 0.95)
    assert exponential > 0 and observed > 0
    # the same means, another distribution: the long half's prompts and KV cost the replica
    assert observed < 0.9 * exponential
    assert observed == simcap.template_capacity(
        "llama-3.1-8b", 1, ("a100",), (32,), tm._slo(MODEL),
        simcap.Lengths.sample(list(BIMODAL.pairs), "observed(bimodal)"), 0.95)
    # the analytic figure reads the means only
    assert tm.throughput(replace(MODEL, lengths=BIMODAL), "a100", 1, 32, 1) == \
        tm.throughput(MODEL, "a100", 1, 32, 1)


def test_the_distribution_drawn_says_which_and_is_cut_at_max_model_len():
    tm = PerfThroughput()
    assert tm._lengths(MODEL).source.startswith("exponential(mean 1024 in, 256 out")
    cut = tm._lengths(replace(MODEL, lengths=BIMODAL, max_model_len=1024))
    assert cut.source == "observed(bimodal, cut at 1024)"
    assert max(p + o for p, o in zip(cut.prompt, cut.output)) <= 1024
    assert min(cut.output) >= 1
    assert set(zip(cut.prompt, cut.output)) == {(64, 16), (1023, 1)}


def test_a_long_trace_is_kept_as_a_bounded_fixed_subsample_in_its_order():
    n = OBSERVED_PAIRS * 3
    prompts, outputs = list(range(1, n + 1)), [0] * n  # an output of 0 counts as 1 token
    first = ObservedLengths.bounded(prompts, outputs, "a")
    again = ObservedLengths.bounded(prompts, outputs, "b")
    assert len(first.pairs) == OBSERVED_PAIRS
    assert first.pairs == again.pairs and first.digest() == again.digest()
    assert [p for p, _ in first.pairs] == sorted(p for p, _ in first.pairs)
    assert {o for _, o in first.pairs} == {1}
    short = ObservedLengths.bounded([5, 6], [7, 8], "short")
    assert short.pairs == ((5, 7), (6, 8))
    with pytest.raises(ValueError, match="at most"):
        ObservedLengths("big", ((1, 1),) * (OBSERVED_PAIRS + 1))
    with pytest.raises(ValueError, match="no requests"):
        ObservedLengths.bounded([], [], "empty")


def test_observed_lengths_key_a_simulated_library_but_not_an_analytic_one():
    tm = PerfThroughput()
    gpus = {"a100": (8, 80.0)}
    fingerprint = "fixed"
    simulated = Policy(capacity="simulated")
    traced = replace(MODEL, lengths=BIMODAL)
    assert _cache_key(tm, traced, gpus, simulated, fingerprint) != \
        _cache_key(tm, MODEL, gpus, simulated, fingerprint)
    other = replace(MODEL, lengths=ObservedLengths("other", ((64, 16), (1984, 497))))
    assert _cache_key(tm, other, gpus, simulated, fingerprint) != \
        _cache_key(tm, traced, gpus, simulated, fingerprint)
    # where a sample came from changes no figure: the same pairs share a library
    renamed = replace(MODEL, lengths=replace(BIMODAL, source="renamed"))
    assert _cache_key(tm, renamed, gpus, simulated, fingerprint) == \
        _cache_key(tm, traced, gpus, simulated, fingerprint)
    assert _cache_key(tm, traced, gpus, Policy(), fingerprint) == \
        _cache_key(tm, MODEL, gpus, Policy(), fingerprint)


def test_a_stage1_spec_carries_the_observed_lengths():
    spec = Spec((replace(MODEL, lengths=BIMODAL), MODEL), {"site": {"a100": (8, 80.0)}})
    back = Spec.from_json(yaml.safe_load(yaml.safe_dump(spec.to_json())))
    assert back.models == spec.models


def _models_yaml(tmp_path: Path, lengths: dict | None, capacity: str = "simulated") -> Path:
    data = yaml.safe_load(MODELS.read_text())
    data["policy"]["capacity"] = capacity
    if lengths is not None:
        data["models"][0]["lengths"] = lengths
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _azure(path: Path, rows: list[tuple[int, int]]) -> Path:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{p},{o}\n" for i, (p, o) in enumerate(rows)))
    return path


def test_a_models_trace_becomes_its_observed_lengths_in_the_plans_model_specs(tmp_path):
    _azure(tmp_path / "conv.csv", [(100, 10), (3000, 20), (7, 300)])
    (tmp_path / "chat.jsonl").write_text(
        '{"timestamp": 0, "input_length": 50, "output_length": 5}\n'
        '{"timestamp": 1000, "input_length": 60, "output_length": 6}\n')
    path = _models_yaml(tmp_path, {"trace": "conv.csv"})  # relative: beside the file
    data = yaml.safe_load(path.read_text())
    data["models"][1]["lengths"] = {"trace": str(tmp_path / "chat.jsonl")}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    deployment = derived_deployment(load_deployment(path))
    assert deployment.models[0].lengths.trace == str(tmp_path / "conv.csv")
    specs = {m.name: m for m in inputs.model_specs(deployment)}
    first, second = (specs[m.name] for m in deployment.models[:2])
    assert first.lengths is not None and second.lengths is not None
    assert first.lengths.pairs == ((100, 10), (3000, 20), (7, 300))
    assert str(tmp_path / "conv.csv") in first.lengths.source
    assert second.lengths.pairs == ((50, 5), (60, 6))
    assert specs[deployment.models[2].name].lengths is None


@pytest.mark.parametrize("name,content,expected", [
    ("absent.csv", None, "no such trace file"),
    ("bad.csv", "when,prompt\n1,2\n3,4\n", "expected TIMESTAMP, ContextTokens, GeneratedTokens"),
    ("bad.jsonl", "{\"timestamp\": 1}\n{\"timestamp\": 2}\n", "input_length, output_length"),
])
def test_a_trace_that_cannot_be_read_is_refused_naming_file_line_and_field(
        tmp_path, name, content, expected):
    if content is not None:
        (tmp_path / name).write_text(content)
    path = _models_yaml(tmp_path, {"trace": name})
    with pytest.raises(ConfigError) as caught:
        derived_deployment(load_deployment(path))
    problems = caught.value.problems
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}:")
    assert "models[0].lengths.trace:" in problems[0]
    assert str(tmp_path / name) in problems[0] and expected in problems[0]


def test_a_trace_of_another_format_or_an_embedding_models_lengths_is_refused(tmp_path):
    path = _models_yaml(tmp_path, {"trace": "lengths.parquet"})
    with pytest.raises(ConfigError) as caught:
        load_deployment(path)
    text = "\n".join(caught.value.problems)
    assert "models[0].lengths.trace" in text
    assert "Azure LLM inference trace CSV" in text and "Mooncake JSONL" in text
    data = yaml.safe_load(MODELS.read_text())
    model = data["models"][0]
    model["slo"] = {"latency_ms": 200}
    model["mix"] = {"input_tokens": 100}
    model["task"] = "embed"
    model["lengths"] = {"trace": "conv.csv"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"models\[0\]\.lengths: .*embedding model"):
        load_deployment(path)


def test_an_unchanged_trace_is_read_once_and_an_edited_one_afresh(tmp_path, monkeypatch):
    trace = _azure(tmp_path / "t.csv", [(100, 10), (200, 20)])
    first = trace_lengths(str(trace))
    reads = []
    import coral_hpc.model_lengths as module

    real = module.load_rows
    monkeypatch.setattr(module, "load_rows", lambda p: reads.append(p) or real(p))
    assert trace_lengths(str(trace)) is first and reads == []
    _azure(trace, [(100, 10), (200, 20), (300, 30)])
    assert trace_lengths(str(trace)).pairs == ((100, 10), (200, 20), (300, 30))
    assert reads == [str(trace)]


def _rows(prompts: list[int], outputs: list[int]) -> TraceRows:
    return TraceRows("synthetic", np.arange(len(prompts), dtype=float) * 10.0,
                     np.array(prompts), np.array(outputs))


def test_simulate_plans_on_the_lengths_it_replays_clipped_to_the_context(tmp_path):
    """The replay's window lengths, cut at the architecture's context as the requests it
    serves are, reach every ModelSpec the planner is asked with, in place of a configured
    trace's; the deployment passed in is left as it was."""
    from coral_hpc.cli.cluster import load_snapshot_file

    _azure(tmp_path / "conv.csv", [(100, 10), (200, 20)])
    deployment = derived_deployment(load_deployment(
        _models_yaml(tmp_path, {"trace": "conv.csv"})))
    before = inputs.model_specs(deployment)[0].lengths
    huge = 10_000_000  # longer than any context: cut as served
    rows = _rows([huge, 500, 700], [5, 50, 70])
    loads = simulate_run.model_workloads(deployment, {m.name: rows for m in deployment.models},
                                         60.0)
    asked = []

    def planner(request):
        asked.append(inputs.model_specs(request.deployment))
        raise PlanningError("recorded")

    simulate_run.simulate(deployment, load_snapshot_file(str(SNAPSHOT)), loads, 60.0, planner)
    assert asked
    for model, spec in zip(deployment.models, asked[0]):
        assert spec.lengths is not None and spec.lengths.source.startswith("synthetic from 0 s")
        context = simulate_run.catalog.model_arch(model.arch_key).max_context
        assert set(spec.lengths.pairs) == {(context - 1, 1), (500, 50), (700, 70)}
    assert inputs.model_specs(deployment)[0].lengths == before  # not replaced in place


def test_read_lengths_drops_what_a_model_no_longer_names(tmp_path):
    _azure(tmp_path / "conv.csv", [(100, 10), (200, 20)])
    deployment = load_deployment(_models_yaml(tmp_path, {"trace": "conv.csv"}))
    assert read_lengths(deployment) == []
    assert inputs.observed_lengths(deployment, deployment.models[0].name) is not None
    plain = deployment.model_copy(update={"models": tuple(
        m.model_copy(update={"lengths": None}) for m in deployment.models)})
    assert read_lengths(plain) == []
    assert inputs.observed_lengths(plain, deployment.models[0].name) is None
