"""Which figures a plan rests on: measured profiles (``coral-hpc profile``) or the analytic
model. The planner reads the shipped measured profiles and the deployment's own
(``profiles_dir``, default ``<state_dir>/<deployment>/profiles``), never writing either."""

from __future__ import annotations

from pathlib import Path

from coral_hpc.config import Deployment
from coral_solver import catalog, perf
from coral_solver.resources import profiles_dir
from coral_solver.types import Template


def measured_profile_dirs(deployment: Deployment) -> tuple[Path, ...]:
    """The shipped measured profiles, then the site's (the site's measured later win no tie:
    the solver uses every applicable point)."""
    return ((profiles_dir() / "measured").resolve(), deployment.measured_profiles_path.resolve())


def profiles_signature(dirs: tuple[Path, ...]) -> tuple:
    """Every measured-profile file under ``dirs`` (and their ``pipelines/``, ``roles/``) with
    its modification time: changes when a profile is added, removed or rewritten."""
    return tuple((str(p), p.stat().st_mtime_ns) for d in dirs if d.is_dir()
                 for p in sorted(d.glob("*.yaml")) + sorted(d.glob("pipelines/*.yaml"))
                 + sorted(d.glob("roles/*.yaml")))


_configured: tuple | None = None

#: vLLM's CPU build keeps ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache per worker (vllm
#: ``envs.VLLM_CPU_KVCACHE_SPACE`` x ``GiB_bytes`` = 2**30 in its CPU worker), not what memory
#: leaves: measured, 1 GiB held 1,048,576 tokens of 1,024 B (examples/vllm-cpu.profiles)
CPU_KV_SPACE_VARIABLE = "VLLM_CPU_KVCACHE_SPACE"
GIB = 2**30


def kv_space(deployment: Deployment) -> dict[str, int]:
    """GPU type -> KV bytes per engine worker the partitions' engine environments set
    (``VLLM_CPU_KVCACHE_SPACE``); the smallest where two partitions of one type differ. Types
    of a partition that lists none, and values that are no positive number, set nothing (vLLM
    then sizes the cache itself)."""
    out: dict[str, int] = {}
    for part in deployment.cluster.partitions:
        env = dict(part.environment.env) if part.environment is not None else {}
        try:
            gib = float(env.get(CPU_KV_SPACE_VARIABLE, ""))
        except ValueError:
            continue
        if not gib > 0:
            continue
        for gpu in part.gpu_types:
            name = catalog.canonical_gpu_name(gpu)
            if name is not None:
                out[name] = min(out.get(name, int(gib * GIB)), int(gib * GIB))
    return out


def use_measured_profiles(deployment: Deployment) -> None:
    """Point :mod:`coral_solver.perf` at ``deployment``'s measured profiles and its engines'
    configured KV space (:func:`kv_space`); re-read them when a file was added or changed since
    the last call (a profile written while ``serve`` runs counts at the next plan)."""
    global _configured
    dirs = measured_profile_dirs(deployment)
    space = kv_space(deployment)
    # Keyed by the profile files found, not the folders: deployments whose folders hold the
    # same files (e.g. none) get the same figures, so the solver's memo of them is kept
    # (configure clears it) rather than recomputed for a folder of another name.
    key = (profiles_signature(dirs), tuple(sorted(space.items())))
    if key != _configured:
        perf.configure(measured=dirs, kv_space=space)
        _configured = key


def figures_used(template: Template, arch: str) -> str:
    """Where a template's throughput comes from.

    One stage: ``measured (FILE, ...)`` when its (arch, GPU type, TP) has a measured profile,
    else ``analytic``. A pipeline: ``measured pipeline (FILE)`` when that exact layout was
    measured (``coral-hpc profile --pp N`` or ``--stages``); otherwise the per-stage model,
    ``analytic pipeline, steps scaled to measured (FILE, ...)`` when its stages' single-process
    step times were measured (that is all they were), ``partly`` so when only some GPU types'
    were, else ``analytic``. A prefill or decode template of one stage: ``measured prefill
    (FILE)`` when a role profile (``coral-hpc profile --roles``) gave its figure."""
    model = catalog.model_arch(arch)
    if template.role in ("prefill", "decode"):
        return _role_figures(template, model)
    if template.pp > 1:
        gpu = catalog.gpu_spec(template.stages[0].gpu_type)
        split = tuple(s.layers for s in template.stages)
        stage_gpus = tuple(catalog.gpu_spec(s.gpu_type).name for s in template.stages)
        for profile in perf.measured_pipelines().get((model.name, gpu.name, template.tp), ()):
            # Stage 1 copies a measured point's req/s into the template when the point applies
            # (same mix, SLO as strict or stricter): the same figure means it came from there
            if (profile.layer_partition == split
                    and perf.pipeline_stage_gpus(profile) == stage_gpus
                    and any(p.requests_per_s == template.throughput for p in profile.throughput)):
                return f"measured pipeline ({Path(profile.path).name})"
    profiles = perf.measured_profiles()
    files, analytic = [], 0
    for gpu_type in dict.fromkeys(s.gpu_type for s in template.stages):
        found = profiles.get((model.name, catalog.gpu_spec(gpu_type).name, template.tp), ())
        if found:
            files += [Path(p.path).name for p in found]
        else:
            analytic += 1
    if not files:
        return "analytic"
    if template.pp > 1:
        kind = "analytic pipeline, steps scaled to measured" if analytic == 0 else (
            "analytic pipeline, steps partly scaled to measured")
        return f"{kind} ({', '.join(files)})"
    kind = "measured" if analytic == 0 else "partly measured"
    return f"{kind} ({', '.join(files)})"


def _role_figures(template: Template, model: catalog.ModelArch) -> str:
    """Where a prefill or decode template's throughput comes from: its role profile when one
    gave this very figure, else the analytic role model."""
    if template.pp == 1:
        gpu = catalog.gpu_spec(template.stages[0].gpu_type)
        for profile in perf.measured_roles().get((model.name, gpu.name, template.tp), ()):
            if profile.role == template.role and any(
                    p.requests_per_s == template.throughput for p in profile.throughput):
                return f"measured {template.role} ({Path(profile.path).name})"
    return "analytic"
