"""Start-up time behind the planner's penalty K, learnt from this deployment's own history.

K = start-up time ÷ re-plan interval (../shared/ARCHITECTURE.md, "Plan"): a new replica costs K
re-plan intervals of its price before it serves. The start-up time is the submit→READY time of
recent replicas (queue wait included: that is what a new replica really costs), the configured
``policy.startup_time_s`` until enough have been seen.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from coral_hpc.store import StartupObservation

#: Observations needed before the history replaces the configured value.
MIN_OBSERVATIONS = 3
#: The newest start-ups a walltime lead must cover (:func:`lead_startup_s`).
RECENT_FOR_LEAD = 5


def learned_startup_s(
    observations: Sequence[StartupObservation],
    configured_s: float,
    template_id: str | None = None,
    min_observations: int = MIN_OBSERVATIONS,
) -> float:
    """Median submit→READY seconds of ``observations`` (of ``template_id`` when it has enough of
    its own), else ``configured_s``. The median ignores the odd replica stuck behind someone
    else's job."""
    if template_id is not None:
        own = [o.seconds for o in observations if o.template_id == template_id]
        if len(own) >= min_observations:
            return float(statistics.median(own))
    seconds = [o.seconds for o in observations]
    if len(seconds) >= min_observations:
        return float(statistics.median(seconds))
    return float(configured_s)


def startup_penalty(startup_s: float, replan_interval_s: float) -> float:
    """K: start-up time in re-plan intervals."""
    if replan_interval_s <= 0:
        raise ValueError("replan_interval_s must be > 0")
    return startup_s / replan_interval_s


def lead_startup_s(
    observations: Sequence[StartupObservation],
    configured_s: float,
    recent: int = RECENT_FOR_LEAD,
) -> float:
    """Submit→READY seconds a walltime successor must be given: the slowest of the newest
    ``recent`` observations (``observations`` newest first, as the store returns them).

    Not the median: a successor starts while its predecessor and often other replacements
    still load or serve, and such start-ups are the slow ones (on the real engine on the local
    cluster: 135 s for two engines loading at once, more than 4 min for four). A lead that
    covers only the median start-up leaves the model a gap on every slow one. Until
    ``MIN_OBSERVATIONS`` are seen, the configured value counts too."""
    newest = [o.seconds for o in observations[:recent]]
    if len(observations) < MIN_OBSERVATIONS:
        return float(max([configured_s, *newest]))
    return float(max(newest))
