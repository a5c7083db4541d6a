"""Contract: every vLLM flag coral-hpc passes exists in the vLLM versions INSTALL.md names.

The flag lists in tests/data/vllm_engine_args.json were read from the released wheels without
importing vLLM or torch (scripts/record-vllm-args: `pip download --no-deps`, then `ast`). Both
versions are checked: the newest release, and the older one built for CUDA 12 that V100
partitions run — a pipeline may span both kinds of node, so every layout must work in both.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from coral_hpc.launch.render import render_engine_script
from tests.unit.launch_cases import case_spec, golden_cases

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_engine_args.json"
RECORDED = json.loads(DATA.read_text())
VERSIONS = sorted(RECORDED["versions"])


def _flags_passed(text: str) -> list[str]:
    """Every --flag the script gives vLLM: the words after `vllm serve` in the ENGINE array,
    and the FLAGS array."""
    words: list[str] = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("ENGINE=("):
            engine = shlex.split(line[len("ENGINE=(") : -1])
            words += engine[engine.index("serve") + 1 :]  # before it: apptainer's own flags
        if line == "FLAGS=(":
            end = lines.index(")", index)
            for flag_line in lines[index + 1 : end]:
                words += shlex.split(flag_line)
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def test_recorded_data_names_its_versions_and_method():
    assert RECORDED["produced_by"].startswith("scripts/record-vllm-args")
    assert len(VERSIONS) == 2, "the newest vLLM and the CUDA-12 one for V100 partitions"
    for version in VERSIONS:
        flags = RECORDED["versions"][version]["flags"]
        assert len(flags) > 100, f"{version}: implausibly few flags recorded"
        # flags vLLM has had for years: a broken extraction would miss them
        assert {"--tensor-parallel-size", "--port", "--api-key", "--model"} <= set(flags)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "layout,env_kind,rank", [c for c in golden_cases() if c[1] != "sim"]
)
def test_every_flag_passed_to_vllm_exists(version, layout, env_kind, rank):
    # extra user args (models.yaml vllm_args) are the user's own contract, not coral-hpc's
    spec = case_spec(layout, env_kind, engine_args=())
    text = render_engine_script(
        spec,
        rank=rank,
        port=24001 if rank == 0 else None,
        master_addr="head" if spec.pp > 1 else None,
        master_port=24002 if spec.pp > 1 else None,
    )
    passed = _flags_passed(text)
    assert "--tensor-parallel-size" in passed  # the parser above found the flags
    known = set(RECORDED["versions"][version]["flags"])
    missing = sorted(set(passed) - known)
    assert not missing, f"vLLM {version} has no flag(s) {missing} ({layout}/{env_kind} rank {rank})"


def test_a_flag_vllm_lacks_is_caught():
    """The check can fail: a flag that no vLLM version has is reported."""
    known = set(RECORDED["versions"][VERSIONS[0]]["flags"])
    passed = _flags_passed("FLAGS=(\n  --tensor-parallel-size 2\n  --no-such-vllm-flag 1\n)\n")
    assert sorted(set(passed) - known) == ["--no-such-vllm-flag"]
