"""Read the gateway's demand counters (``/internal/demand``) and store per-interval deltas.

The gateway keeps cumulative totals per model and per API key; the daemon stores what changed
since its last scrape (:class:`coral_hpc.store.DemandInterval`), for ``demand: auto`` and cost per
token. Every configured model gets a row each interval, zeros included, so a model whose traffic
stopped decays towards zero. A total that went down means the gateway restarted: its new total
is the delta. Per-key rows use the model ``*`` (the gateway counts keys across models).

The arrivals per short window the gateway kept (``policy.plan_for: pNN``) are not stored: the
gateway sends every window of the span a percentile covers at each scrape, so the newest
snapshot's windows are all the daemon needs, and a restarted daemon has them at its first scrape.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from coral_hpc.demand import ArrivalWindows
from coral_hpc.gateway.tls import loopback_client_context
from coral_hpc.store import DemandInterval

#: Model name of per-API-key rows.
ALL_MODELS = "*"
_FIELDS = ("requests_total", "prompt_tokens_total", "generated_tokens_total", "rejected_total")


def fetch_demand(base_url: str, timeout: float = 5.0,
                 tls_cert: str | Path | None = None,
                 key: str | None = None) -> dict[str, Any]:
    """GET ``base_url/internal/demand`` (the daemon runs on the gateway's host: loopback) with
    ``key`` as its bearer token: the gateway asks for a key on loopback too, and the daemon
    holds the internal one (:func:`read_internal_key`). A TLS gateway is trusted through its
    own certificate, ``tls_cert`` (the daemon dials 127.0.0.1, a name the site's certificate
    does not carry)."""
    context = loopback_client_context(Path(tls_cert)) if tls_cert else None
    request = urllib.request.Request(f"{base_url.rstrip('/')}/internal/demand")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=timeout, context=context) as r:
        return json.loads(r.read().decode("utf-8"))


def read_internal_key(path: Path) -> str | None:
    """The daemon's internal key from ``path`` (mode 0600 in the state folder), or None when
    the file is missing or empty."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


class DemandScraper:
    """Turns successive counter snapshots into intervals."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[int, ...]] = {}
        self._last_time: float | None = None
        #: the newest snapshot's arrivals per window, by model
        self.windows: dict[str, ArrivalWindows] = {}

    def windows_at(self, now: float, span_s: float) -> dict[str, ArrivalWindows]:
        """The newest snapshot's windows that ended less than ``span_s`` before ``now``: a
        gateway that stopped answering leaves windows that age out rather than stand for
        today."""
        out = {}
        for model, found in self.windows.items():
            fresh = sum(1 for k in range(len(found.counts))
                        if found.end - k * found.window_s > now - span_s)
            out[model] = ArrivalWindows(found.window_s,
                                        found.counts[len(found.counts) - fresh:], found.end)
        return out

    def _read_windows(self, snapshot: dict[str, Any]) -> None:
        window_s, end = snapshot.get("window_s"), snapshot.get("windows_end")
        if not isinstance(window_s, (int, float)) or window_s <= 0 or not isinstance(
                end, (int, float)):
            self.windows = {}  # a gateway from before windows were counted
            return
        self.windows = {
            model: ArrivalWindows(float(window_s),
                                  tuple(int(c) for c in data.get("arrival_windows") or ()),
                                  float(end))
            for model, data in (snapshot.get("models") or {}).items()}

    def intervals(
        self, snapshot: dict[str, Any], now: float, models: Iterable[str]
    ) -> list[DemandInterval]:
        """Deltas since the previous call; the first call only sets the baseline. Keeps the
        snapshot's arrivals per window in :attr:`windows`."""
        self._read_windows(snapshot)
        current: dict[tuple[str, str], tuple[int, ...]] = {}
        for model, data in (snapshot.get("models") or {}).items():
            current[(model, "")] = tuple(int(data.get(f) or 0) for f in _FIELDS)
        for key, data in (snapshot.get("keys") or {}).items():
            current[(ALL_MODELS, key)] = tuple(int(data.get(f) or 0) for f in _FIELDS)
        for model in models:
            current.setdefault((model, ""), (0, 0, 0, 0))
        start, self._last_time = self._last_time, now
        previous, self._last = self._last, current
        if start is None or now <= start:
            return []
        out = []
        for (model, key), totals in sorted(current.items()):
            before = previous.get((model, key), (0, 0, 0, 0))
            # a total that went down: the gateway restarted and counts from zero
            delta = totals if any(t < b for t, b in zip(totals, before)) else tuple(
                t - b for t, b in zip(totals, before))
            out.append(DemandInterval(start, now, model, delta[0], delta[1], delta[2], delta[3],
                                      api_key=key))
        return out
