"""Stage 1 for disaggregated serving: prefill-only and decode-only templates of a model.

Each phase is its own template family, found by the same exact best-layout search as an
aggregated template (:func:`coral_solver.templates.model_templates`), over a view of the throughput
model that answers for that phase. So each phase picks its own GPU type, TP degree, pipeline
stages and layer split: prefill where compute per cost is cheapest, decode where memory
bandwidth per cost is. Which templates a model gets follows ``ModelSpec.disaggregation``:
``off`` aggregated only, ``on`` prefill + decode only, ``auto`` all three (Stage 2 chooses).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Protocol, TypeGuard

from coral_solver.types import ModelSpec, Policy, Role, Template

#: the roles a disaggregated model's replicas take
PHASES: tuple[Role, Role] = ("prefill", "decode")


class PhaseThroughputModel(Protocol):
    """A throughput model (:class:`coral_solver.templates.ThroughputModel`) that also knows the
    phases apart."""

    def phase_throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                         stages: int, role: Role) -> float:
        """Requests/s one stage of a ``role`` replica sustains (see coral_solver.perf_roles)."""

    def kv_bytes_per_request(self, model: ModelSpec) -> float:
        """KV bytes one request moves from its prefill to its decode replica."""


class _PhaseView:
    """The throughput model as seen by one phase: ``throughput`` answers for ``role``."""

    def __init__(self, tm, role: Role) -> None:
        self._tm = tm
        self._role = role

    def __getattr__(self, name: str):
        return getattr(self._tm, name)

    def throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int, stages: int) -> float:
        return self._tm.phase_throughput(model, gpu_type, tp, layers, stages, self._role)

    def measured(self, model: ModelSpec, gpu_type: str, tp: int) -> bool:
        """Whether this phase's one-stage figure is a measurement (``measured_only`` keeps only
        those): a measured role profile, never an aggregated replica's."""
        measured_phase = getattr(self._tm, "measured_phase", None)
        return bool(measured_phase and measured_phase(model, gpu_type, tp, self._role))

    def measured_pipelines(self, model: ModelSpec, tp: int) -> list:
        """No measured pipeline figure is a phase's: pipelines are measured aggregated."""
        return []

    # what the simulated capacity's search (coral_solver.templates_sim) asks, for this phase
    def mean_throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                        stages: int) -> float:
        return self._tm.mean_phase_throughput(model, gpu_type, tp, layers, stages, self._role)

    def simulated_throughput(self, model: ModelSpec, template: Template, goal: float) -> float:
        return self._tm.simulated_phase_throughput(model, template, goal, self._role)


def roles_for(model: ModelSpec) -> tuple[Role, ...]:
    """The roles Stage 1 builds templates for under the model's disaggregation policy."""
    if model.disaggregation == "off":
        return ("both",)
    if model.disaggregation == "on":
        return PHASES
    if model.disaggregation == "auto":
        return ("both", *PHASES)
    raise ValueError(f"model {model.name}: disaggregation {model.disaggregation!r}: "
                     "expected 'auto', 'on' or 'off'")


def supports_phases(tm: object) -> TypeGuard[PhaseThroughputModel]:
    """Whether the throughput model can price prefill and decode apart."""
    return callable(getattr(tm, "phase_throughput", None)) and callable(
        getattr(tm, "kv_bytes_per_request", None))


def supports_phase_simulation(tm: object) -> bool:
    """Whether the throughput model can rate whole prefill-only and decode-only replicas by
    simulation (``Policy.capacity`` ``simulated``)."""
    return callable(getattr(tm, "mean_phase_throughput", None)) and callable(
        getattr(tm, "simulated_phase_throughput", None))


def phase_templates(tm: PhaseThroughputModel, model: ModelSpec,
                    gpu_types: Mapping[str, tuple[int, float]], policy: Policy,
                    role: Role, tps: Iterable[int] | None = None) -> list[Template]:
    """Every non-dominated ``role`` template of one model (exact best layout per multiset);
    dominance is decided among templates of the same role only. ``tps``: only these TP
    degrees (see :func:`coral_solver.templates.model_templates`). With ``policy.capacity``
    ``simulated`` each is rated by simulating its whole ``role`` replica
    (:mod:`coral_solver.simcap_roles`), as aggregated templates are."""
    from coral_solver.templates import model_templates  # here: templates imports this module

    if role not in PHASES:
        raise ValueError(f"role {role!r}: expected one of {PHASES}")
    if policy.capacity == "simulated" and not supports_phase_simulation(tm):
        raise ValueError(f"model {model.name}: policy capacity 'simulated' with disaggregation "
                         "needs a throughput model that simulates prefill and decode replicas "
                         "(coral_solver.templates.PerfThroughput)")
    kv = float(tm.kv_bytes_per_request(model))
    return [replace(t, role=role, kv_bytes_per_request=kv)
            for t in model_templates(_PhaseView(tm, role), model, gpu_types, policy, tps)]


def check_phase_template(t: Template, model: ModelSpec, tm, rel_tol: float,
                         policy: Policy | None = None) -> list[str]:
    """Every stage of a role template sustains its throughput in that role (the checker's
    counterpart of ``coral_solver.check._check_template`` for roles); with simulated capacity
    the whole ``role`` replica, simulated again, does (unless its figure is a measurement)."""
    view = _PhaseView(tm, t.role)
    if (policy is not None and policy.capacity == "simulated" and supports_phase_simulation(tm)
            and not (t.pp == 1 and view.measured(model, t.stages[0].gpu_type, t.tp))):
        speed = view.simulated_throughput(model, t, policy.slo_attainment)
        if speed < t.throughput * (1 - rel_tol):
            return [f"template {t.id}: the {t.role} replica simulated serves {speed:.4g} < "
                    f"{t.throughput:.4g} req/s within its SLO share"]
        return []
    out = []
    for stage in t.stages:
        speed = tm.phase_throughput(model, stage.gpu_type, t.tp, stage.layers, t.pp, t.role)
        if speed < t.throughput * (1 - rel_tol):
            out.append(f"template {t.id}: {t.role} stage {stage.gpu_type} with {stage.layers} "
                       f"layers sustains {speed:.4g} < {t.throughput:.4g} req/s")
    return out
