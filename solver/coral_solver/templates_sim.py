"""Stage 1 with simulated capacity (``Policy.capacity`` ``simulated``): each candidate template
rated by simulating its whole replica (:mod:`coral_solver.simcap`).

Simulating every node multiset would cost seconds each, so the search keeps the exact layout
search of :func:`coral_solver.templates.searched_templates` and changes what it ranks by:

1. **Layouts and candidates on means.** Every node multiset gets its best layer split from
   per-stage figures that ask only the *mean* step to meet TPOT/S and the mean prompt path
   TTFT/S (:func:`coral_solver.perf.mean_stage_throughput`: no tail, no KV queue). Those are
   optimistic, so a pipeline the tail model rates 0 (a TTFT split evenly over its stages is too
   little for any one of them) still gets a layout and a chance.
2. **Only candidates that could still be undominated are simulated.** Candidates go cheapest
   first (fewest GPUs, then the higher mean figure). One is skipped when a template already
   simulated uses no more of every configuration and its *simulated* figure is at least the
   candidate's *mean* figure: taking the mean figure as an upper bound of the simulated one,
   the candidate would be dominated. That bound is an assumption, checked, not proven: on the
   paper's core setup no template simulated above its mean figure (bench/capacity.py).
3. **Each survivor simulated**, memoised by (architecture, TP, stage GPU types and layers, SLO,
   length distribution, goal), so models alike in those share the work; a one-stage template
   whose figure is a measurement (``coral-hpc profile``) keeps the measurement. Templates the
   simulation rates 0 are dropped and dominance is applied once more on the simulated figures
   (:func:`coral_solver.templates.model_templates`).

Prefill-only and decode-only templates go through the same search: :mod:`coral_solver.roles`
hands it a view of the throughput model answering for the role (its mean-only figure,
:func:`coral_solver.perf_roles.mean_phase_throughput`, its simulation,
:mod:`coral_solver.simcap_roles`, and its measured role profile).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from coral_solver.templates import ThroughputModel, searched_templates
from coral_solver.types import Config, ModelSpec, Policy, Template


class _MeanView:
    """The throughput model as the candidate search sees it: ``throughput`` answers on means."""

    def __init__(self, tm: ThroughputModel) -> None:
        self._tm = tm

    def __getattr__(self, name: str):
        return getattr(self._tm, name)

    def throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                   stages: int) -> float:
        return float(self._tm.mean_throughput(  # type: ignore[attr-defined]
            model, gpu_type, tp, layers, stages))


def supports_simulation(tm: object) -> bool:
    """Whether the throughput model can rate whole templates by simulation."""
    return hasattr(tm, "mean_throughput") and hasattr(tm, "simulated_throughput")


def simulated_templates(tm: ThroughputModel, model: ModelSpec,
                        gpu_types: Mapping[str, tuple[int, float]], policy: Policy,
                        tps: Iterable[int] | None = None) -> list[Template]:
    """The model's candidate templates (module docstring, steps 1-3), each with its simulated
    throughput; dominated ones may remain (the caller drops them)."""
    if not supports_simulation(tm):
        raise ValueError(f"model {model.name}: policy capacity 'simulated' needs a throughput "
                         "model that simulates replicas (coral_solver.templates.PerfThroughput)")
    candidates = searched_templates(_MeanView(tm), model, gpu_types, policy, tps)
    candidates.sort(key=lambda t: (t.tp * t.pp, -t.throughput))
    measured = getattr(tm, "measured", None)
    rated: list[tuple[dict[Config, int], Template]] = []
    for template in candidates:
        usage = template.usage()
        if any(done.throughput >= template.throughput
               and all(n <= usage.get(config, 0) for config, n in used.items())
               for used, done in rated):
            continue  # dominated even if it served its mean figure
        stage = template.stages[0]
        if template.pp == 1 and measured is not None and measured(model, stage.gpu_type,
                                                                  template.tp):
            rate = tm.throughput(model, stage.gpu_type, template.tp, stage.layers, 1)
        else:
            rate = tm.simulated_throughput(  # type: ignore[attr-defined]
                model, template, policy.slo_attainment)
        if rate > 0:
            rated.append((usage, replace(template, throughput=float(rate))))
    return [t for _, t in rated]

