"""Plan history for the decide step's hysteresis on READY replicas.

The rule (decide, rule 4): a READY replica whose slot — template on partitions — the current
plan does not name keeps serving *in place of* a missing replica of its model and role, so no
successor is submitted and nothing is drained, unless

* its slot has been absent from ``replace_after_plans`` consecutive plans (the plan really
  moved), or
* the plan's slot is cheaper per request/s by at least ``replace_margin`` (moving pays), or
* it sustains fewer requests/s than the slot it would stand in for (the plan needs more).

So a plan that alternates between two layouts every cycle never replaces a READY replica; one
that keeps choosing another layout replaces it, make-before-break, from its K-th plan on.

:class:`PlanHistory` counts, for each slot key, the consecutive plans that did not name it.
Pure: the daemon feeds it every plan it adopts. A restarted daemon counts afresh from its first
plan, so a replica it adopted gets the same K plans' grace. The keys are the deployment's
templates on their partitions: a few hundred at most, kept for the daemon's life.
"""

from __future__ import annotations

from coral_hpc.plan.desired import DesiredPlan

SlotKey = tuple[str, tuple[str, ...]]


class PlanHistory:
    """How many plans in a row, up to the latest, did not name a slot key."""

    def __init__(self) -> None:
        self._plans = 0                       # plans observed
        self._last_named: dict[SlotKey, int] = {}

    @property
    def plans(self) -> int:
        """Plans observed so far."""
        return self._plans

    def observe(self, plan: DesiredPlan) -> None:
        """Count a newly adopted ``plan`` (call once per plan, not per cycle)."""
        self._plans += 1
        for slot in plan.slots:
            self._last_named[slot.key] = self._plans

    def absent_for(self, key: SlotKey) -> int:
        """Consecutive plans, ending with the latest, that did not name ``key``. A key never
        named counts from when this history started."""
        return self._plans - self._last_named.get(key, 0)
