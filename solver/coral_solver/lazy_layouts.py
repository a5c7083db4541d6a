"""Stage 1's best layout per node multiset, asking only the stage figures it needs.

:func:`coral_solver.templates.best_layouts` takes the whole table of stage throughputs: every GPU
type at every layer count from 1 to L - S + 1, one capacity search each (about 8,000 for
``examples/models.yaml``). Where the throughput model promises that a stage never serves more
for holding more layers (``monotone_in_layers``: :class:`coral_solver.throughput_model.
PerfThroughput`, whose capacity never rises when a step gets slower, and a stage with more
layers has a dearer step in every term: tests/unit/test_perf_monotone.py), each row of the table
is non-increasing from its first entry, and the best layout of a multiset can be found by
bisection over the layer counts of each of its own GPU types, asking each figure once
(:class:`LazyStageTable`). The answer is the one the whole table gives
(tests/unit/test_lazy_layouts.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class LazyStageTable:
    """``value(g, n)``: the throughput of a stage of GPU type index ``g`` holding ``n`` layers
    (1 ≤ n ≤ ``longest``), from ``figure(g, n)`` on first use (negative taken as 0). Each row
    must be non-increasing in ``n``."""

    def __init__(self, figure: Callable[[int, int], float], n_types: int, longest: int) -> None:
        self._figure = figure
        self.n_types = n_types
        self.longest = longest
        self._known: dict[tuple[int, int], float] = {}

    @property
    def asked(self) -> int:
        """How many figures were asked for so far."""
        return len(self._known)

    def value(self, g: int, held: int) -> float:
        """The figure of a stage of type index ``g`` holding ``held`` layers."""
        key = (g, held)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = max(float(self._figure(g, held)), 0.0)
        return found

    def most(self, g: int, target: float) -> int:
        """The most layers a stage of type ``g`` holds at ``target`` requests/s or more (0:
        not even one)."""
        if self.value(g, 1) < target:
            return 0
        lo, hi = 1, self.longest  # value(lo) >= target; the answer lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.value(g, mid) >= target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def best_layouts(self, counts: np.ndarray, layers: int) -> tuple[np.ndarray, np.ndarray]:
        """As :func:`coral_solver.templates.best_layouts` on the whole table: per multiset row
        of ``counts``, the best bottleneck throughput (0: no layout) and the most layers per
        stage type at it (0 for a type the row does not use)."""
        throughput = np.zeros(len(counts))
        per_type = np.zeros_like(counts)
        for row, n in enumerate(counts):
            used = [g for g in range(self.n_types) if n[g] > 0]
            best = max((self._best_of_type(g, n, used, layers) for g in used), default=0.0)
            if best > 0:
                throughput[row] = best
                for g in used:
                    per_type[row, g] = self.most(g, best)
        return throughput, per_type

    def _holds(self, target: float, n: np.ndarray, used: list[int], layers: int) -> bool:
        """Whether stages of the row ``n`` sustaining ``target`` hold all ``layers``, each at
        least one."""
        held = 0
        for g in used:
            most = self.most(g, target)
            if most < 1:
                return False
            held += int(n[g]) * most
        return held >= layers

    def _best_of_type(self, g: int, n: np.ndarray, used: list[int], layers: int) -> float:
        """The highest figure of type ``g`` at which the row holds the model (0: none). The
        figures fall as the layers held grow, so whether the row holds at ``value(g, n)`` only
        turns from no to yes: the least such ``n``, by bisection over the positive ones."""
        positive = self.most(g, np.nextafter(0.0, 1.0))
        if positive < 1 or not self._holds(self.value(g, positive), n, used, layers):
            return 0.0
        lo, hi = 1, positive  # the row holds at value(g, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._holds(self.value(g, mid), n, used, layers):
                hi = mid
            else:
                lo = mid + 1
        return self.value(g, lo)
