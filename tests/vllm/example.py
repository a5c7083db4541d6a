"""examples/vllm-cpu.yaml as the real-engine tests use it: a copy with its own deployment and
state, the engine settings its partitions give every engine on the local cluster, and
:func:`write_config`, the models.yaml of the tests that serve a few models of their own."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

import yaml

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


#: what every real-engine test's policy shares: short intervals, tiny models (GPU memory bounds
#: nothing), single-node, single-worker replicas (the cheapest engine start-ups)
POLICY = {"poll_interval_s": 1, "pending_timeout_s": 300, "startup_time_s": 90, "rho": 100000,
          "max_tp": 1, "n_max": 1}
#: what each model shares unless the test says otherwise: a short context and a small chat mix
MODEL = {"max_model_len": 512, "mix": {"input_tokens": 64, "output_tokens": 32},
         "slo": {"ttft_s": 2.0, "tpot_s": 0.2}}


def write_config(tmp_path: Path, venv: Path, prefix: str, *, time_limit: str,
                 policy: dict[str, object], models: Sequence[dict[str, object]],
                 partitions: Sequence[str] = ("v100",)) -> Path:
    """``tmp_path/models.yaml``: a deployment of its own (``prefix`` and four hex digits, so its
    jobs are told apart) on the local cluster's ``partitions``, one CPU and 4 GB per GPU, every
    engine in ``venv`` with the example's engine variables (:func:`example_engine_env`), the
    real engine, a gateway without keys (the test host is no shared login node); ``policy``
    over :data:`POLICY`, each of ``models`` over :data:`MODEL`."""
    document = {
        "deployment": f"{prefix}{secrets.token_hex(2)}",
        "state_dir": str(tmp_path / "shared"),
        "db_path": str(tmp_path / "daemon" / "coral.db"),
        "profiles_dir": str(REPO / "examples" / "vllm-cpu.profiles"),
        "cluster": {"time_limit": time_limit, "cpus_per_gpu": 1, "mem_per_gpu_gb": 4,
                    "partitions": [{"name": name, "gpu_types": [name], "environment": {
                        "kind": "venv", "path": str(venv), "env": example_engine_env()}}
                        for name in partitions]},
        "engine": {"kind": "vllm", "version": "0.32.0"},
        # serve --listen 127.0.0.1:0 picks a free port
        "gateway": {"listen": "127.0.0.1:8000", "open_on_loopback": True},
        "policy": {**POLICY, **policy},
        "models": [{"name": model["name"], **MODEL, **model} for model in models],
    }
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
