"""examples/vllm-cpu.yaml as the real-engine tests use it: a copy with its own deployment and
state, and the engine settings its partitions give every engine on the local cluster."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path

from bench.slo_vllm import host_cpu, profile_here
from coral_hpc.config import load_deployment
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "vllm-cpu.yaml"
#: profiles this host measured for the SLO test, kept like the engine venv beside them
PROFILE_CACHE = Path(os.environ.get("CORAL_PROFILE_CACHE", "/var/cache/coral-hpc/host-profiles"))
#: what the measurement depends on besides the host: the example, how profile measures, how the
#: engine and the test models are built
PROFILE_INPUTS = (EXAMPLE, *sorted((REPO / "coral_hpc" / "profile").glob("*.py")),
                  REPO / "scripts" / "vllm-cpu-env", REPO / "scripts" / "make-test-models",
                  *sorted((REPO / "sbatch_templates" / "engine").glob("*")))


def example_copy(tmp_path: Path, venv: Path, models: Path) -> Path:
    """examples/vllm-cpu.yaml with its own deployment name and state, this run's venv and models
    folders, and short intervals."""
    text = EXAMPLE.read_text()
    name = f"vllm{secrets.token_hex(3)}"
    replacements = {
        r"(?m)^deployment: .*$": f"deployment: {name}",
        r"(?m)^state_dir: .*$": f"state_dir: {tmp_path / 'shared'}",
        r"(?m)^db_path: .*$": f"db_path: {tmp_path / 'daemon' / 'coral.db'}",
        r"(?m)^  poll_interval_s: .*$": "  poll_interval_s: 1",
        r"(?m)^profiles_dir: .*$": f"profiles_dir: {REPO / 'examples' / 'vllm-cpu.profiles'}",
    }
    for pattern, value in replacements.items():
        text, count = re.subn(pattern, value, text)
        assert count == 1, f"examples/vllm-cpu.yaml no longer has {pattern!r}"
    text = text.replace("/var/cache/coral-hpc/vllm-cpu", str(venv))
    text = text.replace("/var/cache/coral-hpc/test-models", str(models))
    path = tmp_path / "models.yaml"
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


def _host_key() -> str:
    """This host's CPU (model and every ISA flag) and the measurement's inputs, hashed."""
    digest = hashlib.sha256(host_cpu().encode())
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), "")
    digest.update(flags.encode())
    for path in PROFILE_INPUTS:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def profiles_of_this_host(config: Path, env: dict) -> list[Path]:
    """The example's three layouts profiled on this host into ``config``'s (empty)
    ``profiles_dir``: measured by ``coral-hpc profile`` (bench/slo_vllm.profile_here) the first
    time, then copied from PROFILE_CACHE while the CPU and the inputs that decide the figures
    are the same (a profile holds for the hardware it was measured on, and not across a change
    to how it is measured)."""
    target = load_deployment(config).measured_profiles_path
    cached = PROFILE_CACHE / _host_key()
    if not (cached / "complete").exists():
        written = profile_here(config, env)
        staging = cached.with_name(cached.name + f".{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        for path in written:
            (staging / path.relative_to(target)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, staging / path.relative_to(target))
        (staging / "complete").write_text("\n".join(
            str(p.relative_to(target)) for p in written) + "\n")
        shutil.rmtree(cached, ignore_errors=True)
        staging.rename(cached)
        return written
    names = (cached / "complete").read_text().split()
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cached / name, target / name)
    return [target / name for name in names]
