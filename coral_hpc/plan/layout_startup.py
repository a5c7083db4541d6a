"""Start-up time per layout, and the layout a wake from zero gets: the one READY first.

**Start-up of a layout** (a template: GPU type of each stage, ``tp``, ``pp``) is the seconds
from its job's start to READY (loading weights, compiling, capturing CUDA graphs; Slurm's queue
wait is not in it: that is the start estimate's part). Where each figure comes from, first
found wins, and the figure says so (:attr:`LayoutStartup.source`):

1. this deployment's own replicas of that template: the median start→READY of the newest
   :data:`OWN_RECENT` that became READY (``replicas.started_at`` → ``ready_at`` in the store);
2. a measured profile of that layout (``coral-hpc profile`` writes ``startup_s``, job start to
   READY, into the profile of (architecture, GPU type, TP[, PP])), the shipped ones and the
   site's (``profiles_dir``);
3. the planner's default: the deployment-wide start-up (``policy.startup_time_s`` until this
   deployment has seen enough replicas start, then their median).

**A wake from zero** (a model scaled to zero whose request woke it, with no replica alive) asks
for the layout whose first replica is expected READY soonest: expected start + start-up of the
layout, where the expected start is 0 when the GPUs are free now and Slurm's estimate
(``sbatch --test-only``) otherwise. :func:`wake_library` keeps, of such a model's templates,
those expected READY within :data:`READY_TIE_S` of the earliest; Stage 2 then picks the cheapest
of them as it always does. So a layout that loads in 40 s beats a cheaper one that loads in
6 min, and among layouts READY alike the cheaper one wins.

Why not in Stage 2's objective: Stage 2 minimises cost per hour, and already charges each new
replica its start-up in cost (K re-plan intervals of its price). What a wake wants is not
cheaper but sooner, for users who wait now; weighing seconds of their wait against price would
need an exchange rate nobody can state. Narrowing the woken model's library instead keeps
Stage 2 (and its two-stage decomposition and the independent checker) exactly as it is: a
narrowed library is a valid Stage-2 input, as a template on cool-down is. A warm model's
further replicas are not narrowed: users are being served meanwhile, cost rules.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from coral_hpc.plan.figures import profiles_signature
from coral_hpc.records import ReplicaRecord
from coral_solver import catalog
from coral_solver.types import Cluster, ModelSpec, QueueOption, Template

#: a template's own start-ups counted: the newest this many (a new engine version or a new
#: cache on the nodes changes it; older ones say less)
OWN_RECENT = 5
#: layouts expected READY within this of the earliest count as READY alike (Slurm's start
#: estimates are to the minute, and start-ups vary by tens of seconds from one to the next)
READY_TIE_S = 60.0


@dataclass(frozen=True)
class LayoutStartup:
    """Seconds from a layout's job start to READY, and where the figure comes from."""

    seconds: float
    source: str


def own_layout_startups(records: Iterable[ReplicaRecord],
                        recent: int = OWN_RECENT) -> dict[str, LayoutStartup]:
    """Template id → the median start→READY of its newest ``recent`` replicas that became
    READY (``records`` in any order)."""
    seen: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        if record.started_at is None or record.ready_at is None or not record.template_id:
            continue
        seen.setdefault(record.template_id, []).append(
            (record.ready_at, max(0.0, record.ready_at - record.started_at)))
    out = {}
    for template_id, items in seen.items():
        newest = [s for _, s in sorted(items, reverse=True)[:recent]]
        out[template_id] = LayoutStartup(
            float(statistics.median(newest)),
            f"this deployment's replicas of {template_id} (median of {len(newest)})")
    return out


def _canonical_arch(name: str) -> str | None:
    try:
        return catalog.model_arch(name).name
    except Exception:  # a profile of an architecture this catalogue lacks: not this model
        return None


def _canonical_gpu(name: str) -> str | None:
    try:
        return catalog.gpu_spec(name).name
    except Exception:
        return None


#: (architecture, GPU type of each stage, tp) as the catalogue names them
ProfileKey = tuple[str, tuple[str, ...], int]


#: (folders, their files' signature) -> what :func:`profile_startups` read from them: the daemon
#: asks every cycle, and the files change only when someone profiles
_read: dict[tuple, dict[ProfileKey, LayoutStartup]] = {}


def profile_startups(folders: Iterable[Path]) -> dict[ProfileKey, LayoutStartup]:
    """The ``startup_s`` of every measured profile in ``folders`` (and their ``pipelines/``),
    by layout; a later folder's figure replaces an earlier one's (the site's own beat the
    shipped). Files without ``startup_s`` (shipped profiles measured before it was recorded) or
    that do not parse are skipped: the planner reads them for throughput and says so there.
    Read again only when a file was added, removed or rewritten."""
    dirs = tuple(folders)
    key = (dirs, profiles_signature(dirs))
    if key not in _read:
        _read.clear()
        _read[key] = _read_profile_startups(dirs)
    return dict(_read[key])


def _read_profile_startups(folders: tuple[Path, ...]) -> dict[ProfileKey, LayoutStartup]:
    """:func:`profile_startups`, read from the files."""
    out: dict[ProfileKey, LayoutStartup] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("pipelines/*.yaml")):
            try:
                doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("startup_s"), (int, float)):
                continue
            arch = _canonical_arch(str(doc.get("arch", "")))
            pp = int(doc.get("pp", 1) or 1)
            gpus = [str(g) for g in doc.get("stage_gpus") or [doc.get("gpu", "")] * pp]
            names = tuple(_canonical_gpu(g) for g in gpus)
            if arch is None or None in names or not isinstance(doc.get("tp"), int):
                continue
            out[(arch, tuple(n for n in names if n), int(doc["tp"]))] = LayoutStartup(
                float(doc["startup_s"]), f"measured profile {path.name}")
    return out


def layout_startup(template_id: str, arch: str, gpu_types: Iterable[str], tp: int,
                   own: Mapping[str, LayoutStartup],
                   profiles: Mapping[ProfileKey, LayoutStartup],
                   default: LayoutStartup) -> LayoutStartup:
    """The start-up of template ``template_id`` (stages on ``gpu_types``, ``tp`` GPUs each, of
    architecture ``arch``): its own replicas', else its measured profile's, else ``default``
    (see the module doc)."""
    if template_id in own:
        return own[template_id]
    name = _canonical_arch(arch)
    gpus = tuple(_canonical_gpu(g) or g for g in gpu_types)
    found = profiles.get((name, gpus, tp)) if name is not None else None
    return found if found is not None else default


def expected_start_s(template: Template, model: ModelSpec, cluster: Cluster) -> float | None:
    """Seconds until Slurm is expected to start ``template`` for ``model`` on ``cluster``: 0
    when each of its stages finds a node with ``tp`` GPUs available now, else the soonest
    wait at which they all do (node groups with a wait: Slurm's estimates within the
    horizon), else the soonest known estimate of its one-type shape beyond the horizon
    (``Cluster.queue_options``); None when Slurm gave no start for it.

    "Available" is the planner's: free GPUs plus those our serving replicas hold. A layout that
    looks free only on GPUs our own replicas keep does not fit in the plan; the planner then
    plans the wake without narrowing (``coral_hpc.plan.planner``)."""
    parts = [p for p in cluster.partitions if p.usable and model.allows_partition(p.name)
             and p.name not in cluster.preemptible()]
    best: float | None = 0.0
    for gpu, count in template.stage_counts().items():
        if not model.allows_gpu(gpu):
            return None
        rooms: dict[str, float] = {}  # node → the soonest wait with tp GPUs on it
        for part in parts:
            for name in part.node_groups:
                group = cluster.node_group(name)
                if group.gpu_type != gpu:
                    continue
                for node, free in zip(group.nodes, group.free):
                    if free >= template.tp:
                        rooms[node] = min(rooms.get(node, group.wait_s), group.wait_s)
        waits = sorted(rooms.values())
        if len(waits) < count:
            best = None
            break
        best = max(best or 0.0, waits[count - 1])
    if best is not None:
        return best
    return _queue_wait(template, model, cluster.queue_options)


def _queue_wait(template: Template, model: ModelSpec,
                options: Iterable[QueueOption]) -> float | None:
    if template.heterogeneous:
        return None
    gpu = template.stages[0].gpu_type
    waits = [o.wait_s for o in options if o.start_known and o.gpu_type == gpu
             and o.gpus_per_node == template.tp and o.nodes == template.pp
             and model.allows_partition(o.partition)]
    return min(waits) if waits else None


@dataclass(frozen=True)
class WakeChoice:
    """For one woken model: the templates kept, and each template's expected READY seconds
    (None: Slurm gave no start for it) with its start-up."""

    model: str
    kept: tuple[str, ...]
    ready_s: Mapping[str, float | None]
    startups: Mapping[str, LayoutStartup]

    def note(self) -> str:
        """One line for the plan's reasons: what was kept and why."""
        if not self.kept:
            return f"model {self.model} woken: no layout has a known start; all kept"
        first = self.kept[0]
        startup = self.startups[first]
        return (f"model {self.model} woken from zero: layouts expected READY soonest kept "
                f"({', '.join(self.kept)}); {first} READY in about {self.ready_s[first]:.0f} s, "
                f"start-up {startup.seconds:.0f} s ({startup.source})")


def wake_choice(model: ModelSpec, templates: Iterable[Template], cluster: Cluster,
                startup_of: Mapping[str, LayoutStartup], tie_s: float = READY_TIE_S
                ) -> WakeChoice:
    """The templates of ``model`` expected READY within ``tie_s`` of the soonest (expected
    start + start-up, ``startup_of`` by template id), soonest first. With no known start for
    any, none are singled out (``kept`` empty: the caller keeps them all)."""
    ready: dict[str, float | None] = {}
    for template in templates:
        if template.role != "both":
            # a prefill or decode pool serves nothing alone: a wake's first replica serves
            # both phases where the model has such layouts (with none, nothing is narrowed)
            ready[template.id] = None
            continue
        start = expected_start_s(template, model, cluster)
        ready[template.id] = None if start is None else start + startup_of[template.id].seconds
    known = sorted((s, t) for t, s in ready.items() if s is not None)
    if not known:
        return WakeChoice(model.name, (), ready, dict(startup_of))
    soonest = known[0][0]
    kept = tuple(t for s, t in known if s <= soonest + tie_s)
    return WakeChoice(model.name, kept, ready, dict(startup_of))


def wake_library(library: Mapping[str, list[Template]], models: Iterable[ModelSpec],
                 waking: frozenset[str], cluster: Cluster,
                 startup_of: Mapping[str, LayoutStartup]
                 ) -> tuple[dict[str, list[Template]], list[WakeChoice]]:
    """``library`` with each woken model's templates narrowed to those READY soonest
    (:func:`wake_choice`); the other models' unchanged. Also each woken model's choice."""
    out = {name: list(templates) for name, templates in library.items()}
    choices = []
    for model in models:
        if model.name not in waking or not out.get(model.name):
            continue
        choice = wake_choice(model, out[model.name], cluster, startup_of)
        choices.append(choice)
        if choice.kept:
            keep = set(choice.kept)
            out[model.name] = [t for t in out[model.name] if t.id in keep]
    return out, choices
