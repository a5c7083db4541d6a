"""Stage 1 at a site's scale: the template library in shards, in parallel processes, resumable,
and runnable as a Slurm array job on CPU nodes.

The work is cut into **shards** = (model, locality domain, role, TP degree). Each shard is the
exact search of :func:`coral_solver.templates.model_templates` (or
:func:`coral_solver.roles.phase_templates`) over that TP degree only, and its non-dominated
templates are written to ``<work>/shards/<key>.json`` atomically (temp file + rename) the moment
it ends. So a killed run loses only the shards in flight: the next run reads what is there and
computes the rest. Shards are independent: a template uses configurations (GPU type, TP) of its
own TP degree only, so dominance ("another template uses no more stages of every configuration
and serves at least as much") never crosses TP degrees or roles, and concatenating the shards of
a (model, domain, role) in TP order and dropping dominated templates once more gives exactly
what the serial :func:`coral_solver.templates.build_library` gives (tested).

:func:`merge` writes each (model, domain) library where :func:`build_library` caches it, under
the same key, so ``coral-hpc plan`` / ``serve`` with that cache folder read it instead of
recomputing. ``python -m coral_solver.stage1 --help`` runs it from a JSON spec (:class:`Spec`);
``sbatch_templates/stage1-array.sbatch`` runs one array task per slice of the shards
(INSTALL.md, "Stage 1 as a Slurm array job").
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from coral_solver.roles import phase_templates, roles_for
from coral_solver.templates import (
    ThroughputModel,
    _cache_key,
    _from_json,
    _named,
    _to_json,
    default_cache_dir,
    drop_dominated,
    model_templates,
)
from coral_solver.types import ModelSpec, ObservedLengths, Policy, Template

SHARD_VERSION = 1

#: GPU type → (most GPUs on one node, GPU memory GB), as :meth:`solver.types.Cluster.gpu_types`
GpuTypes = Mapping[str, tuple[int, float]]


class SpecError(ValueError):
    """A Stage-1 spec that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Spec:
    """What Stage 1 is asked: models, the GPU types of each locality domain (no template spans
    two domains; one domain for an ordinary site), the policy, and which throughput model."""

    models: tuple[ModelSpec, ...]
    domains: Mapping[str, GpuTypes]
    policy: Policy = field(default_factory=Policy)
    #: ``module:Class`` of the throughput model
    #: (default :class:`coral_solver.templates.PerfThroughput`)
    throughput: str = "coral_solver.templates:PerfThroughput"
    #: folders of measured profiles the planner also reads (``solver.perf.configure``)
    measured_dirs: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "models": [asdict(m) for m in self.models],
            "domains": {d: {g: list(v) for g, v in gpus.items()}
                        for d, gpus in self.domains.items()},
            "policy": asdict(self.policy),
            "throughput": self.throughput,
            "measured_dirs": list(self.measured_dirs),
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "spec") -> Spec:
        """Parse a spec; a bad field raises :class:`SpecError` naming it."""
        if not isinstance(data, dict):
            raise SpecError(f"{source}: expected a JSON object with models, domains, policy")
        model_fields = {f.name for f in fields(ModelSpec)}
        policy_fields = {f.name for f in fields(Policy)}
        models = []
        for i, item in enumerate(data.get("models") or []):
            unknown = set(item) - model_fields if isinstance(item, dict) else {"?"}
            if unknown:
                raise SpecError(f"{source}: models[{i}]: unknown field(s) {sorted(unknown)}; "
                                f"valid: {sorted(model_fields)}")
            try:
                item = dict(item)
                for key in ("gpu_types", "partitions"):
                    if key in item:
                        item[key] = tuple(item[key])
                if isinstance(item.get("lengths"), dict):  # as to_json wrote it
                    item["lengths"] = ObservedLengths(
                        str(item["lengths"]["source"]),
                        tuple((int(p), int(o)) for p, o in item["lengths"]["pairs"]))
                models.append(ModelSpec(**item))
            except (TypeError, KeyError, ValueError) as exc:
                raise SpecError(f"{source}: models[{i}]: {exc}") from None
        if not models:
            raise SpecError(f"{source}: models: at least one model is needed")
        domains: dict[str, dict[str, tuple[int, float]]] = {}
        raw = data.get("domains")
        if not isinstance(raw, dict) or not raw:
            raise SpecError(f"{source}: domains: expected {{domain: {{gpu_type: [gpus per node, "
                            "GPU memory GB]}}}} with at least one domain")
        for name, gpus in raw.items():
            if not isinstance(gpus, dict) or not gpus:
                raise SpecError(f"{source}: domains.{name}: expected {{gpu_type: [gpus per node, "
                                "GPU memory GB]}}")
            out = {}
            for gpu, value in gpus.items():
                if (not isinstance(value, list) or len(value) != 2
                        or not all(isinstance(v, (int, float)) and v > 0 for v in value)):
                    raise SpecError(f"{source}: domains.{name}.{gpu}: expected [gpus per node, "
                                    f"GPU memory GB], both > 0, got {value!r}")
                out[gpu] = (int(value[0]), float(value[1]))
            domains[name] = out
        policy_raw = data.get("policy") or {}
        unknown = set(policy_raw) - policy_fields
        if unknown:
            raise SpecError(f"{source}: policy: unknown field(s) {sorted(unknown)}; "
                            f"valid: {sorted(policy_fields)}")
        try:
            policy = Policy(**policy_raw)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{source}: policy: {exc}") from None
        return cls(tuple(models), domains, policy,
                   str(data.get("throughput") or "coral_solver.templates:PerfThroughput"),
                   tuple(str(p) for p in data.get("measured_dirs") or ()))

    def throughput_model(self) -> ThroughputModel:
        """An instance of :attr:`throughput` (after pointing solver.perf at measured_dirs)."""
        if self.measured_dirs:
            from coral_solver import perf

            perf.configure(measured=[Path(p) for p in self.measured_dirs])
        module, _, name = self.throughput.partition(":")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise SpecError(f"throughput: {self.throughput!r} cannot be loaded ({exc}); "
                            "expected module:Class") from None
        return factory()


@dataclass(frozen=True)
class Shard:
    """One unit of Stage-1 work and the file its templates go to."""

    model: int  #: index into Spec.models
    domain: str
    role: str
    tp: int
    key: str


@dataclass
class RunReport:
    """What one :func:`run` call did."""

    shards: int  #: shards of the whole spec
    assigned: int  #: shards of this task (all of them unless an array task)
    done_before: int  #: of those, found finished on disk
    computed: int  #: computed by this call
    seconds: float
    workers: int


def shard_plan(spec: Spec, tm: ThroughputModel) -> list[Shard]:
    """Every shard of the spec, in a fixed order (array tasks take every N-th)."""
    fingerprint = tm.fingerprint()
    out = []
    for mi, model in enumerate(spec.models):
        for domain, gpus in spec.domains.items():
            base = _cache_key_fixed(tm, model, gpus, spec.policy, fingerprint)
            for role in roles_for(model):
                for tp in tm.tp_degrees(model, spec.policy.max_tp):
                    if not any(size >= tp for size, _ in gpus.values()):
                        continue
                    key = hashlib.sha256(json.dumps(
                        [SHARD_VERSION, base, role, tp]).encode()).hexdigest()[:32]
                    out.append(Shard(mi, domain, role, tp, key))
    return out


def _cache_key_fixed(tm: ThroughputModel, model: ModelSpec, gpus: GpuTypes, policy: Policy,
                     fingerprint: str) -> str:
    """:func:`coral_solver.templates._cache_key` with the fingerprint computed once (it hashes every
    profile file)."""
    return _cache_key(tm, model, gpus, policy, fingerprint)


def compute_shard(spec: Spec, shard: Shard, tm: ThroughputModel) -> list[Template]:
    """The shard's non-dominated templates (exact search over its TP degree)."""
    model = spec.models[shard.model]
    gpus = spec.domains[shard.domain]
    if shard.role == "both":
        return model_templates(tm, model, gpus, spec.policy, tps=[shard.tp])
    return phase_templates(tm, model, gpus, spec.policy, shard.role,  # type: ignore[arg-type]
                           tps=[shard.tp])


def _path(work: Path, shard: Shard) -> Path:
    return work / "shards" / f"{shard.key}.json"


def read_shard(work: Path, shard: Shard) -> list[Template] | None:
    """A finished shard's templates, or None when absent or damaged (then it is recomputed)."""
    path = _path(work, shard)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != shard.key:
            return None
        return _from_json(data["templates"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_shard(work: Path, shard: Shard, templates: list[Template], seconds: float) -> None:
    path = _path(work, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": shard.key, "model": shard.model, "domain": shard.domain,
                               "role": shard.role, "tp": shard.tp, "seconds": round(seconds, 4),
                               "templates": _to_json(templates)}))
    tmp.replace(path)  # atomic: a reader (or a resumed run) never sees half a shard


# a forked worker's view of the run: set before the pool forks, inherited by the children
_WORKER: dict[str, Any] = {}


def _work_group(indices: list[int]) -> int:
    """Shards of one (model, role, TP) in every domain, in one process: domains with the same
    GPU types ask the throughput model the same questions, which its memo tables answer."""
    spec, shards, tm, work = (_WORKER[k] for k in ("spec", "shards", "tm", "work"))
    for index in indices:
        shard = shards[index]
        began = time.perf_counter()
        templates = compute_shard(spec, shard, tm)
        _write_shard(work, shard, templates, time.perf_counter() - began)
    return len(indices)


def _groups(shards: list[Shard]) -> list[list[int]]:
    """Shard indices by (model, role, TP), in plan order. A shard whose key an earlier one has
    (another model of the same architecture, mix, SLO and GPU types) is left out: its file is
    that one's, and :func:`merge` reads it for both."""
    out: dict[tuple[int, str, int], list[int]] = {}
    seen: set[str] = set()
    for i, shard in enumerate(shards):
        if shard.key in seen:
            continue
        seen.add(shard.key)
        out.setdefault((shard.model, shard.role, shard.tp), []).append(i)
    return list(out.values())


def run(spec: Spec, work: Path | str, tm: ThroughputModel | None = None, workers: int = 1,
        task: int = 0, tasks: int = 1, limit: int | None = None,
        progress: Callable[[int, int], None] | None = None) -> RunReport:
    """Compute this task's unfinished shards, ``workers`` processes at once; ``limit``: stop
    after that many (a deliberately partial run). Work goes out in groups — one (model, role,
    TP) in every domain — and array task ``task`` of ``tasks`` takes every ``tasks``-th group."""
    began = time.perf_counter()
    if not 0 <= task < tasks:
        raise ValueError(f"task {task}: expected 0 ≤ task < tasks ({tasks})")
    work = Path(work)
    tm = tm if tm is not None else spec.throughput_model()
    shards = shard_plan(spec, tm)
    mine = _groups(shards)[task::tasks]
    assigned = sum(len(g) for g in mine)
    todo = [[i for i in group if read_shard(work, shards[i]) is None] for group in mine]
    todo = [group for group in todo if group]
    done_before = assigned - sum(len(g) for g in todo)
    if limit is not None:
        kept, left = [], limit
        for group in todo:
            if left > 0:
                kept.append(group[:left])
                left -= len(kept[-1])
        todo = kept
    total = sum(len(g) for g in todo)
    _WORKER.update(spec=spec, shards=shards, tm=tm, work=work)
    finished = 0
    try:
        if workers <= 1 or len(todo) <= 1:
            for group in todo:
                finished += _work_group(group)
                if progress:
                    progress(finished, total)
        else:
            # fork: the throughput model (module handles, memo tables) is inherited, not
            # pickled; each worker writes its own shard files, so a kill loses only those in
            # flight
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                for count in pool.map(_work_group, todo, chunksize=1):
                    finished += count
                    if progress:
                        progress(finished, total)
    finally:
        _WORKER.clear()
    return RunReport(len(shards), assigned, done_before, finished,
                     time.perf_counter() - began, max(1, workers))


class Incomplete(RuntimeError):
    """Some shards are not finished yet (run again, or wait for the array job)."""


def merge(spec: Spec, work: Path | str, tm: ThroughputModel | None = None
          ) -> dict[str, dict[str, list[Template]]]:
    """domain → model name → templates, exactly as :func:`build_library` per domain gives them;
    raises :class:`Incomplete` naming how many shards are missing."""
    work = Path(work)
    tm = tm if tm is not None else spec.throughput_model()
    shards = shard_plan(spec, tm)
    parts: dict[tuple[int, str, str], list[Template]] = {}
    missing = 0
    for shard in shards:
        templates = read_shard(work, shard)
        if templates is None:
            missing += 1
            continue
        # a shard shared between models (same key) was written under one of their names
        parts.setdefault((shard.model, shard.domain, shard.role), []).extend(
            _named(templates, spec.models[shard.model].name))
    if missing:
        raise Incomplete(f"{missing} of {len(shards)} Stage-1 shards are not finished in {work}")
    out: dict[str, dict[str, list[Template]]] = {d: {} for d in spec.domains}
    for mi, model in enumerate(spec.models):
        for domain in spec.domains:
            library: list[Template] = []
            for role in roles_for(model):
                # shards were read in TP order; one more pass changes nothing (dominance never
                # crosses TP degrees) but keeps the result identical to the serial search
                library += drop_dominated(parts.get((mi, domain, role), []))
            out[domain][model.name] = library
    return out


def write_cache(spec: Spec, libraries: Mapping[str, Mapping[str, list[Template]]],
                cache_dir: Path | str | None = None, tm: ThroughputModel | None = None
                ) -> list[Path]:
    """Write each (domain, model) library where :func:`coral_solver.templates.build_library` looks
    for it (same key), so the planner reads it instead of computing it."""
    tm = tm if tm is not None else spec.throughput_model()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fingerprint = tm.fingerprint()
    written = []
    for domain, gpus in spec.domains.items():
        for model in spec.models:
            path = folder / f"{_cache_key_fixed(tm, model, gpus, spec.policy, fingerprint)}.json"
            if path in written:
                continue  # another model of the same key: one entry serves both
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(_to_json(libraries[domain][model.name])))
            tmp.replace(path)
            written.append(path)
    return written


# --------------------------------------------------------------------------- command line


def _load_spec(path: str) -> Spec:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SpecError(f"{path}: not JSON ({exc})") from None
    return Spec.from_json(data, path)


def array_task(env: Mapping[str, str]) -> tuple[int, int]:
    """(task index from 0, tasks) of a Slurm array task: ``--array=1-16`` or ``0-30:2`` count
    from the array's first index in its steps; (0, 1) outside an array job."""
    if "SLURM_ARRAY_TASK_ID" not in env:
        return 0, 1
    first = int(env.get("SLURM_ARRAY_TASK_MIN", 0))
    step = max(int(env.get("SLURM_ARRAY_TASK_STEP", 1)), 1)
    index = (int(env["SLURM_ARRAY_TASK_ID"]) - first) // step
    return index, int(env.get("SLURM_ARRAY_TASK_COUNT", index + 1))


def main(argv: list[str] | None = None) -> int:
    """``python -m coral_solver.stage1 {shards,run,merge}`` (exit 2 on a bad spec)."""
    parser = argparse.ArgumentParser(prog="python -m coral_solver.stage1",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    count = sub.add_parser("shards", help="print how many shards the spec has (array size)")
    count.add_argument("--spec", required=True)
    go = sub.add_parser("run", help="compute unfinished shards (resumes a killed run)")
    go.add_argument("--spec", required=True)
    go.add_argument("--work", required=True, help="folder of finished shards (shared by tasks)")
    go.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    task, tasks = array_task(os.environ)
    go.add_argument("--task", type=int, default=task,
                    help="this array task's index (default: from SLURM_ARRAY_TASK_*)")
    go.add_argument("--tasks", type=int, default=tasks, help="array tasks in all")
    done = sub.add_parser("merge", help="join finished shards into the planner's cache")
    done.add_argument("--spec", required=True)
    done.add_argument("--work", required=True)
    done.add_argument("--cache-dir", default=None, help="default: the planner's cache folder")
    args = parser.parse_args(argv)
    try:
        spec = _load_spec(args.spec)
        tm = spec.throughput_model()
        if args.command == "shards":
            print(len(shard_plan(spec, tm)))
            return 0
        if args.command == "run":
            report = run(spec, args.work, tm, workers=args.workers, task=args.task,
                         tasks=args.tasks)
            print(json.dumps(asdict(report)))
            return 0
        libraries = merge(spec, args.work, tm)
        paths = write_cache(spec, libraries, args.cache_dir, tm)
        total = sum(len(ts) for lib in libraries.values() for ts in lib.values())
        print(json.dumps({"templates": total, "cache_files": len(paths),
                          "cache_dir": str(paths[0].parent) if paths else None}))
        return 0
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Incomplete as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
