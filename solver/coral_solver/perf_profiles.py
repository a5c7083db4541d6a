"""Efficiency factors and measured profiles that parameterise :mod:`coral_solver.perf`.

``profiles/calibration.yaml`` holds per-GPU-class and per-GPU efficiency factors fitted by
``bench/calibrate.py``; ``profiles/measured/*.yaml`` hold measurements written by
``coral-hpc profile``, which override the analytic model.

Measured profile schema (one file per (arch, gpu, tp); every list optional)::

    arch: llama-3.1-8b        # a key of profiles/models.yaml (or an alias)
    gpu: a100                 # a key of profiles/gpus.yaml (or an alias)
    tp: 1
    layers: 32                # layers held by the measured engine; default: all of the model
    source: "coral-hpc profile on a100-01, vLLM 0.11.0, 2026-05-01"
    throughput:               # Melange-style: most req/s that met the SLO, per mix bucket
      - {input_tokens: 512, output_tokens: 128, ttft_s: 2.0, tpot_s: 0.05, requests_per_s: 10.5}
    step_latency:             # measured engine steps: the model's steps (coral_solver.perf_fit)
      - {decode_seqs: 16, prefill_tokens: 0, context_tokens: 8192, seconds: 0.0132}

Role profiles (``roles/<arch>__<gpu>__tp<N>__<role>.yaml``, ``coral-hpc profile --roles``) take
the same schema with ``role: prefill`` or ``role: decode``; their ``throughput`` points are what
one replica of that role sustains (:mod:`coral_solver.perf_roles`): for ``prefill`` the most
prompts/s of the mix's input length whose TTFT met the prefill side's share of the SLO, for
``decode`` the most requests/s of the mix whose TPOT met the SLO with the prompt's KV already in
place. Their ``step_latency`` is not used for the aggregated model's steps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# libyaml's C loader parses the profile files ~10x faster (the sim engine and every plan load
# them at start-up); fall back to the pure-Python safe loader where libyaml is missing.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

from coral_solver.catalog import CatalogError, GpuSpec, canonical_gpu_name, model_arch
from coral_solver.resources import profiles_dir


@dataclass(frozen=True)
class Factors:
    """Efficiency factors of one GPU type (see profiles/calibration.yaml for meanings)."""

    prefill_mfu: float
    decode_mbu: float
    kv_mbu: float
    attn_mfu: float
    layer_floor_us: float
    overlap: float = 0.0  # 0: compute and memory time overlap fully (roofline max); 1: they add


@dataclass(frozen=True)
class Calibration:
    """Everything in calibration.yaml, parsed."""

    source: str
    gpu_memory_utilization: float
    reserve_gb: float
    max_num_seqs: int
    max_num_batched_tokens: int
    step_overhead_s: float
    ttft_queue_steps: float
    classes: dict[str, Factors]
    gpus: dict[str, Factors]
    tp_alpha_s: dict[str, float]  # keyed by interconnect ('nvlink', 'pcie') or GPU type
    tp_bus_bw: dict[str, float]  # bytes/s, same keys
    pp_alpha_s: float
    pp_bw: float  # bytes/s
    calibrated_quantizations: tuple[str, ...]
    calibrated_moe: bool

    def __hash__(self) -> int:  # dict fields: identity is enough (one object per file load)
        return id(self)

    def factors(self, gpu: GpuSpec) -> Factors:
        """The GPU's own fitted factors, else its class's, else the 'hbm' class's."""
        if gpu.name in self.gpus:
            return self.gpus[gpu.name]
        return self.classes.get(gpu.gpu_class) or self.classes["hbm"]

    def tp_comm(self, gpu: GpuSpec) -> tuple[float, float]:
        """(alpha seconds, bus bytes/s) of one all-reduce among this GPU type's TP ranks: the
        GPU's own fit when there is one, else its interconnect's."""
        key = gpu.name if gpu.name in self.tp_alpha_s else gpu.interconnect
        return self.tp_alpha_s[key], self.tp_bus_bw[key]


@dataclass(frozen=True)
class ThroughputPoint:
    """One measured max-throughput-under-SLO point."""

    input_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    requests_per_s: float


@dataclass(frozen=True)
class StepPoint:
    """One measured engine step."""

    decode_seqs: int
    prefill_tokens: int
    context_tokens: int
    seconds: float


@dataclass(frozen=True)
class MeasuredProfile:
    """A measured profile of (arch, gpu, tp, layers) from one file."""

    path: str
    arch: str
    gpu: str
    tp: int
    layers: int
    source: str
    throughput: tuple[ThroughputPoint, ...]
    step_latency: tuple[StepPoint, ...]
    #: pipeline profiles (``pipelines/…__pp<N>.yaml``, ``coral-hpc profile --pp N``): stages and
    #: layers per stage; their throughput is the whole replica's, their steps end to end
    pp: int = 1
    layer_partition: tuple[int, ...] = ()
    #: each stage's GPU type when they differ (a hetjob pipeline; ``gpu`` is the first stage's)
    stage_gpus: tuple[str, ...] = ()
    #: KV-cache tokens the engine reported for its (first) stage's ``layers`` layers; None when
    #: not measured
    kv_capacity_tokens: int | None = None
    #: "both" (an aggregated replica), or "prefill" / "decode": a role profile (``roles/``)
    role: str = "both"


#: the roles a measured profile may describe (``role`` field; absent: "both")
PROFILE_ROLES = ("both", "prefill", "decode")


def _num(path: Path, where: str, entry: dict[str, Any], field: str, kind: type, minimum: float):
    if field not in entry:
        raise CatalogError(f"{path}: {where}: missing field '{field}'")
    try:
        value = kind(entry[field])
    except (TypeError, ValueError) as exc:
        raise CatalogError(
            f"{path}: {where}: field '{field}' = {entry[field]!r} is not a {kind.__name__}"
        ) from exc
    if value < minimum:
        raise CatalogError(f"{path}: {where}: field '{field}' = {value} must be >= {minimum}")
    return value


def _mapping(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping at the top level")
    return data


def _factors(path: Path, where: str, entry: Any, base: Factors | None) -> Factors:
    """The factors at ``where`` in calibration.yaml, those it leaves out taken from ``base``."""
    if not isinstance(entry, dict):
        raise CatalogError(f"{path}: {where}: expected a mapping of factors")
    merged = dict(base.__dict__) if base else {}
    merged.update({k: v for k, v in entry.items() if k in Factors.__dataclass_fields__})
    missing = [f for f in ("prefill_mfu", "decode_mbu", "kv_mbu", "attn_mfu") if f not in merged]
    if missing:
        raise CatalogError(f"{path}: {where}: missing factor(s) {missing}")
    merged.setdefault("layer_floor_us", 0.0)
    for name in merged:
        _num(path, where, merged, name, float, 0.0)
    return Factors(**{k: float(v) for k, v in merged.items()})


def _gpu_factors(path: Path, entries: dict[Any, Any], classes: dict[str, Factors],
                 profiles: Path | None) -> dict[str, Factors]:
    """calibration.yaml's ``gpus``: per GPU type (canonical name) its factors, those it leaves
    out taken from its memory class's."""
    from coral_solver.catalog import gpu_spec

    gpus: dict[str, Factors] = {}
    for name, entry in entries.items():
        canonical = canonical_gpu_name(str(name), profiles)
        if canonical is None:
            raise CatalogError(f"{path}: gpus.{name}: not a GPU type in gpus.yaml")
        base = classes.get(gpu_spec(canonical, profiles).gpu_class, classes["hbm"])
        gpus[canonical] = _factors(path, f"gpus.{name}", entry, base)
    return gpus


def _tp_comm(path: Path, tp_comm: dict[Any, Any],
             profiles: Path | None) -> dict[str, dict[str, Any]]:
    """calibration.yaml's ``tp_comm``: per link kind (``nvlink``, ``pcie``, both required) or
    GPU type its all-reduce figures."""
    for kind in ("nvlink", "pcie"):
        if kind not in tp_comm:
            raise CatalogError(f"{path}: tp_comm: missing '{kind}'")
    comm: dict[str, dict[str, Any]] = {}
    for key, entry in tp_comm.items():
        name = str(key) if key in ("nvlink", "pcie") else canonical_gpu_name(str(key), profiles)
        if name is None:
            raise CatalogError(f"{path}: tp_comm.{key}: not 'nvlink', 'pcie' or a GPU type in gpus.yaml")
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: tp_comm.{key}: expected {{alpha_us: .., bus_bw_gbs: ..}}")
        comm[name] = entry
    return comm


@functools.lru_cache(maxsize=8)
def load_calibration(profiles: Path | None = None) -> Calibration:
    """Parse ``calibration.yaml`` from ``profiles`` (default: the shipped profiles folder)."""
    path = (profiles or profiles_dir()) / "calibration.yaml"
    if not path.is_file():
        raise CatalogError(f"{path}: file not found")
    data = _mapping(path)
    classes = {str(k): _factors(path, f"classes.{k}", v, None)
               for k, v in (data.get("classes") or {}).items()}
    if "hbm" not in classes:
        raise CatalogError(f"{path}: classes: the default class 'hbm' is missing")
    gpus = _gpu_factors(path, data.get("gpus") or {}, classes, profiles)
    engine = data.get("engine") or {}
    comm = _tp_comm(path, data.get("tp_comm") or {}, profiles)
    pipeline = data.get("pipeline") or {}
    return Calibration(
        source=str(data.get("source", "")),
        gpu_memory_utilization=float(engine.get("gpu_memory_utilization", 0.9)),
        reserve_gb=float(engine.get("reserve_gb", 2.0)),
        max_num_seqs=int(engine.get("max_num_seqs", 256)),
        max_num_batched_tokens=int(engine.get("max_num_batched_tokens", 8192)),
        step_overhead_s=float(engine.get("step_overhead_ms", 1.5)) / 1e3,
        ttft_queue_steps=float(engine.get("ttft_queue_steps", 1.0)),
        classes=classes,
        gpus=gpus,
        tp_alpha_s={k: _num(path, f"tp_comm.{k}", v, "alpha_us", float, 0) / 1e6
                    for k, v in comm.items()},
        tp_bus_bw={k: _num(path, f"tp_comm.{k}", v, "bus_bw_gbs", float, 1e-9) * 1e9
                   for k, v in comm.items()},
        pp_alpha_s=float(pipeline.get("alpha_ms", 0.25)) / 1e3,
        pp_bw=float(pipeline.get("bw_gbs", 10.0)) * 1e9,
        calibrated_quantizations=tuple(data.get("calibrated_quantizations") or ("bf16",)),
        calibrated_moe=bool(data.get("calibrated_moe", False)),
    )


def parse_measured(path: Path, profiles: Path | None = None) -> MeasuredProfile:
    """Parse and validate one measured profile file (errors name the file and field)."""
    data = _mapping(path)
    for field in ("arch", "gpu"):
        if field not in data:
            raise CatalogError(f"{path}: missing field '{field}'")
    try:
        arch = model_arch(str(data["arch"]), profiles)
    except KeyError as exc:
        raise CatalogError(f"{path}: field 'arch': {exc.args[0]}") from exc
    gpu = canonical_gpu_name(str(data["gpu"]), profiles)
    if gpu is None:
        raise CatalogError(f"{path}: field 'gpu': unknown GPU type {data['gpu']!r}")
    tp = _num(path, "top level", data, "tp", int, 1)
    layers = _num(path, "top level", {"layers": data.get("layers", arch.layers)}, "layers", int, 1)
    if layers > arch.layers:
        raise CatalogError(f"{path}: field 'layers' = {layers} exceeds the model's {arch.layers}")
    throughput = _throughput_points(path, data.get("throughput") or [])
    steps = _step_points(path, data.get("step_latency") or [])
    pp, split, stage_gpus = _pipeline(path, data, arch.layers, profiles)
    kv_tokens = None
    if data.get("kv_capacity_tokens") is not None:
        kv_tokens = _num(path, "top level", data, "kv_capacity_tokens", int, 1)
    role = str(data.get("role", "both"))
    if role not in PROFILE_ROLES:
        raise CatalogError(f"{path}: field 'role' = {role!r}: expected one of {PROFILE_ROLES}")
    if role != "both" and pp > 1:
        raise CatalogError(f"{path}: field 'role' = {role!r}: role profiles are of one stage, "
                           f"not pp {pp}")
    return MeasuredProfile(
        path=str(path), arch=arch.name, gpu=gpu, tp=tp, layers=layers,
        source=str(data.get("source", "")), throughput=tuple(throughput), step_latency=tuple(steps),
        pp=pp, layer_partition=split, stage_gpus=tuple(stage_gpus), kv_capacity_tokens=kv_tokens,
        role=role,
    )


def _throughput_points(path: Path, entries: list[Any]) -> list[ThroughputPoint]:
    """A measured profile's ``throughput`` points."""
    throughput = []
    for i, entry in enumerate(entries):
        where = f"throughput[{i}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: {where}: expected a mapping")
        throughput.append(ThroughputPoint(
            input_tokens=_num(path, where, entry, "input_tokens", int, 1),
            output_tokens=_num(path, where, entry, "output_tokens", int, 1),
            ttft_s=_num(path, where, entry, "ttft_s", float, 0),
            tpot_s=_num(path, where, entry, "tpot_s", float, 0),
            requests_per_s=_num(path, where, entry, "requests_per_s", float, 0),
        ))
    return throughput


def _step_points(path: Path, entries: list[Any]) -> list[StepPoint]:
    """A measured profile's ``step_latency`` points."""
    steps = []
    for i, entry in enumerate(entries):
        where = f"step_latency[{i}]"
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: {where}: expected a mapping")
        steps.append(StepPoint(
            decode_seqs=_num(path, where, entry, "decode_seqs", int, 0),
            prefill_tokens=_num(path, where, entry, "prefill_tokens", int, 0),
            context_tokens=_num(path, where, entry, "context_tokens", int, 0),
            seconds=_num(path, where, entry, "seconds", float, 1e-9),
        ))
    return steps


def _pipeline(path: Path, data: dict[str, Any], model_layers: int,
              profiles: Path | None) -> tuple[int, tuple[int, ...], list[str]]:
    """A measured profile's pipeline: (stages ``pp``, layers per stage when ``pp`` > 1, each
    stage's GPU type when given), checked against the model's ``model_layers``."""
    pp = _num(path, "top level", {"pp": data.get("pp", 1)}, "pp", int, 1)
    split: tuple[int, ...] = ()
    if pp > 1:
        try:
            split = tuple(int(x) for x in str(data.get("layer_partition", "")).split(","))
        except ValueError:
            split = ()
        if len(split) != pp or min(split) < 1 or sum(split) != model_layers:
            raise CatalogError(
                f"{path}: field 'layer_partition' = {data.get('layer_partition')!r}: expected {pp} "
                f"positive layer counts separated by commas, summing to {model_layers}")
    stage_gpus: list[str] = []
    for i, name in enumerate(data.get("stage_gpus") or []):
        canonical = canonical_gpu_name(str(name), profiles)
        if canonical is None:
            raise CatalogError(f"{path}: stage_gpus[{i}]: unknown GPU type {name!r}")
        stage_gpus.append(canonical)
    if stage_gpus and len(stage_gpus) != pp:
        raise CatalogError(f"{path}: field 'stage_gpus': {len(stage_gpus)} GPU types for {pp} "
                           "stages; expected one per stage")
    return pp, split, stage_gpus


@functools.lru_cache(maxsize=8)
def load_measured(measured_dirs: tuple[Path, ...], profiles: Path | None = None,
                  pipelines: bool = False, roles: bool = False
                  ) -> dict[tuple[str, str, int], tuple[MeasuredProfile, ...]]:
    """All measured single-process profiles under ``measured_dirs`` (``*.yaml``), keyed by
    (arch, gpu, tp); ``pipelines``: the pipeline profiles (``pipelines/*.yaml``) instead;
    ``roles``: the prefill and decode role profiles (``roles/*.yaml``) instead."""
    found: dict[tuple[str, str, int], list[MeasuredProfile]] = {}
    sub = "pipelines" if pipelines else "roles" if roles else ""
    for folder in measured_dirs:
        if not folder.is_dir():
            continue
        for path in sorted((folder / sub if sub else folder).glob("*.yaml")):
            profile = parse_measured(path, profiles)
            if (profile.role != "both") != roles:
                where = "roles/ (a role profile)" if profile.role != "both" else (
                    "the profiles folder itself, not roles/")
                raise CatalogError(f"{path}: field 'role' = {profile.role!r}: belongs in "
                                   f"{where}")
            found.setdefault((profile.arch, profile.gpu, profile.tp), []).append(profile)
    return {key: tuple(v) for key, v in found.items()}
