"""``coral-hpc simulate --plot``: a PNG like ``coral-hpc cost --plot`` — replicas per model over
the run (left) and GPU-hours by partition (right)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coral_hpc.accounting.report import _pyplot, figure_png
from coral_hpc.simulate.run import SimulationResult, replica_steps


def draw_simulation_figure(result: SimulationResult) -> Any:
    """One figure: replicas per model over time (left), GPU-hours per partition (right)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    times, series = replica_steps(result)
    if times:
        for name, values in series.items():
            left.step(times, values, where="post", label=name)
        left.legend(loc="upper left", fontsize="small")
        left.set_ylim(bottom=0, top=max(max(v) for v in series.values()) + 1)
        left.yaxis.get_major_locator().set_params(integer=True)
    else:
        left.text(0.5, 0.5, "no plan was accepted", ha="center", va="center")
    unit = "billing units" if result.unit == "billing" else "cost"
    left.set_title(f"replicas per model; {result.cost:.2f} {unit} over "
                   f"{result.span_s / 3600:.2f} h")
    left.set_xlabel("hours of the trace")
    left.set_ylabel("replicas")
    parts = sorted(result.gpu_hours_by_partition.items())
    right.bar([p for p, _ in parts], [v for _, v in parts], color="tab:blue")
    right.set_title("GPU-hours by partition")
    right.set_ylabel("GPU-hours")
    return fig


def write_simulation_plot(result: SimulationResult, path: str | Path) -> Path:
    """Write the simulation figure as a PNG file at ``path``."""
    target = Path(path)
    target.write_bytes(figure_png(draw_simulation_figure(result)))
    return target
