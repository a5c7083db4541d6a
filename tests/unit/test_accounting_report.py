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
