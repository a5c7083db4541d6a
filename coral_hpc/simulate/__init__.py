"""``coral-hpc simulate``: the daemon's loop driven in virtual time against a saved cluster
snapshot and simulated replicas, on a replayed trace.

- :mod:`.traces` — read the Azure LLM CSV and the Mooncake JSONL; a model's requests drawn from
  a trace at its declared rate, lengths kept.
- :mod:`.serve` — a model's requests routed to a plan's replicas and served by the sim engine's
  scheduler in virtual time (:mod:`coral_replica_sim.replica`).
- :mod:`.run` — the loop: the gateway's counters, the daemon's demand and re-plan rule
  (:func:`coral_hpc.reconcile.replan_triggers`), the same :class:`~coral_hpc.plan.planner.Planner`,
  cost, GPU-hours and SLO attainment.
"""
