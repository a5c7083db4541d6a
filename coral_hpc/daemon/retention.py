"""The retention loop's step: prune the database, compact old demand intervals, and remove the
files ended replicas left on the shared filesystem — each after ``models.yaml``'s ``retention``
periods, measured on the daemon's clock (a fake one in tests)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from coral_hpc.config import Deployment
from coral_hpc.launch.cleanup import expired_entries, remove_entries
from coral_hpc.store import Store

log = logging.getLogger("coral_hpc.retention")
DAY_S = 86400.0


@dataclass
class RetentionStep:
    """One pass of retention. ``deployment`` is a getter: a SIGHUP reload may change the limits."""

    deployment: Callable[[], Deployment]
    store: Store
    clock: Callable[[], float]

    def __call__(self) -> dict[str, int]:
        deployment = self.deployment()
        retention = deployment.retention
        now = self.clock()
        live = [(r.id, r.job_id) for r in self.store.replicas(live_only=True)]
        files = remove_entries(expired_entries(
            deployment.state_path, live, now - retention.replica_files_days * DAY_S))
        compacted = self.store.compact_demand(now - retention.demand_compact_after_days * DAY_S)
        deleted = self.store.prune(events_before=now - retention.events_days * DAY_S,
                                   history_before=now - retention.history_days * DAY_S)
        summary = {"files": files, "demand_rows_compacted": compacted, **deleted}
        if any(summary.values()):
            log.info("retention: %s", ", ".join(f"{k} {v}" for k, v in summary.items() if v))
        return summary
