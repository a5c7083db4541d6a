"""Extra engine environment variables (``environment.env`` in models.yaml): validated on load,
exported by the launch script before the engine starts, shell-quoted, never secrets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coral_hpc.config import VenvEnvironment
from coral_hpc.launch.render import render_engine_script
from tests.unit.launch_cases import case_spec


def test_env_mapping_becomes_sorted_pairs_and_is_exported_quoted():
    env = VenvEnvironment(path="/e", env={"VLLM_CPU_KVCACHE_SPACE": 1, "B_VAR": "a b;c"})
    assert env.env == (("B_VAR", "a b;c"), ("VLLM_CPU_KVCACHE_SPACE", "1"))
    hash(env)  # frozen config stays hashable
    spec = case_spec("single", "venv")
    stages = tuple(s.__class__(s.partition, s.gpu_type, s.gpus_per_node, s.layers, env)
                   for s in spec.stages)
    text = render_engine_script(spec.__class__(**{**spec.__dict__, "stages": stages}),
                                rank=0, port=24001)
    lines = text.splitlines()
    assert "export B_VAR='a b;c'" in lines
    assert "export VLLM_CPU_KVCACHE_SPACE=1" in lines
    # exported before the engine runs
    assert lines.index("export VLLM_CPU_KVCACHE_SPACE=1") < lines.index('exec "${ENGINE[@]}" "${FLAGS[@]}"')


@pytest.mark.parametrize("name", ["VLLM_API_KEY", "HF_TOKEN", "1BAD", "A-B", "A B"])
def test_env_rejects_secrets_and_bad_names(name):
    with pytest.raises(ValidationError, match="env"):
        VenvEnvironment(path="/e", env={name: "x"})


def test_engine_gets_drain_mode_shutdown_timeout_below_the_entrypoint_deadline():
    spec = case_spec("single", "venv", drain_timeout_s=30.0)
    text = render_engine_script(spec, rank=0, port=24001)
    assert "  --shutdown-timeout 25" in text.splitlines()
    sim = render_engine_script(case_spec("single", "sim"), rank=0, port=24001)
    assert "--shutdown-timeout" not in sim
