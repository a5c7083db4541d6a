"""Run profile tasks: one Slurm job per (model, partition, pp), measured, written, cancelled."""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from coral_hpc.config import Deployment
from coral_hpc.errors import CoralError, PermanentError
from coral_hpc.launch.endpoint import Endpoint, read_endpoint
from coral_hpc.launch.spec import replica_spec
from coral_hpc.launch.stop import stop_replicas
from coral_hpc.launch.submit import submit_replica
from coral_hpc.plan.layout import layout_dtype
from coral_hpc.profile.measure import EngineFailed, EngineMeasurements, measure_engine
from coral_hpc.profile.openloop import PHASE_S
from coral_hpc.profile.roles import ROLES, RoleMeasurements, measure_roles
from coral_hpc.profile.write import (
    profile_document,
    profile_path,
    role_profile_document,
    role_profile_path,
    write_profile,
)
from coral_hpc.types import ReplicaLayout, StageLayout

Progress = Callable[[str], None]


class ProfileError(PermanentError):
    """A profile task that cannot run (unknown model or partition, no GPU type) or failed."""


class ProfileClient(Protocol):
    """The part of ``coral_hpc.slurm.SlurmClient`` profiling uses."""

    def submit_script(self, path: Path) -> str: ...
    def job_states(self, job_ids: Sequence[str]) -> dict: ...
    def cancel_with_grace(self, job_ids: Iterable[str], grace_s: float, signal: str = "TERM",
                          poll_s: float = 1.0, *, full: bool = True) -> dict[str, str]: ...


@dataclass(frozen=True)
class ProfileTask:
    """Measure ``model`` on ``partition`` (``gpu_type``) with TP ``tp`` over ``pp`` nodes."""

    model: str
    architecture: str
    partition: str
    gpu_type: str
    tp: int = 1
    pp: int = 1
    #: a pipeline over several partitions (one Slurm hetjob): (partition, GPU type) per stage,
    #: in pipeline order; empty: every stage on ``partition``
    stages: tuple[tuple[str, str], ...] = ()

    @property
    def stage_places(self) -> tuple[tuple[str, str], ...]:
        """(partition, GPU type) of every stage."""
        return self.stages or ((self.partition, self.gpu_type),) * self.pp

    @property
    def gpu_label(self) -> str:
        """The GPU type, or the stages' types joined by ``+`` for a mixed pipeline."""
        gpus = [g for _, g in self.stage_places]
        return gpus[0] if len(set(gpus)) == 1 else "+".join(gpus)

    @property
    def name(self) -> str:
        if self.stages:
            where = "+".join(p for p, _ in self.stages)
            return f"{self.model} on {where} ({self.gpu_label}) tp{self.tp} pp{self.pp}"
        suffix = f" pp{self.pp}" if self.pp > 1 else ""
        return f"{self.model} on {self.partition} ({self.gpu_type}) tp{self.tp}{suffix}"


def pipeline_task(deployment: Deployment, model: str, partitions: Sequence[str]) -> ProfileTask:
    """One pipeline over ``partitions`` (one stage per entry, in order; a partition named twice
    gets two nodes), each stage on its partition's first GPU type: a Slurm hetjob when the
    partitions differ (``coral-hpc profile --stages``)."""
    known_parts = {p.name: p for p in deployment.cluster.partitions}
    known_models = {m.name: m for m in deployment.models}
    if model not in known_models:
        raise ProfileError(f"--model {model!r}: not in models of models.yaml "
                           f"(valid: {sorted(known_models)})")
    if len(partitions) < 2:
        raise ProfileError(f"--stages {','.join(partitions)!r}: name at least two partitions, "
                           "one per stage")
    places = []
    for name in partitions:
        part = known_parts.get(name)
        if part is None:
            raise ProfileError(f"--stages: partition {name!r} not in cluster.partitions of "
                               f"models.yaml (valid: {sorted(known_parts)})")
        if not part.gpu_types:
            raise ProfileError(f"partition {name!r}: name its gpu_types in models.yaml to "
                               "profile it")
        places.append((name, part.gpu_types[0]))
    spec = known_models[model]
    return ProfileTask(model, spec.arch_key, places[0][0], places[0][1], 1, len(places),
                       tuple(places))


def profile_tasks(deployment: Deployment, partitions: Sequence[str] = (),
                  models: Sequence[str] = (), pp_degrees: Sequence[int] = (1,)) -> list[ProfileTask]:
    """The tasks for the asked partitions and models (empty: all of the deployment); each
    partition's GPU types come from its ``gpu_types`` in models.yaml."""
    known_parts = {p.name: p for p in deployment.cluster.partitions}
    known_models = {m.name: m for m in deployment.models}
    for name in partitions:
        if name not in known_parts:
            raise ProfileError(f"--partition {name!r}: not in cluster.partitions of models.yaml "
                               f"(valid: {sorted(known_parts)})")
    for name in models:
        if name not in known_models:
            raise ProfileError(f"--model {name!r}: not in models of models.yaml "
                               f"(valid: {sorted(known_models)})")
        if known_models[name].embedding:
            raise ProfileError(f"--model {name!r} is an embedding model: `coral-hpc profile` "
                               "measures generation (TTFT, TPOT); its capacity is modelled")
    tasks = []
    # embedding models are not profiled (the profile measures generation): skipped when all
    for model in (known_models[m] for m in (models or [m.name for m in deployment.models
                                                        if not m.embedding])):
        for part in (known_parts[p] for p in (partitions or list(known_parts))):
            if model.partitions and part.name not in model.partitions:
                continue
            if not part.gpu_types:
                raise ProfileError(f"partition {part.name!r}: name its gpu_types in models.yaml "
                                   "to profile it")
            for gpu in part.gpu_types:
                if model.gpu_types and gpu not in model.gpu_types:
                    continue
                tasks += [ProfileTask(model.name, model.arch_key, part.name, gpu, 1, pp)
                          for pp in pp_degrees]
    return tasks


def _engine_version(url: str, api_key: str) -> str:
    request = urllib.request.Request(f"{url}/version",
                                     headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(json.loads(response.read()).get("version", "?"))
    except (OSError, ValueError):
        return "?"


def _key_file(folder: Path) -> Path:
    """The API key the profiled engines get (mode 600): they listen on the cluster network."""
    path = folder / ".profile-api-key"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path


def _wait_ready(client: ProfileClient, job_id: str, endpoint_file: Path, timeout_s: float,
                progress: Progress) -> Endpoint:
    deadline = time.monotonic() + timeout_s
    last_state = None
    while time.monotonic() < deadline:
        endpoint = read_endpoint(endpoint_file)
        if endpoint is not None and endpoint.job_id == job_id:
            return endpoint
        states = client.job_states([job_id])
        state = getattr(states.get(job_id), "state", None) if states else None
        if state != last_state:
            progress(f"  job {job_id}: {state}")
            last_state = state
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "COMPLETED"):
            raise EngineFailed(f"job {job_id} ended {state} before the engine answered /health "
                               f"(logs under {endpoint_file.parent.parent / 'logs'})")
        time.sleep(2.0)
    raise EngineFailed(f"job {job_id}: no healthy engine after {timeout_s:.0f}s (logs under "
                       f"{endpoint_file.parent.parent / 'logs'})")


def _paths(folder: Path, task: ProfileTask, roles: bool) -> list[Path]:
    """The profile files a task writes: its own, or its prefill and decode role profiles."""
    if roles:
        return [role_profile_path(folder, task.architecture, task.gpu_type, task.tp, role)
                for role in ROLES]
    return [profile_path(folder, task.architecture, task.gpu_label, task.tp, task.pp)]


def _measure_roles(deployment: Deployment, task: ProfileTask, url: str, api_key: str,
                   layers: int, progress: Progress, phase_s: float) -> dict[str, RoleMeasurements]:
    """Both roles of ``task``'s model on the engine at ``url``, judged as the planner rates
    them (:mod:`coral_hpc.profile.roles`)."""
    from coral_solver import perf
    from coral_solver.catalog import model_arch

    model = deployment.model(task.model)
    arch = model_arch(task.architecture)
    slo = perf.Slo(ttft_s=model.slo.first_answer_s, tpot_s=model.slo.per_token_s)
    mix = perf.Mix(input_tokens=model.mix.input_tokens, output_tokens=model.mix.output_tokens)
    return measure_roles(
        url, task.model, input_tokens=mix.input_tokens, output_tokens=mix.output_tokens,
        ttft_s=slo.ttft_s, tpot_s=slo.tpot_s,
        ttft_budget_s=perf.prefill_ttft_budget_s(arch, layers, slo, mix),
        kv_transfer_s=perf.kv_transfer_s(arch, layers, mix.input_tokens), api_key=api_key,
        progress=lambda m: progress(f"  {m}"), phase_s=phase_s)


def _task_layout(task: ProfileTask) -> tuple[int, list[int], ReplicaLayout]:
    """(the model's layers, vLLM's default split over the task's stages, the replica layout)."""
    from coral_solver.catalog import model_arch

    layers = model_arch(task.architecture).layers
    split = [layers // task.pp + (1 if i < layers % task.pp else 0) for i in range(task.pp)]
    places = task.stage_places
    layout = ReplicaLayout(
        task.tp, tuple(StageLayout(part, gpu, n) for (part, gpu), n in zip(places, split)),
        layout_dtype(task.architecture, sorted({g for _, g in places})),
    )
    return layers, split, layout


def _write_roles(paths: Sequence[Path], task: ProfileTask, layers: int, source: str,
                 endpoint: Endpoint, ready_after: float, by_role: dict[str, RoleMeasurements],
                 progress: Progress) -> list[Path]:
    """Write the task's prefill and decode role profiles (``paths`` in :data:`ROLES` order)."""
    out = []
    for path, role in zip(paths, ROLES):
        out.append(write_profile(path, role_profile_document(
            arch=task.architecture, gpu=task.gpu_type, tp=task.tp, layers=layers,
            source=source, model=task.model, partition=task.partition,
            startup_s=endpoint.ready_at - endpoint.started_at,
            submit_to_ready_s=ready_after, measured=by_role[role])))
        progress(f"  wrote {path}")
    return out


def run_profiles(deployment: Deployment, tasks: Sequence[ProfileTask], client: ProfileClient, *,
                 force: bool = False, ready_timeout_s: float = 900.0,
                 progress: Progress = print, roles: bool = False,
                 phase_s: float = PHASE_S) -> list[Path]:
    """Measure each task in turn (one engine job at a time) and write its profile; a task whose
    profile exists is reused unless ``force``. Every job is drained and cancelled before the
    next starts, also when interrupted. Returns the profile files, measured or reused.
    ``roles``: measure each (one-stage) task as a prefill and as a decode replica instead and
    write its two role profiles (:mod:`coral_hpc.profile.roles`). ``phase_s``: how long each
    open-loop phase of the capacity search lasts (:mod:`coral_hpc.profile.openloop`)."""
    folder = deployment.measured_profiles_path
    key_file = _key_file(deployment.state_path)  # not beside the profiles: they may be shared
    api_key = key_file.read_text().strip()
    written = []
    for index, task in enumerate(tasks, 1):
        if roles and task.pp > 1:
            raise ProfileError(f"{task.name}: role profiles are of one stage (pp 1)")
        paths = _paths(folder, task, roles)
        if all(p.exists() for p in paths) and not force:
            progress(f"[{index}/{len(tasks)}] {task.name}: reused {', '.join(map(str, paths))}")
            written += paths
            continue
        progress(f"[{index}/{len(tasks)}] {task.name}: starting the engine in a Slurm job")
        layers, split, layout = _task_layout(task)
        spec = replica_spec(deployment, task.model, f"profile-{secrets.token_hex(3)}", "profile",
                            layout, api_key_file=key_file)
        submitted = time.time()
        job_id = submit_replica(spec, client)
        try:
            endpoint = _wait_ready(client, job_id, spec.endpoint_file, ready_timeout_s, progress)
            ready_after = time.time() - submitted
            progress(f"  READY after {ready_after:.0f}s on {endpoint.node} ({endpoint.url})")
            model = deployment.model(task.model)
            if roles:
                by_role = _measure_roles(deployment, task, endpoint.url, api_key, split[0],
                                         progress, phase_s)
            else:
                measured = measure_engine(
                    endpoint.url, task.model, api_key=api_key,
                    slos=[(model.mix.input_tokens, model.mix.output_tokens,
                           model.slo.first_answer_s, model.slo.per_token_s)],
                    progress=lambda m: progress(f"  {m}"), phase_s=phase_s,
                )
            version = _engine_version(endpoint.url, api_key)
        finally:
            stop_replicas(client, [job_id], grace_s=60)
        day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        source = (f"coral-hpc profile on {endpoint.node} ({task.partition}), vLLM {version}, "
                  f"{day}")
        if roles:
            written += _write_roles(paths, task, split[0], source, endpoint, ready_after,
                                    by_role, progress)
            continue
        written.append(_write_aggregated(paths[0], task, layers, split, source, endpoint,
                                         ready_after, measured))
        progress(f"  wrote {paths[0]}")
    return written


def _write_aggregated(path: Path, task: ProfileTask, layers: int, split: list[int], source: str,
                      endpoint: Endpoint, ready_after: float,
                      measured: EngineMeasurements) -> Path:
    """Write the task's (aggregated) measured profile to ``path``."""
    places = task.stage_places
    document = profile_document(
        arch=task.architecture, gpu=task.gpu_type, tp=task.tp, layers=split[0] if task.pp == 1
        else layers, pp=task.pp, layer_partition=",".join(map(str, split)),
        source=source,
        model=task.model, partition="+".join(dict.fromkeys(p for p, _ in places)),
        stage_gpus=[g for _, g in places] if task.gpu_label != task.gpu_type else None,
        startup_s=endpoint.ready_at - endpoint.started_at, submit_to_ready_s=ready_after,
        measured=measured,
    )
    return write_profile(path, document)


__all__ = ["CoralError", "EngineFailed", "ProfileError", "ProfileTask", "pipeline_task", "profile_tasks",
           "run_profiles"]
