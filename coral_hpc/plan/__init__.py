"""The one planner: deployment + Slurm snapshot + demand → solver inputs → Stage 1 → Stage 2 →
independent check → the plan the daemon acts on (ARCHITECTURE.md, "Layers").

Both ``coral-hpc serve`` and ``coral-hpc plan`` plan through :class:`planner.Planner`
(:class:`planner.PlanRequest` in, :class:`planner.PlanOutcome` out); no other package plans.

- :mod:`.inputs` — the solver's models, cluster (available GPUs, partitions, prices, quotas,
  the replicas that go on serving and the GPUs they hold) and policy;
- :mod:`.planner` — the request, the outcome and the planner itself;
- :mod:`.layout` — a plan row's :class:`~coral_hpc.types.ReplicaLayout` (dtype derived here);
- :mod:`.desired` — the plan as slots the decide step matches replicas against (pure data: the
  decide step imports it without importing the solver);
- :mod:`.report` — the ``coral-hpc plan --json`` and ``--export-templates`` documents;
- :mod:`.availability` — what a busy cluster gives soon: Slurm's start estimates per job shape,
  site limits, preemptible partitions;
- :mod:`.capacity` — the most replicas the whole cluster could ever hold (``min_replicas``
  refused);
- :mod:`.reservations` — reservations the account may use, as capacity Stage 2 plans on;
- :mod:`.figures` — which figures a plan rests on: measured profiles or the analytic model.

This file imports nothing, so the decide step can read :mod:`.desired` without the solver.
"""
