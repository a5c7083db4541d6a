"""models.yaml validation: good files load; every bad one names file, line and field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coral_hpc.config import load_deployment, parse_deployment, parse_slurm_time
from coral_hpc.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "models.yaml"

BASE = """\
deployment: t
state_dir: /tmp/coral-state
db_path: /tmp/coral.db
cluster:
  partitions:
    - name: a100
      gpu_types: [a100]
      price: {a100: 2.0}
    - name: v100
      gpu_types: [v100]
      price: {v100: 0.8}
engine:
  kind: sim
models:
  - name: small
    source: Qwen/Qwen3-8B
    architecture: qwen3-8b
    mix: {input_tokens: 512, output_tokens: 128}
    demand: {requests_per_s: 2}
    slo: {ttft_s: 2, tpot_s: 0.05}
"""


def test_base_is_valid():
    dep = parse_deployment(BASE, "base.yaml")
    assert dep.cluster.price_unit == "gpu_hour"
    assert dep.models[0].demand_rps == 2


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path):
    dep = load_deployment(path)
    assert dep.models


def test_token_demand_is_converted_to_requests():
    text = BASE.replace("demand: {requests_per_s: 2}", "demand: {output_tokens_per_s: 640}")
    assert parse_deployment(text).models[0].demand_rps == pytest.approx(5.0)


def test_policy_solver_is_highs_unless_a_pyomo_solver_is_named():
    assert parse_deployment(BASE).policy.solver == "highs"
    for name in ("pyomo:gurobi", "pyomo:cplex_direct", "pyomo:appsi_highs"):
        assert parse_deployment(BASE + f"policy: {{solver: '{name}'}}\n").policy.solver == name


def test_deployment_is_frozen():
    dep = parse_deployment(BASE)
    with pytest.raises(Exception):
        dep.deployment = "other"  # type: ignore[misc]


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# (id, edit, expected field path, expected line, a phrase of the message)
BAD_CASES = [
    ("unknown-top-key", lambda t: t + "colour: red\n", "colour", 21, "unknown key 'colour'"),
    ("unknown-model-key", lambda t: _edit(t, "    slo:", "    gpus: 4\n    slo:"), "models[0].gpus", 20, "valid keys here"),
    ("missing-deployment", lambda t: _edit(t, "deployment: t\n", ""), "deployment", 1, "required"),
    ("unsafe-deployment", lambda t: _edit(t, "deployment: t", "deployment: 'my deploy'"), "deployment", 1, "safe name"),
    ("unsafe-model-name", lambda t: _edit(t, "name: small", "name: Small/Model"), "models[0].name", 15, "safe name"),
    ("backend", lambda t: _edit(t, "cluster:\n", "cluster:\n  slurm: {backend: rest}\n"), "cluster.slurm.backend", 5, "'auto', 'cli' or 'pyslurm'"),
    ("engine-kind", lambda t: _edit(t, "kind: sim", "kind: tgi"), "engine.kind", 13, "'vllm' or 'sim'"),
    ("negative-ttft", lambda t: _edit(t, "ttft_s: 2", "ttft_s: -2"), "models[0].slo.ttft_s", 20, "greater than 0"),
    ("zero-tpot", lambda t: _edit(t, "tpot_s: 0.05", "tpot_s: 0"), "models[0].slo.tpot_s", 20, "greater than 0"),
    ("mix-zero", lambda t: _edit(t, "input_tokens: 512", "input_tokens: 0"), "models[0].mix.input_tokens", 18, "greater than 0"),
    ("demand-both", lambda t: _edit(t, "{requests_per_s: 2}", "{requests_per_s: 2, output_tokens_per_s: 3}"), "models[0].demand", 19, "exactly one"),
    ("demand-word", lambda t: _edit(t, "{requests_per_s: 2}", "lots"), "models[0].demand", 19, "auto"),
    ("price-mixed", lambda t: _edit(t, "price: {v100: 0.8}", "price: billing"), "cluster", 4, "one cost unit"),
    ("price-negative", lambda t: _edit(t, "{a100: 2.0}", "{a100: -1}"), "cluster.partitions[0].price", 8, "≥ 0"),
    ("price-missing-type", lambda t: _edit(t, "gpu_types: [a100]", "gpu_types: [a100, h100]"), "cluster.partitions[0]", 6, "h100"),
    ("duplicate-partition", lambda t: _edit(t, "name: v100", "name: a100"), "cluster", 4, "listed twice"),
    ("duplicate-model", lambda t: t + "  - name: small\n    source: x\n    architecture: qwen3-8b\n    mix: {input_tokens: 1, output_tokens: 1}\n    demand: auto\n    slo: {ttft_s: 1, tpot_s: 0.1}\n", "(top level)", 1, "used twice"),
    ("unknown-model-partition", lambda t: _edit(t, "    slo:", "    partitions: [h100]\n    slo:"), "models[0].partitions", 20, "not in cluster.partitions"),
    ("replica-bounds", lambda t: _edit(t, "    slo:", "    min_replicas: 3\n    max_replicas: 1\n    slo:"), "models[0]", 15, "below min_replicas"),
    ("negative-priority", lambda t: _edit(t, "    slo:", "    priority: -1\n    slo:"), "models[0].priority", 20, "greater than or equal to 0.001"),
    ("bad-time-limit", lambda t: _edit(t, "cluster:\n", "cluster:\n  time_limit: 'four hours'\n"), "cluster.time_limit", 5, "Slurm time"),
    ("bad-listen", lambda t: t + "gateway: {listen: 'localhost'}\n", "gateway.listen", 21, "host:port"),
    ("open-beyond-loopback", lambda t: t + "gateway: {listen: '0.0.0.0:8000', open_on_loopback: true}\n", "gateway", 21, "open_on_loopback: true serves without API keys"),
    ("vllm-without-env", lambda t: _edit(t, "kind: sim", "kind: vllm"), "cluster.partitions[0].environment", 6, "environment"),
    ("bad-env-kind", lambda t: _edit(t, "price: {v100: 0.8}", "price: {v100: 0.8}\n      environment: {kind: conda, path: /x}"), "cluster.partitions[1].environment", 12, "venv"),
    ("no-models", lambda t: t.split("models:")[0] + "models: []\n", "models", 14, "at least 1"),
    ("no-partitions", lambda t: _edit(t, "  partitions:\n", "  partitions: []\n  old:\n"), "cluster.partitions", 5, "at least 1"),
    ("policy-rho", lambda t: t + "policy: {rho: 0.5}\n", "policy.rho", 21, "greater than 1"),
    ("policy-unknown", lambda t: t + "policy: {replan_every: 10}\n", "policy.replan_every", 21, "valid keys here"),
    ("policy-solver", lambda t: t + "policy: {solver: gurobi}\n", "policy.solver", 21, "'highs' or 'pyomo:<name>'"),
    ("policy-solver-empty", lambda t: t + "policy: {solver: 'pyomo:'}\n", "policy.solver", 21, "pyomo:gurobi"),
    ("bad-gpu-type", lambda t: _edit(t, "gpu_types: [v100]", "gpu_types: ['V 100']"), "cluster.partitions[1].gpu_types", 10, "not a GPU type"),
    ("duplicate-yaml-key", lambda t: _edit(t, "deployment: t\n", "deployment: t\ndeployment: u\n"), None, 2, "duplicate key 'deployment'"),
    ("not-yaml", lambda t: t + "models: [unclosed\n", None, 22, "not valid YAML"),
    ("not-a-mapping", lambda t: "- just\n- a list\n", "(top level)", 1, "expected a mapping"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_config_names_the_field(case):
    _, edit, field, line, phrase = case
    text = edit(BASE)
    with pytest.raises(ConfigError) as info:
        parse_deployment(text, "bad.yaml")
    problems = info.value.problems
    assert problems, "a ConfigError must carry at least one problem"
    wanted = [p for p in problems if (field is None or f": {field}: " in p)]
    assert wanted, f"no problem names field {field!r}: {problems}"
    problem = wanted[0]
    assert problem.startswith("bad.yaml:"), problem
    assert re.match(rf"bad\.yaml:{line}: ", problem), f"expected line {line}: {problem}"
    assert phrase.lower() in problem.lower(), problem


def test_every_problem_is_reported_at_once():
    text = _edit(BASE, "ttft_s: 2", "ttft_s: -2")
    text = _edit(text, "kind: sim", "kind: tgi")
    with pytest.raises(ConfigError) as info:
        parse_deployment(text, "bad.yaml")
    fields = " ".join(info.value.problems)
    assert "models[0].slo.ttft_s" in fields and "engine.kind" in fields


def test_missing_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        load_deployment(tmp_path / "nope.yaml")
    assert "cannot read" in str(info.value)


@pytest.mark.parametrize(
    "spec,seconds",
    [("30", 1800), ("01:30", 90), ("04:00:00", 14400), ("1-00:00:00", 86400), ("2-12", 216000), (90, 5400)],
)
def test_slurm_time(spec, seconds):
    assert parse_slurm_time(spec) == seconds


def test_validate_cli_exit_codes(tmp_path: Path):
    good = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "validate", str(EXAMPLE)],
        capture_output=True, text=True, cwd=REPO,
    )
    assert good.returncode == 0, good.stderr
    assert "valid" in good.stdout
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(_edit(BASE, "ttft_s: 2", "ttft_s: -2"))
    bad = subprocess.run(
        [sys.executable, "-c", "from coral_hpc.cli import main; main()", "validate", str(bad_file)],
        capture_output=True, text=True, cwd=REPO,
    )
    assert bad.returncode == 2
    assert f"{bad_file}:20: models[0].slo.ttft_s" in bad.stderr


def test_base_yaml_parses_as_plain_yaml():
    # guards the fixture itself: the line numbers above assume this exact layout
    assert yaml.safe_load(BASE)["models"][0]["name"] == "small"
