"""Role profiles (``coral-hpc profile --roles``): written beside the other measured profiles
under ``roles/``, read by the planner, so a ``measured_only`` deployment with disaggregation
plans prefill and decode replicas from measurements, and is refused, naming what to profile,
when they are missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from coral_hpc.config import measured_profiles_problems, parse_deployment
from coral_hpc.profile.roles import RoleMeasurements
from coral_hpc.profile.write import role_profile_document, role_profile_path, write_profile
from coral_solver import catalog, perf, perf_roles
from coral_solver.catalog import CatalogError
from coral_solver.perf_profiles import load_measured, parse_measured
from coral_solver.templates import PerfThroughput, library_templates
from coral_solver.types import ModelSpec, Policy
from tests.support.vllm_example import disaggregated_example, plan_json

REPO = Path(__file__).resolve().parents[2]
RECORDED_PP2 = REPO / "tests/data/profiles/pipelines/coral-tiny-llama__v100__tp1__pp2.yaml"
GPUS = {"v100": (4, 32.0), "a100": (4, 40.0)}
MIX, SLO = (438, 6), (4.0, 0.4)  # the recorded pipeline's mix and SLO
MEASURED_ONLY = Policy(n_max=3, rho=1e5, max_tp=1, measured_only=True)


def _measured(role: str, rps: float) -> RoleMeasurements:
    return RoleMeasurements(
        role, kv_capacity_tokens=1_048_576,
        steps=[(0, 438, 438, 0.05)] if role == "prefill" else [(4, 0, 1764, 0.03)],
        throughput=[(*MIX, *SLO, rps)], search_start=[(*MIX, *SLO, rps * 0.8)],
        judged={"ttft_s": 3.6, "tpot_s": 0.4, "kv_transfer_s": 0.0})


def _write_roles(folder: Path, rates: dict[str, float], gpu: str = "v100") -> list[Path]:
    paths = []
    for role, rps in rates.items():
        path = role_profile_path(folder, "coral-tiny-llama", gpu, 1, role)
        paths.append(write_profile(path, role_profile_document(
            arch="coral-tiny-llama", gpu=gpu, tp=1, layers=4, source="test", model="tiny",
            partition="cpu", startup_s=10.0, submit_to_ready_s=12.0,
            measured=_measured(role, rps))))
    return paths


@pytest.fixture
def folder(tmp_path):
    yield tmp_path
    perf.configure()


def _model(disaggregation: str = "on") -> ModelSpec:
    return ModelSpec(name="tiny", arch="coral-tiny-llama", input_tokens=MIX[0],
                     output_tokens=MIX[1], ttft_s=SLO[0], tpot_s=SLO[1], demand_rps=1.0,
                     disaggregation=disaggregation)


def test_a_written_role_profile_reads_back_with_its_role_and_point(folder):
    prefill, decode = _write_roles(folder, {"prefill": 7.0, "decode": 3.0})
    assert prefill == folder / "roles" / "coral-tiny-llama__v100__tp1__prefill.yaml"
    got = parse_measured(prefill)
    assert (got.role, got.layers, got.kv_capacity_tokens) == ("prefill", 4, 1_048_576)
    assert [(p.input_tokens, p.output_tokens, p.ttft_s, p.tpot_s, p.requests_per_s)
            for p in got.throughput] == [(*MIX, *SLO, 7.0)]
    assert yaml.safe_load(decode.read_text())["judged_against"]["tpot_s"] == 0.4
    # role profiles are read apart: never as an aggregated replica's figures
    assert load_measured((folder,)) == {}
    assert {p.role for p in load_measured((folder,), roles=True)[
        ("coral-tiny-llama", "v100", 1)]} == {"prefill", "decode"}


def test_a_role_profile_in_the_wrong_folder_or_of_an_unknown_role_is_refused(folder):
    (path,) = _write_roles(folder, {"prefill": 7.0})
    path.rename(folder / path.name)
    with pytest.raises(CatalogError, match=r"__prefill.yaml: field 'role' = 'prefill': belongs"):
        load_measured((folder,))
    bad = folder / "x.yaml"
    bad.write_text(path.name and (folder / path.name).read_text().replace(
        "role: prefill", "role: both-ways"))
    with pytest.raises(CatalogError, match=r"x.yaml: field 'role' = 'both-ways': expected"):
        parse_measured(bad)


def test_measured_only_disaggregation_plans_both_pools_from_role_profiles(folder):
    _write_roles(folder, {"prefill": 7.0, "decode": 3.0})
    perf.configure(measured=[folder])
    got = library_templates(PerfThroughput(), _model("on"), GPUS, MEASURED_ONLY)
    # only the measured layout (v100, TP 1, one stage of all 4 layers), each role its figure
    assert sorted((t.role, t.stages[0].gpu_type, t.pp, t.throughput) for t in got) == [
        ("decode", "v100", 1, 3.0), ("prefill", "v100", 1, 7.0)]
    # the plan says where each figure came from
    from coral_hpc.plan.figures import figures_used

    assert sorted(figures_used(t, "coral-tiny-llama") for t in got) == [
        "measured decode (coral-tiny-llama__v100__tp1__decode.yaml)",
        "measured prefill (coral-tiny-llama__v100__tp1__prefill.yaml)"]
    # the same model planned from the analytic model has other (more) layouts
    analytic = library_templates(PerfThroughput(), _model("on"), GPUS,
                                 Policy(n_max=3, rho=1e5, max_tp=1))
    assert len(analytic) > len(got)


def test_one_missing_role_leaves_that_pool_without_templates(folder):
    _write_roles(folder, {"prefill": 7.0})
    perf.configure(measured=[folder])
    got = library_templates(PerfThroughput(), _model("on"), GPUS, MEASURED_ONLY)
    assert [t.role for t in got] == ["prefill"]


def test_an_aggregated_measurement_never_rates_a_role(folder):
    """A measured aggregated pipeline (``--pp 2``) is no prefill or decode figure: with
    measured_only and no role profile nothing is planned for either role."""
    (folder / "pipelines").mkdir()
    (folder / "pipelines" / RECORDED_PP2.name).write_text(RECORDED_PP2.read_text())
    perf.configure(measured=[folder])
    assert library_templates(PerfThroughput(), _model("on"), GPUS, MEASURED_ONLY) == []
    # aggregated, it is planned from that measurement
    assert library_templates(PerfThroughput(), _model("off"), GPUS, MEASURED_ONLY)


def test_a_measured_role_point_overrides_the_analytic_role_figure(folder):
    arch, v100 = catalog.model_arch("coral-tiny-llama"), catalog.gpu_spec("v100")
    slo, mix = perf.Slo(*SLO), perf.Mix(*MIX)
    before = perf_roles.phase_throughput(arch, v100, 1, 4, 1, slo, mix, "decode")
    _write_roles(folder, {"decode": 0.123})
    perf.configure(measured=[folder])
    assert perf_roles.phase_throughput(arch, v100, 1, 4, 1, slo, mix, "decode") == 0.123
    assert perf_roles.phase_throughput(arch, v100, 1, 4, 1, slo, mix, "prefill") > 0
    assert before != 0.123
    # a stricter SLO than the one measured: the measurement does not apply
    strict = perf.Slo(SLO[0], SLO[1] / 2)
    assert perf.measured_phase_throughput(arch, v100, 1, strict, mix, "decode") is None


def test_a_measured_role_point_overrides_the_simulated_role_figure(folder):
    """Under ``capacity: simulated`` a one-stage role template with a measured role profile
    keeps the measurement, as an aggregated one keeps its measured point; the other role, not
    measured, is simulated."""
    from coral_solver import simcap, simcap_roles

    policy = Policy(n_max=1, rho=1e5, max_tp=1, capacity="simulated")
    gpus = {"v100": (4, 32.0)}
    tm = PerfThroughput()
    before = {t.role: t for t in library_templates(tm, _model("on"), gpus, policy)}
    _write_roles(folder, {"decode": 0.123})
    perf.configure(measured=[folder])
    after = {t.role: t for t in library_templates(tm, _model("on"), gpus, policy)}
    assert before["decode"].throughput != 0.123
    assert after["decode"].throughput == 0.123
    prefill = after["prefill"]
    assert prefill.throughput == simcap_roles.role_template_capacity(
        "coral-tiny-llama", 1, ("v100",), (4,), perf.Slo(*SLO),
        simcap.Lengths.exponential(*MIX), 0.95, "prefill")


DEPLOYMENT = """\
deployment: d
state_dir: /tmp/coral-state
db_path: /tmp/coral.db
cluster:
  partitions:
    - {name: cpu, gpu_types: [v100], price: {v100: 1.0}}
engine:
  kind: sim
models:
  - name: tiny
    source: /models/tiny
    architecture: coral-tiny-llama
    mix: {input_tokens: 438, output_tokens: 6}
    demand: {requests_per_s: 1}
    slo: {ttft_s: 4.0, tpot_s: 0.4}
profiles_dir: PROFILES
policy: {measured_only: true, disaggregation: "on"}
"""


def test_measured_only_with_disaggregation_names_the_role_profiles_to_measure(folder):
    (folder / "coral-tiny-llama__v100__tp1.yaml").write_text("arch: coral-tiny-llama\n")
    text = DEPLOYMENT.replace("PROFILES", str(folder))
    (problem,) = measured_profiles_problems(parse_deployment(text))
    assert "holds no prefill or decode profile of coral-tiny-llama" in problem
    assert "`coral-hpc profile --roles --model tiny`" in problem
    _write_roles(folder, {"prefill": 7.0})
    (problem,) = measured_profiles_problems(parse_deployment(text))
    assert "holds no decode profile" in problem
    _write_roles(folder, {"decode": 3.0})
    assert measured_profiles_problems(parse_deployment(text)) == []
    # auto: aggregated profiles suffice, role profiles add choices
    auto = text.replace('disaggregation: "on"', "disaggregation: auto")
    (folder / "roles" / "coral-tiny-llama__v100__tp1__decode.yaml").unlink()
    assert measured_profiles_problems(parse_deployment(auto)) == []


def test_plan_refuses_the_cpu_example_disaggregated_until_its_roles_are_profiled(
        tmp_path, monkeypatch):
    """examples/vllm-cpu.yaml (measured_only) with ``disaggregation: on``: the configuration is
    taken, and ``plan`` exits 2 naming the role profiles each model lacks."""
    path = disaggregated_example(tmp_path, measured_only=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = plan_json(path)
    assert out.exit_code == 2, out.output
    assert "`coral-hpc profile --roles --model tiny-llama`" in out.output
    assert "holds no prefill or decode profile" in out.output


@pytest.mark.parametrize("extra", [["--pp", "2"],
                                   ["--stages", "v100,a100", "--model", "tiny-llama"]])
def test_profile_roles_measures_one_stage_only(tmp_path, extra):
    """``--roles`` with a pipeline asked for is refused before any job is submitted."""
    from click.testing import CliRunner

    from coral_hpc.cli.profile import profile

    text = (REPO / "examples" / "vllm-cpu.yaml").read_text().replace(
        "profiles_dir: vllm-cpu.profiles", f"profiles_dir: {tmp_path / 'profiles'}")
    path = tmp_path / "vllm-cpu.yaml"
    path.write_text(text)
    out = CliRunner().invoke(profile, [str(path), "--roles", *extra])
    assert out.exit_code == 2, out.output
    assert "--roles measures one-stage replicas" in out.output
    assert not (tmp_path / "profiles").exists()


def test_prefill_phases_send_fresh_prompts(monkeypatch):
    """A prefill role's load is all prompts: a later open-loop phase must not resend an earlier
    phase's prompts, which a prefix-caching engine would answer from its cache."""
    from coral_hpc.profile import measure, openloop

    salts: list[int] = []

    def phase(url, model, rate, *, first_salt=0, **_kw):
        salts.append(first_salt)
        timings = (openloop.Timing(0.1, 0.0),) * 10
        return openloop.Phase(rate, 1.0, timings, 0.0, 0.0, 0.0, 1.0)

    monkeypatch.setattr(openloop, "poisson_phase", phase)
    record: list = []
    measure.open_loop_capacity("http://x", "m", 64, 1, 1.0, 0.2, 1.0, None, record,
                               lambda _m: None, fresh_prompts=True)
    assert len(salts) > 1 and salts == [10 * i for i in range(len(salts))]
    salts.clear()
    measure.open_loop_capacity("http://x", "m", 64, 1, 1.0, 0.2, 1.0, None, record,
                               lambda _m: None)
    assert set(salts) == {0}  # the aggregated profile's phases, as before


def test_the_decode_role_reports_the_share_of_prompt_tokens_its_cache_served():
    """Recorded /metrics of vLLM 0.32.0's CPU build: 70,784 prompt tokens asked of the prefix
    cache and none served (its 128-token blocks: the profile's 64-token prompts never fill one)."""
    from coral_hpc.engine import vllm_metrics
    from coral_hpc.profile.roles import _HITS, _QUERIES, _cached_share

    text = (REPO / "tests/data/vllm/metrics-vllm-0.32.0-cpu.txt").read_text()
    after = vllm_metrics.counter_totals(text, (_HITS, _QUERIES))
    assert after == {_HITS: 0.0, _QUERIES: 70784.0}
    zero = {_HITS: 0.0, _QUERIES: 0.0}
    assert _cached_share(zero, after, warm_tokens=784) == 0.0
    # warm-ups miss and fill the cache; the measured requests' prompts then hit
    assert _cached_share(zero, {_HITS: 6000.0, _QUERIES: 14000.0}, 8000) == 1.0
    assert _cached_share(zero, {_HITS: 3000.0, _QUERIES: 14000.0}, 8000) == 0.5
    assert _cached_share(None, after, 0) is None  # an engine without the counters
