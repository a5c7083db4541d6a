"""Render the shipped templates in ``sbatch_templates/`` for one replica.

Scripts are Jinja2 templates, never assembled from Python string lists. Every value is quoted for
where it lands — ``q`` a shell word, ``c`` comment text, ``w`` a bare Slurm name — and a value that
went through none of them (other than a number) refuses to render (:mod:`coral_hpc.launch.quoting`);
undefined names are errors too.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from coral_hpc.launch.quoting import (
    comment_text,
    finalize,
    shell_name,
    shell_word,
    slurm_word,
)
from coral_hpc.launch.spec import SIGNAL_LEAD_S, ReplicaSpec
from coral_hpc.resources import templates_dir

#: Engine launch template per layout kind (the environment kind is included inside it); both
#: multi-node kinds run one pipeline template.
LAYOUT_TEMPLATES = {
    "single": "engine/single.sh.j2",
    "multinode": "engine/pipeline.sh.j2",
    "hetero": "engine/pipeline.sh.j2",
}
HETJOB_TEMPLATE = "hetjob.sbatch.j2"


@lru_cache(maxsize=4)
def _environment(folder: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, not an empty string
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # shell, not HTML: quoting is explicit, per context
        finalize=finalize,  # an unquoted string never reaches a script
    )
    env.filters["q"] = shell_word
    env.filters["c"] = comment_text
    env.filters["w"] = slurm_word
    env.filters["ident"] = shell_name
    return env


def _render(name: str, context: dict[str, Any], folder: Path | None = None) -> str:
    env = _environment(str(folder or templates_dir()))
    return env.get_template(name).render(**context)


def _spec_context(spec: ReplicaSpec) -> dict[str, Any]:
    environment = spec.environment
    return {
        "replica_id": spec.replica_id,
        "template_id": spec.template_id or "-",
        "model": spec.model,
        "model_source": spec.model_source,
        "stages": spec.stages,
        "tp": spec.tp,
        "pp": spec.pp,
        "layout_kind": spec.layout.kind,
        "dtype": spec.dtype,
        "kv_transfer_config": spec.kv_transfer_config,
        "kv_connector": (json.loads(spec.kv_transfer_config)["kv_connector"]
                         if spec.kv_transfer_config else None),
        "max_model_len": spec.max_model_len,
        "engine_args": spec.engine_args,
        "runner_args": spec.runner_args,
        "env_kind": spec.env_kind,
        "env": environment,
        # bound into Apptainer images at the same path, so HF_HOME means the same inside
        "hf_home": spec.hf_home,
        "modules": tuple(environment.modules) if environment is not None else (),
        "env_vars": tuple(environment.env) if environment is not None else (),
        "python": spec.python,
        "sim_arch": spec.sim_arch or spec.model,
        "sim_catalog": spec.sim_catalog,
        "gpu_types": list(spec.layout.gpu_types),
        "layer_partition": spec.layer_partition,
        # the sim finishes its drain before the entrypoint's own deadline kills it
        "sim_drain_timeout": f"{max(1.0, spec.drain_timeout_s - 5.0):g}",
        # likewise vLLM (whole seconds): in-flight requests finish, then it exits by itself
        "shutdown_timeout_s": max(1, int(spec.drain_timeout_s) - 5),
    }


def render_engine_script(
    spec: ReplicaSpec,
    *,
    rank: int,
    port: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    folder: Path | None = None,
) -> str:
    """The engine launch script node ``rank`` runs: rank 0 serves the API on ``port``; in a
    pipeline every rank joins ``master_addr:master_port`` (vLLM's own multi-node flags)."""
    if not 0 <= rank < spec.pp:
        raise ValueError(f"rank {rank} outside 0..{spec.pp - 1}")
    if rank == 0 and port is None:
        raise ValueError("the head node (rank 0) needs the API port")
    if spec.pp > 1 and spec.env_kind != "sim" and (master_addr is None or master_port is None):
        raise ValueError("a pipeline needs master_addr and master_port")
    context = _spec_context(spec) | {
        "rank": rank,
        "port": port,
        "master_addr": master_addr,
        "master_port": master_port,
    }
    return _render(LAYOUT_TEMPLATES[spec.layout.kind], context, folder)


def render_hetjob(spec: ReplicaSpec, spec_file: Path, folder: Path | None = None) -> str:
    """The batch script of a heterogeneous replica: one component per stage, running the
    entrypoint on every component with ``srun --het-group``."""
    tag = spec.tag
    context = _spec_context(spec) | {
        "job_name": tag.job_name(),
        "comment": tag.comment(),
        "logs_dir": str(spec.logs_dir),
        "signal_lead_s": SIGNAL_LEAD_S,
        "requests": [spec.stage_request(s) for s in spec.stages],
        "time_limit_min": spec.time_limit_min,
        "account": spec.account,
        "qos": spec.qos,
        "spec_file": str(spec_file),
    }
    return _render(HETJOB_TEMPLATE, context, folder)


def render_template(name: str, context: dict[str, Any], folder: Path | None = None) -> str:
    """Render any shipped template (``stage.sbatch.j2``) with the same quoting rules."""
    return _render(name, context, folder)
