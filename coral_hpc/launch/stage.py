"""Staging model weights: one Slurm job that downloads every model of a deployment into the
site's shared Hugging Face cache (``HF_HOME``) once, so replicas start from the shared filesystem
instead of each downloading the same weights.

The job runs in a partition's engine environment (venv, module or Apptainer image — vLLM brings
``huggingface_hub``) and calls ``huggingface_hub.snapshot_download``; a model already complete in
the cache is reported ``cached`` without a download, a local folder is checked for readability
from the compute node. The job writes what it did as JSON beside its log; nothing secret is in
the script, its argv or its environment: the program reads the token file itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coral_hpc.atomic import private_dir, write_atomic
from coral_hpc.config import Deployment, hf_home_of
from coral_hpc.config.weights import WeightsError, read_config_json, staged_copy
from coral_hpc.errors import PermanentError
from coral_hpc.launch.render import render_template

STAGE_TEMPLATE = "stage.sbatch.j2"
#: what a download job asks for: no GPU, a core, memory for hashing large files
STAGE_CPUS = 1
STAGE_MEM_GB = 4
#: statuses of one model in the job's result
OK_STATUSES = ("downloaded", "cached", "local")


class StageError(PermanentError):
    """The staging job cannot be built for this deployment (unknown partition)."""


@dataclass(frozen=True)
class StageJob:
    """A submitted staging job: where its result and log will be."""

    job_id: str
    result_file: Path
    log_file: Path
    sources: tuple[str, ...]


def stage_sources(deployment: Deployment) -> tuple[str, ...]:
    """Every distinct model source of the deployment, in configuration order."""
    return tuple(dict.fromkeys(m.source for m in deployment.models))


def render_stage_script(deployment: Deployment, partition: str, result_file: Path,
                        log_file: Path, python: str, time_limit_min: int = 240) -> str:
    """The staging job's batch script for ``partition``'s engine environment."""
    partitions = {p.name: p for p in deployment.cluster.partitions}
    if partition not in partitions:
        raise StageError(f"partition {partition!r} is not in cluster.partitions "
                         f"(valid: {sorted(partitions)})")
    env = partitions[partition].environment if deployment.engine.kind == "vllm" else None
    context: dict[str, Any] = {
        "deployment": deployment.deployment,
        "partition": partition,
        "env": env,
        "env_kind": env.kind if env is not None else "none",
        # the environment's own variables (a site's proxy, for instance) apply to the download too
        "env_vars": tuple(env.env) if env is not None else (),
        "job_name": f"coral-stage.{deployment.deployment}",
        "comment": f"coral-hpc stage of {deployment.deployment}",
        "log_file": str(log_file),
        "result_file": str(result_file),
        "cpus": STAGE_CPUS,
        "mem_gb": STAGE_MEM_GB,
        "time_min": time_limit_min,
        "account": deployment.cluster.account,
        "qos": deployment.cluster.qos,
        "hf_home": hf_home_of(deployment),
        "token_file": str(Path(deployment.engine.hf_token_file).expanduser())
        if deployment.engine.hf_token_file else None,
        "sources": stage_sources(deployment),
        "python": python,
    }
    return render_template(STAGE_TEMPLATE, context)


def submit_stage(deployment: Deployment, client: Any, partition: str, python: str,
                 now: float | None = None) -> StageJob:
    """Render the staging script under ``<state>/stage/`` and sbatch it; the job id and where
    its result will appear. Raises StageError or the Slurm client's errors."""
    folder = deployment.state_path / "stage"
    private_dir(folder)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now))
    result_file = folder / f"stage-{stamp}.json"
    log_file = folder / f"stage-{stamp}.log"
    script = folder / f"stage-{stamp}.sbatch"
    write_atomic(script, render_stage_script(deployment, partition, result_file, log_file,
                                             python))
    job_id = client.submit_script(script)
    return StageJob(str(job_id), result_file, log_file, stage_sources(deployment))


def keep_config_copies(deployment: Deployment, result: dict[str, Any]) -> dict[str, str]:
    """Copy the config.json of every model the job staged into the deployment's state folder
    (:func:`coral_hpc.config.weights.staged_copy`), so ``validate`` and ``plan`` can derive its
    architecture on a host that cannot read the weights. Source -> the copy's path, or why no
    copy was kept (the snapshot or folder unreadable from this host)."""
    kept: dict[str, str] = {}
    for source, entry in (result.get("results") or {}).items():
        if entry.get("status") not in OK_STATUSES or not entry.get("path"):
            continue
        original = Path(str(entry["path"])).expanduser() / "config.json"
        target = staged_copy(deployment.state_path, source)
        try:
            config = read_config_json(original)
        except WeightsError as exc:
            kept[source] = f"no copy kept: {exc}"
            continue
        write_atomic(target, json.dumps(config, indent=1))
        kept[source] = str(target)
    return kept


def read_stage_result(path: Path) -> dict[str, Any] | None:
    """The job's result (``{"hf_home": ..., "results": {source: {...}}}``), None until written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
