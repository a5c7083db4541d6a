"""Prefill and decode replicas at launch: the role from the plan row to the engine's
--kv-transfer-config, and the role in the routing table and the plan/status output."""

from __future__ import annotations

import json
import shlex

import pytest

from coral_hpc.config import parse_deployment
from coral_hpc.launch.render import render_engine_script
from coral_hpc.launch.spec import ReplicaSpec, SpecError, kv_transfer_config, replica_spec
from coral_hpc.plan.layout import layout_of
from coral_hpc.types import ReplicaLayout, StageLayout
from coral_solver.types import Stage, Template
from tests.unit.test_launch_spec import YAML
from tests.unit.test_launch_vllm_flags import RECORDED, VERSIONS, _flags_passed

PREFILL = ReplicaLayout(2, (StageLayout("a100", "a100", 80),), "auto", "prefill")


def _deployment(tmp_path, connector: str | None):
    text = YAML.format(state=tmp_path)
    if connector:
        text = text.replace("  args: [--enable-prefix-caching]\n",
                            f"  args: [--enable-prefix-caching]\n  kv_connector: {connector}\n")
    return parse_deployment(text + "policy: {disaggregation: on}\n" if connector else text)


def test_aggregated_replicas_get_no_kv_connector(tmp_path):
    dep = _deployment(tmp_path, "{name: NixlConnector}")
    assert kv_transfer_config(dep, "both") is None


def test_example_connector_keeps_kv_under_the_shared_state_dir(tmp_path):
    dep = _deployment(tmp_path, "{name: ExampleConnector}")
    config = json.loads(kv_transfer_config(dep, "decode"))
    assert config == {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {
                          "shared_storage_path": str(tmp_path.resolve() / "demo" / "kv")}}
    elsewhere = _deployment(tmp_path, "{name: ExampleConnector, shared_path: /scratch/kv}")
    assert json.loads(kv_transfer_config(elsewhere, "prefill"))[
        "kv_connector_extra_config"] == {"shared_storage_path": "/scratch/kv"}


def test_network_connectors_pass_their_extra_config_as_is(tmp_path):
    dep = _deployment(tmp_path, "{name: LMCacheConnectorV1, extra_config: {discard_partial_chunks: false}}")
    assert json.loads(kv_transfer_config(dep, "prefill")) == {
        "kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both",
        "kv_connector_extra_config": {"discard_partial_chunks": False}}


def test_a_vllm_role_replica_without_a_connector_is_refused(tmp_path):
    dep = _deployment(tmp_path, None)
    with pytest.raises(SpecError, match="prefill replica needs engine.kv_connector"):
        replica_spec(dep, "llama-70b", "r1", "t", PREFILL, api_key_file=None)


def test_the_plan_rows_role_reaches_the_engine_command_line(tmp_path):
    dep = _deployment(tmp_path, "{name: NixlConnector}")
    template = Template("llama-70b", 2, (Stage("a100", 80),), 3.0, role="prefill",
                        kv_bytes_per_request=3.3e8)
    layout = layout_of(template, ("a100",), "llama-3.1-70b")
    assert layout.role == "prefill"
    spec = replica_spec(dep, "llama-70b", "r1", template.id, layout, api_key_file=None)
    assert spec.role == "prefill" and spec.layout == layout
    again = ReplicaSpec.from_json(spec.to_json())
    assert again.kv_transfer_config == spec.kv_transfer_config and again.layout.role == "prefill"
    script = render_engine_script(spec, rank=0, port=24001)
    flags = script[script.index("FLAGS=(\n"):]
    words = shlex.split(flags[len("FLAGS=(\n"):flags.index("\n)")])
    given = words[words.index("--kv-transfer-config") + 1]
    assert json.loads(given) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    for version in VERSIONS:  # the flag exists in every vLLM the project supports
        assert "--kv-transfer-config" in RECORDED["versions"][version]["flags"]
    assert "--kv-transfer-config" in _flags_passed(script)
    assert 'export VLLM_NIXL_SIDE_CHANNEL_HOST="$(hostname -f)"' in script
    assert "export VLLM_NIXL_SIDE_CHANNEL_PORT=24002" in script  # API port + 1
    aggregated = replica_spec(dep, "llama-70b", "r2", "t",
                              ReplicaLayout(2, PREFILL.stages, "auto"), api_key_file=None)
    assert "--kv-transfer-config" not in render_engine_script(aggregated, rank=0, port=24001)


def test_the_routing_table_carries_each_replicas_role():
    from coral_hpc.daemon.routing import ready_routes
    from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, ReplicaStatus
    from coral_hpc.store import ReplicaRecord

    def record(rid: str, layout) -> ReplicaRecord:
        return ReplicaRecord(rid, "m", "t", layout, ("a100",), 2.0, 1.0, 0.0,
                             endpoint=f"http://h:{rid[-1]}/")

    items = [ReplicaFacts(record("r1", PREFILL)), ReplicaFacts(record("r2", None))]
    statuses = {r: ReplicaStatus(r, ReplicaState.READY) for r in ("r1", "r2")}
    routes = ready_routes(["m"], items, statuses)["m"]
    assert [(r.id, r.role, r.url) for r in routes] == [("r1", "prefill", "http://h:1"),
                                                       ("r2", "both", "http://h:2")]


def test_only_nixl_gets_a_side_channel(tmp_path):
    dep = _deployment(tmp_path, "{name: ExampleConnector}")
    spec = replica_spec(dep, "llama-70b", "r1", "t", PREFILL, api_key_file=None)
    script = render_engine_script(spec, rank=0, port=24001)
    assert "--kv-transfer-config" in script and "NIXL" not in script
