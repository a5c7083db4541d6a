"""examples/vllm-cpu.yaml as the real-engine tests use it: a copy with its own deployment and
state, and the engine settings its partitions give every engine on the local cluster."""

from __future__ import annotations

from pathlib import Path

from coral_hpc.config import load_deployment
from tests.conftest import REPO
from tests.support.serve_harness import example_copy as harness_example_copy

EXAMPLE = REPO / "examples" / "vllm-cpu.yaml"


def example_copy(tmp_path: Path, venv: Path, models: Path) -> Path:
    """examples/vllm-cpu.yaml with its own deployment name and state, this run's venv and models
    folders, and short intervals."""
    path = harness_example_copy(tmp_path, EXAMPLE, "vllm", {
        r"(?m)^profiles_dir: .*$": f"profiles_dir: {REPO / 'examples' / 'vllm-cpu.profiles'}"})
    text = path.read_text()
    text = text.replace("/var/cache/coral-hpc/vllm-cpu", str(venv))
    text = text.replace("/var/cache/coral-hpc/test-models", str(models))
    path.write_text(text)
    return path


def example_engine_env() -> dict[str, str]:
    """The engine variables examples/vllm-cpu.yaml gives its partitions: 1 GiB of KV space, and
    each engine unbound with one compute thread. vLLM's automatic binding pins every engine's
    worker to core 0 of this host (Slurm binds no CPUs here), where a two-node pipeline decodes
    at about a token a second."""
    partitions = load_deployment(EXAMPLE).cluster.partitions
    envs = {tuple(sorted(dict(p.environment.env).items())) for p in partitions}
    assert len(envs) == 1, "the example's partitions no longer share one engine environment"
    return dict(envs.pop())
