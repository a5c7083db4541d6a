"""Replica specs shared by the launch tests: every layout × environment kind, with fixed paths so
rendered scripts compare line by line with the stored golden files."""

from __future__ import annotations

from coral_hpc.config import ApptainerEnvironment, ModuleEnvironment, VenvEnvironment
from coral_hpc.launch.spec import ReplicaSpec, StageSpec

STATE = "/shared/coral/demo"
PYTHON = "/opt/coral/venv/bin/python"

ENVIRONMENTS = {
    "venv": VenvEnvironment(path="/shared/envs/vllm-0.33.0", modules=("cuda/12.8",)),
    "module": ModuleEnvironment(modules=("cuda/12.8", "vllm/0.33.0")),
    "apptainer": ApptainerEnvironment(
        image="/shared/images/vllm-0.33.0.sif",
        binds=("/shared/hf-cache:/root/.cache/huggingface",),
        modules=("apptainer",),
    ),
    "sim": None,
}

#: layout -> ((partition, gpu_type, layers), ...) with TP 2 everywhere
LAYOUTS = {
    "single": (("a100", "a100", 36),),
    "multinode": (("a100", "a100", 40), ("a100", "a100", 40)),
    "hetero": (("a100", "a100", 48), ("v100", "v100", 32)),
}


def case_spec(layout: str, env_kind: str, **overrides) -> ReplicaSpec:
    """The spec of one golden case."""
    environment = ENVIRONMENTS[env_kind]
    stages = tuple(
        StageSpec(partition, gpu, 2, layers, environment)
        for partition, gpu, layers in LAYOUTS[layout]
    )
    fields = {
        "deployment": "demo",
        "model": "llama-70b" if layout != "single" else "qwen3-8b",
        "model_source": "meta-llama/Llama-3.1-70B-Instruct" if layout != "single" else "Qwen/Qwen3-8B",
        "replica_id": f"{layout}-1",
        "template_id": f"t-{layout}",
        "stages": stages,
        "tp": 2,
        "engine_kind": "sim" if env_kind == "sim" else "vllm",
        "state_path": STATE,
        "time_limit_s": 7200,
        "dtype": "half" if layout == "hetero" else "auto",
        "max_model_len": 8192,
        "engine_args": ("--enable-prefix-caching",),
        "account": "gpu-lab",
        "qos": "normal",
        "cpus_per_gpu": 4,
        "mem_per_gpu_gb": 32,
        "api_key_file": "/home/user/.coral/replica.key",
        "python": PYTHON,
        "sim_arch": "llama-3.1-70b" if layout != "single" else "qwen3-8b",
    }
    fields.update(overrides)
    return ReplicaSpec(**fields)


def golden_cases() -> list[tuple[str, str, int]]:
    """(layout, environment kind, rank) of every engine launch script rendered."""
    cases = []
    for layout in LAYOUTS:
        for env_kind in ENVIRONMENTS:
            ranks = (0,) if layout == "single" else (0, 1)
            cases += [(layout, env_kind, rank) for rank in ranks]
    return cases
