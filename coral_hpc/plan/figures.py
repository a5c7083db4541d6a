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


def _signature(dirs: tuple[Path, ...]) -> tuple:
    return tuple((str(p), p.stat().st_mtime_ns) for d in dirs if d.is_dir()
                 for p in sorted(d.glob("*.yaml")))


_configured: tuple | None = None


def use_measured_profiles(deployment: Deployment) -> None:
    """Point :mod:`coral_solver.perf` at ``deployment``'s measured profiles; re-read them when a
    file was added or changed since the last call (a profile written while ``serve`` runs counts at
    the next plan)."""
    global _configured
    dirs = measured_profile_dirs(deployment)
    key = (dirs, _signature(dirs))
    if key != _configured:
        perf.configure(measured=dirs)
        _configured = key


def figures_used(template: Template, arch: str) -> str:
    """``measured (FILE, ...)`` when every stage's (arch, GPU type, TP) has a measured profile,
    ``partly measured (...)`` when some has, else ``analytic``."""
    model = catalog.model_arch(arch)
    profiles = perf.measured_profiles()
    files, analytic = [], 0
    for gpu in dict.fromkeys(s.gpu_type for s in template.stages):
        found = profiles.get((model.name, catalog.gpu_spec(gpu).name, template.tp), ())
        if found:
            files += [Path(p.path).name for p in found]
        else:
            analytic += 1
    if not files:
        return "analytic"
    kind = "measured" if analytic == 0 else "partly measured"
    return f"{kind} ({', '.join(files)})"
