"""Measured profiles on disk: one YAML file per (architecture, GPU type, TP[, PP]) in the
schema :mod:`coral_solver.perf_profiles` reads, plus what the solver does not use yet (start-up
time, KV capacity, where and how it was measured)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from coral_hpc.config.host import role_profile_name
from coral_hpc.profile.measure import EngineMeasurements
from coral_hpc.profile.roles import RoleMeasurements


def profile_path(folder: Path, arch: str, gpu: str, tp: int, pp: int = 1) -> Path:
    """Where the profile of (arch, gpu, tp) — or of a ``pp``-stage pipeline — lives. An
    architecture named by its weights' path or Hugging Face id has its ``/`` written ``--`` (the
    hub cache's own spelling); the document's ``arch`` field keeps the name."""
    arch = arch.strip("/").replace("/", "--")
    if pp == 1:
        return folder / f"{arch}__{gpu}__tp{tp}.yaml"
    return folder / "pipelines" / f"{arch}__{gpu}__tp{tp}__pp{pp}.yaml"


def role_profile_path(folder: Path, arch: str, gpu: str, tp: int, role: str) -> Path:
    """Where the ``role`` ("prefill" or "decode") profile of (arch, gpu, tp) lives:
    ``roles/`` of the profiles folder (``coral-hpc profile --roles``)."""
    return folder / "roles" / role_profile_name(arch, gpu, tp, role)


def profile_document(
    *, arch: str, gpu: str, tp: int, layers: int, pp: int, layer_partition: str, source: str,
    model: str, partition: str, startup_s: float, submit_to_ready_s: float,
    measured: EngineMeasurements, stage_gpus: list[str] | None = None,
) -> dict[str, Any]:
    """The YAML document of one measured profile (``stage_gpus``: each stage's GPU type, for a
    pipeline whose stages' types differ; ``gpu`` is then the first stage's)."""
    closed = {point[:4]: point[4] for point in measured.closed_loop}
    steps = [{"decode_seqs": 0, "prefill_tokens": n, "context_tokens": n, "seconds": round(s, 6)}
             for n, s in measured.prefill]
    steps += [{"decode_seqs": b, "prefill_tokens": 0, "context_tokens": c, "seconds": round(s, 6)}
              for b, c, s in measured.decode]
    doc: dict[str, Any] = {
        "arch": arch, "gpu": gpu, "tp": tp, "layers": layers, "source": source,
        "model": model, "partition": partition,
        "startup_s": round(startup_s, 1), "submit_to_ready_s": round(submit_to_ready_s, 1),
        "kv_capacity_tokens": measured.kv_capacity_tokens,
        # requests_per_s: the highest Poisson arrival rate with 95 % of requests within both
        # SLOs (coral_hpc.profile.openloop); the closed-loop sweep's figure beside it
        "throughput": [
            {"input_tokens": i, "output_tokens": o, "ttft_s": ttft, "tpot_s": tpot,
             "requests_per_s": round(rps, 4), "method": "open-loop Poisson",
             **({"closed_loop_requests_per_s": round(closed[(i, o, ttft, tpot)], 4)}
                if (i, o, ttft, tpot) in closed else {})}
            for i, o, ttft, tpot, rps in measured.throughput if rps > 0
        ],
        "step_latency": steps,
    }
    if measured.open_loop_phases:
        doc["open_loop_phases"] = list(measured.open_loop_phases)
    if pp > 1:
        doc["pp"] = pp
        doc["layer_partition"] = layer_partition
    if stage_gpus:
        doc["stage_gpus"] = list(stage_gpus)
    return doc


def write_profile(path: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` atomically (a half-written profile is never read as a result)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    header = "# measured by `coral-hpc profile` (coral_hpc.profile); read by coral_solver.perf\n"
    tmp.write_text(header + yaml.safe_dump(document, sort_keys=False))
    tmp.replace(path)
    return path


def role_profile_document(
    *, arch: str, gpu: str, tp: int, layers: int, source: str, model: str, partition: str,
    startup_s: float, submit_to_ready_s: float, measured: RoleMeasurements,
) -> dict[str, Any]:
    """The YAML document of one role profile (``roles/``, :mod:`coral_hpc.profile.roles`):
    the aggregated schema with ``role``, and what the requests were judged against."""
    start = {point[:4]: point[4] for point in measured.search_start}
    doc: dict[str, Any] = {
        "arch": arch, "gpu": gpu, "tp": tp, "layers": layers, "role": measured.role,
        "source": source, "model": model, "partition": partition,
        "startup_s": round(startup_s, 1), "submit_to_ready_s": round(submit_to_ready_s, 1),
        "kv_capacity_tokens": measured.kv_capacity_tokens,
        # ttft_s/tpot_s: the model's SLO this figure serves; judged_against: what each request
        # had to meet (a prefill replica: TTFT less the modelled KV hand-off and one TPOT)
        "judged_against": dict(measured.judged),
        "throughput": [
            {"input_tokens": i, "output_tokens": o, "ttft_s": ttft, "tpot_s": tpot,
             "requests_per_s": round(rps, 4), "method": "open-loop Poisson",
             **({"search_start_requests_per_s": round(start[(i, o, ttft, tpot)], 4)}
                if (i, o, ttft, tpot) in start else {})}
            for i, o, ttft, tpot, rps in measured.throughput if rps > 0
        ],
        "step_latency": [
            {"decode_seqs": b, "prefill_tokens": p, "context_tokens": c, "seconds": round(s, 6)}
            for b, p, c, s in measured.steps],
    }
    if measured.prompt_tokens_cached is not None:
        # decode: the share of prompt tokens whose KV the prefix cache held (the rest were
        # computed again, which makes the figure conservative)
        doc["prompt_tokens_cached"] = round(measured.prompt_tokens_cached, 4)
    if measured.open_loop_phases:
        doc["open_loop_phases"] = list(measured.open_loop_phases)
    return doc
