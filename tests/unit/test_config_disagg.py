"""models.yaml: policy.disaggregation and engine.kv_connector are validated with field and line."""

from __future__ import annotations

import re

import pytest

from coral_hpc.config import parse_deployment
from coral_hpc.errors import ConfigError
from coral_hpc.plan.inputs import model_specs

from .test_config import BASE

VLLM = BASE.replace("engine:\n  kind: sim\n", "engine:\n  kind: vllm\n").replace(
    "      price: {a100: 2.0}\n", "      price: {a100: 2.0}\n      environment: {kind: venv, path: /opt/v}\n").replace(
    "      price: {v100: 0.8}\n", "      price: {v100: 0.8}\n      environment: {kind: venv, path: /opt/v}\n")


def _problem(text: str, field: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_deployment(text, "bad.yaml")
    wanted = [p for p in info.value.problems if f": {field}: " in p]
    assert wanted, info.value.problems
    return wanted[0]


def test_disaggregation_is_off_by_default_and_reaches_the_planner():
    dep = parse_deployment(BASE)
    assert dep.policy.disaggregation == "off" and dep.engine.kv_connector is None
    on = parse_deployment(BASE + "policy: {disaggregation: auto, kv_fabric_gbs: 25}\n")
    assert [m.disaggregation for m in model_specs(on)] == ["auto"]
    assert on.policy.kv_fabric_gbs == 25


def test_a_bad_disaggregation_word_names_the_field_and_line():
    problem = _problem(BASE + "policy: {disaggregation: yes-please}\n", "policy.disaggregation")
    assert re.match(r"bad\.yaml:21: ", problem) and "'auto', 'on' or 'off'" in problem


def test_vllm_disaggregation_needs_a_kv_connector():
    problem = _problem(VLLM + "policy: {disaggregation: on}\n", "engine.kv_connector")
    assert "needs engine.kv_connector" in problem and "NixlConnector" in problem
    ok = VLLM.replace("  kind: vllm\n", "  kind: vllm\n  kv_connector: {name: NixlConnector}\n")
    assert parse_deployment(ok + "policy: {disaggregation: on}\n").engine.kv_connector.name == \
        "NixlConnector"


def test_an_unknown_kv_connector_is_refused_with_the_valid_names():
    text = VLLM.replace("  kind: vllm\n", "  kind: vllm\n  kv_connector: {name: CarrierPigeon}\n")
    problem = _problem(text, "engine.kv_connector.name")
    assert "ExampleConnector" in problem and "LMCacheConnectorV1" in problem


def test_shared_path_belongs_to_the_example_connector_only():
    text = VLLM.replace("  kind: vllm\n",
                        "  kind: vllm\n  kv_connector: {name: NixlConnector, shared_path: /x}\n")
    assert "ExampleConnector only" in _problem(text, "engine.kv_connector")


def test_measured_only_takes_disaggregation_and_reaches_the_planner():
    """Prefill-only and decode-only replicas are planned from role profiles (``coral-hpc
    profile --roles``): the configuration takes both; missing role profiles are a plan problem
    (tests/unit/test_role_profiles.py)."""
    from coral_hpc.plan.inputs import policy_of

    both = parse_deployment(BASE + "policy: {measured_only: true, disaggregation: auto}\n")
    assert both.policy.measured_only and both.policy.disaggregation == "auto"
    dep = parse_deployment(BASE + "policy: {measured_only: true}\n")
    assert policy_of(dep).measured_only and not policy_of(parse_deployment(BASE)).measured_only
    long = BASE.replace("    mix:", "    max_model_len: 4096\n    mix:", 1)
    assert [m.max_model_len for m in model_specs(parse_deployment(long))] == [4096]
