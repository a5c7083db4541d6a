"""Plots and the HTML page of a cost report built from the recorded sacct output."""

from __future__ import annotations

import base64
import re

import pytest

from coral_hpc.accounting.report import cost_series, render_html, write_cost_plot
from coral_hpc.store import ReplicaRecord
from tests.unit.test_accounting import recorded, report, t  # noqa: F401  (fixture)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_cost_series_adds_up_to_the_total(recorded):  # noqa: F811
    records, now = recorded
    rep = report(records, t("22:04:00"), t("22:06:00"), now)
    starts, series = cost_series(rep)
    assert starts and set(series) >= {"done", "cross", "rq", "het"}
    assert sum(sum(v) for v in series.values()) == pytest.approx(rep.to_dict()["total"]["cost"])


def test_plot_file_is_a_png(recorded, tmp_path):  # noqa: F811
    records, now = recorded
    path = write_cost_plot(report(records, t("22:04:00"), t("22:06:00"), now), tmp_path / "c.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_html_page_embeds_both_plots_and_the_tables(recorded):  # noqa: F811
    records, now = recorded
    rep = report(records, t("22:04:00"), t("22:06:00"), now)
    replica = ReplicaRecord(
        id="r1", model="done", template_id="tpl", layout=None, partitions=("v100",), throughput=1.0,
        cost_per_hour=2.0, created_at=t("22:04:49"), started_at=t("22:04:50"), ended_at=t("22:04:54"),
    )
    page = render_html(rep, [replica])
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 2
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    assert "<td>het</td>" in page and "<td>a100</td>" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched


def _replica(rid: str, model: str, start: str, end: str) -> ReplicaRecord:
    return ReplicaRecord(
        id=rid, model=model, template_id="tpl", layout=None, partitions=("v100",),
        throughput=1.0, cost_per_hour=2.0, created_at=t(start) - 1, started_at=t(start),
        ended_at=t(end),
    )


def _png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_allocation_draws_one_row_per_model_so_equal_counts_do_not_overlap(recorded):  # noqa: F811
    """Issue 29: three models each running one replica over the same minutes were three lines
    on top of each other in one plot. Each model has its own row now, named, with its own steps."""
    from coral_hpc.accounting.report import allocation_steps, draw_allocation_figure, figure_png

    records, now = recorded
    rep = report(records, t("22:04:00"), t("22:06:00"), now)
    same = [_replica(f"r{m}", m, "22:04:10", "22:05:00") for m in ("alpha", "beta", "gamma")]
    steps = allocation_steps(rep, same)
    assert list(steps) == ["alpha", "beta", "gamma"]
    assert all(counts == [0, 1, 0] for _, counts in steps.values())
    fig = draw_allocation_figure(rep, same)
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["alpha", "beta", "gamma"]
    assert all(len(ax.get_lines()) == 1 for ax in axes)   # one model per row
    figure_png(fig)

    one_model = render_html(rep, same[:1])
    three_models = render_html(rep, same)
    alloc = [re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)[1]
             for page in (one_model, three_models)]
    (w1, h1), (w3, h3) = (_png_size(base64.b64decode(a)) for a in alloc)
    assert w1 == w3 and h3 > h1 + 150        # rows added, not lines drawn over each other
    assert 'one row per model: alpha, beta, gamma"' in three_models


def _headers(page: str, after: str) -> list[str]:
    section = page[page.index(after):]
    first_row = section[section.index("<tr>"):section.index("</tr>")]
    return re.findall(r"<th[^>]*>([^<]*)</th>", first_row)


def test_html_tables_have_human_headers_with_the_deployments_cost_unit(recorded):  # noqa: F811
    """Issue 29: the headers were the JSON keys (gpu_hours, cost_per_million_tokens)."""
    from tests.unit.test_accounting import deployment

    records, now = recorded
    priced = render_html(report(records, t("22:04:00"), t("22:06:00"), now), [])
    assert _headers(priced, "<h2>By model</h2>") == [
        "Model", "GPU-hours", "Cost (price units)", "Prompt tokens", "Generated tokens",
        "Cost per million tokens (price units)"]
    assert _headers(priced, "<h2>By partition</h2>") == [
        "Partition", "GPU type", "GPU-hours", "Billing unit-hours", "Cost (price units)"]
    assert ">gpu_hours<" not in priced and ">cost_per_million_tokens<" not in priced
    assert "costs in price units (GPU-hours × the per-GPU-hour prices in models.yaml)" in priced
    billing = render_html(report(records, t("22:04:00"), t("22:06:00"), now,
                                 dep=deployment("billing")), [])
    assert _headers(billing, "<h2>By model</h2>")[2] == "Cost (billing unit-hours)"
    assert _headers(billing, "<h2>By model</h2>")[5] == (
        "Cost per million tokens (billing unit-hours)")
