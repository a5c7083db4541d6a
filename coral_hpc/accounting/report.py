"""Plots of a :class:`CostReport` and the self-contained HTML page of ``coral-hpc report``.

matplotlib is the ``plot`` extra: it is imported inside the functions that draw, with the Agg
backend (no display on a login node), so ``coral-hpc cost`` without ``--plot`` never loads it.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from coral_hpc.accounting.cost import group
from coral_hpc.accounting.summary import CostReport
from coral_hpc.accounting.usage import even_bins, usage
from coral_hpc.errors import PermanentError
from coral_hpc.store import ReplicaRecord

#: Bins of the cost-over-time plot: about this many across the range, in whole minutes at least.
TARGET_BINS = 48


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PermanentError(
            "plots need matplotlib: pip install 'coral-hpc[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cost_series(report: CostReport) -> tuple[list[float], dict[str, list[float]]]:
    """Bin starts and, per model, the cost (or GPU-hours where nothing is priced) in each bin."""
    end = min(report.until, report.now)
    if end <= report.since:
        return [], {}
    width = max(60, int((end - report.since) / TARGET_BINS) // 60 * 60)
    edges = even_bins(report.since, end, width)
    pieces = usage(report.runs, report.since, end, report.now, edges)
    priced = any(report.pricing.cost(p) is not None for p in pieces)
    totals = group(pieces, report.pricing, lambda u: (u.run.model, u.bin_start))
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * (len(edges) - 1))
    index = {edge: i for i, edge in enumerate(edges[:-1])}
    for key, t in totals.items():
        model, bin_start = cast(tuple[str, float], key)  # the key made just above
        series[model][index[bin_start]] = (t.cost or 0.0) if priced else t.gpu_hours
    return list(edges[:-1]), dict(sorted(series.items()))


def _unit(report: CostReport) -> str:
    return "billing unit-hours" if report.price_unit == "billing" else "cost (price × GPU-hours)"


def cost_unit(price_unit: str) -> str:
    """What a cost figure is counted in: Slurm billing units × hours, or the currency of the
    per-GPU-hour prices in models.yaml (whatever it is: coral-hpc does not know it)."""
    return "billing unit-hours" if price_unit == "billing" else "price units"


def column_headers(price_unit: str) -> dict[str, str]:
    """Human headers, with units, of the HTML tables' keys (the ``--json`` names)."""
    unit = cost_unit(price_unit)
    return {
        "model": "Model",
        "partition": "Partition",
        "gpu_type": "GPU type",
        "gpu_hours": "GPU-hours",
        "billing_unit_hours": "Billing unit-hours",
        "cost": f"Cost ({unit})",
        "prompt_tokens": "Prompt tokens",
        "generated_tokens": "Generated tokens",
        "cost_per_million_tokens": f"Cost per million tokens ({unit})",
    }


def draw_cost_figure(report: CostReport) -> Any:
    """One figure: cost over time stacked by model (left), GPU-hours by partition (right)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    starts, series = cost_series(report)
    if series:
        # step="post" draws each bin up to the next point: repeat the last bin at the range end
        end = min(report.until, report.now)
        times = [datetime.fromtimestamp(s, report.tz) for s in [*starts, end]]
        values = [[*v, v[-1]] for v in series.values()]
        left.stackplot(times, *values, labels=list(series), step="post")
        left.legend(loc="upper left", fontsize="small")
        fig.autofmt_xdate()
    else:
        left.text(0.5, 0.5, "no usage in this range", ha="center", va="center")
    left.set_title(f"{report.deployment}: cost over time by model")
    left.set_ylabel(_unit(report))
    parts = report.by_partition()
    labels = [f"{p}\n{g}" for p, g in parts]
    right.bar(labels, [t.gpu_hours for t in parts.values()], color="tab:blue")
    right.set_title("GPU-hours by partition and GPU type")
    right.set_ylabel("GPU-hours")
    return fig


def allocation_steps(report: CostReport, replicas: Sequence[ReplicaRecord]
                     ) -> dict[str, tuple[list[float], list[int]]]:
    """Per model, the times its running-replica count changed and the count from then on
    (starting at the range's start with 0), from the daemon's replica history."""
    end = min(report.until, report.now)
    by_model: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in replicas:
        if r.started_at is None:
            continue
        stop = r.ended_at if r.ended_at is not None else end
        if stop <= report.since or r.started_at >= end:
            continue
        by_model[r.model].append((max(r.started_at, report.since), +1))
        if stop < end:  # still running at the range's end: no drop drawn there
            by_model[r.model].append((stop, -1))
    steps: dict[str, tuple[list[float], list[int]]] = {}
    for model, changes in sorted(by_model.items()):
        changes.sort()
        times, counts, running = [float(report.since)], [0], 0
        for when, step in changes:
            running += step
            times.append(when)
            counts.append(running)
        steps[model] = (times, counts)
    return steps


#: Height of one model's row in the allocation figure, and of its title and time axis.
ALLOCATION_ROW_IN = 1.1
ALLOCATION_FRAME_IN = 1.4


def draw_allocation_figure(report: CostReport, replicas: Sequence[ReplicaRecord]) -> Any:
    """Replicas running over time, one row per model on a shared time axis: several models
    with the same count would draw on top of each other in one plot (issue 29)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    steps = allocation_steps(report, replicas)
    rows = max(1, len(steps))
    fig, axes = plt.subplots(rows, 1, sharex=True, squeeze=False, constrained_layout=True,
                             figsize=(12, ALLOCATION_FRAME_IN + ALLOCATION_ROW_IN * rows))
    axes = [a[0] for a in axes]
    end = min(report.until, report.now)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (ax, (model, (times, counts))) in enumerate(zip(axes, steps.items())):
        when = [datetime.fromtimestamp(t, report.tz) for t in [*times, end]]
        values = [*counts, counts[-1]]
        color = colors[i % len(colors)]
        ax.step(when, values, where="post", label=model, color=color)
        ax.fill_between(when, values, step="post", alpha=0.25, color=color)
        ax.set_ylim(0, max(values) + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(model, rotation=0, ha="right", va="center")
        ax.grid(axis="y", alpha=0.3)
    if steps:
        fig.autofmt_xdate()
    else:
        axes[0].text(0.5, 0.5, "no replica history in this range", ha="center", va="center",
                     transform=axes[0].transAxes)
    axes[0].set_title("Replicas running per model (daemon history), one row per model")
    fig.supylabel("replicas")
    return fig


def figure_png(fig: Any) -> bytes:
    """PNG bytes of a figure (and close it: pyplot keeps figures alive otherwise)."""
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def write_cost_plot(report: CostReport, path: str | Path) -> Path:
    """Write the cost figure as a PNG file at ``path``."""
    target = Path(path)
    target.write_bytes(figure_png(draw_cost_figure(report)))
    return target


def render_html(report: CostReport, replicas: Sequence[ReplicaRecord]) -> str:
    """A small self-contained HTML page: the figures embedded as base64 PNG, and the tables."""
    data = report.to_dict()
    cost_png = base64.b64encode(figure_png(draw_cost_figure(report))).decode("ascii")
    alloc_png = base64.b64encode(figure_png(draw_allocation_figure(report, replicas))).decode("ascii")
    esc = html.escape
    headers = column_headers(report.price_unit)

    def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
        head = "".join(f'<th title="{esc(c)}">{esc(headers.get(c, c))}</th>' for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(_fmt(r.get(c)))}</td>" for c in columns) + "</tr>"
            for r in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    comparison = data["plan_comparison"]
    compare_html = (
        "<p>No plan history in this range.</p>"
        if comparison is None
        else table(
            [{"": k, "cost": v} for k, v in (
                ("predicted by plans", comparison["predicted_cost"]),
                ("booked by Slurm", comparison["booked_cost"]),
                ("difference", comparison["difference"]),
                *(("… pending", comparison["parts"]["pending"]),
                  ("… start-up during rotation", comparison["parts"]["startup"]),
                  ("… overlap during rotation", comparison["parts"]["overlap"]),
                  ("… other", comparison["parts"]["other"])),
            )],
            ["", "cost"],
        )
    )
    warnings = "".join(f"<li>{esc(w)}</li>" for w in data["warnings"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>coral-hpc cost report: {esc(report.deployment)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }} table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>{esc(report.deployment)}: cost from Slurm accounting</h1>
<p>{esc(data['since'])} to {esc(data['until'])} (now {esc(data['now'])}); costs in {esc(cost_unit(report.price_unit))} ({esc(_unit_meaning(report.price_unit))}).
Total {esc(_fmt(data['total']['gpu_hours']))} GPU-hours, cost {esc(_fmt(data['total']['cost']))}.</p>
{f'<ul class="warnings">{warnings}</ul>' if warnings else ''}
<h2>Cost over time and GPU-hours by partition</h2>
<img alt="cost over time by model; GPU-hours by partition" src="data:image/png;base64,{cost_png}">
<h2>Allocation over time</h2>
<img alt="replicas running over time, one row per model: {esc(', '.join(allocation_steps(report, replicas)))}" src="data:image/png;base64,{alloc_png}">
<h2>By model</h2>
{table(data['models'], ['model', 'gpu_hours', 'cost', 'prompt_tokens', 'generated_tokens', 'cost_per_million_tokens'])}
<h2>By partition</h2>
{table(data['partitions'], ['partition', 'gpu_type', 'gpu_hours', 'billing_unit_hours', 'cost'])}
<h2>Plans against Slurm's books</h2>
{compare_html}
</body></html>
"""


def write_html(report: CostReport, replicas: Sequence[ReplicaRecord], path: str | Path) -> Path:
    """Write :func:`render_html` to ``path``."""
    target = Path(path)
    target.write_text(render_html(report, replicas), encoding="utf-8")
    return target


def _unit_meaning(price_unit: str) -> str:
    if price_unit == "billing":
        return "price: billing — Slurm's billing units of each job's shape × hours"
    return "GPU-hours × the per-GPU-hour prices in models.yaml"


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
