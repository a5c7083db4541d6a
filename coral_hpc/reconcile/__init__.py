"""The reconcile loop: observe → decide → diff → act.

- :mod:`.status` — ``replica_status(facts, now)``: the one function that derives a replica's state.
- :mod:`.decide` — ``decide(plan, replicas, now, …)``: pure; returns Submit/Drain/Cancel/… actions
  (make-before-break, scale-down drains then cancels, nothing destructive on stale data).
  One function per rule: :mod:`.match` (rule 4, slots), :mod:`.surplus` (rule 5,
  make-before-break); :mod:`.actions` holds the values it reads and returns, :mod:`.serving`
  the shared rule of which replicas go on serving.
- :mod:`.hysteresis` — ``PlanHistory``: plans in a row without a slot (READY replicas stay put).
- :mod:`.triggers` — ``replan_triggers(…)``: when the plan is out of date, and why (typed kinds).
- :mod:`.startup`, :mod:`.backoff` — learnt start-up time (K) and backoff on transient errors.
"""

from coral_hpc.reconcile.backoff import Backoff
from coral_hpc.reconcile.decide import (
    Action,
    Cancel,
    Decision,
    DesiredPlan,
    Drain,
    Exclude,
    Forget,
    Keep,
    Observation,
    Slot,
    Submit,
    decide,
    goes_on_serving,
)
from coral_hpc.reconcile.hysteresis import PlanHistory
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import ReplicaFacts, ReplicaState, ReplicaStatus, replica_status
from coral_hpc.reconcile.triggers import Trigger, TriggerKind, replan_triggers

__all__ = [
    "Action",
    "Backoff",
    "Cancel",
    "Decision",
    "DesiredPlan",
    "Drain",
    "Exclude",
    "Forget",
    "Keep",
    "Observation",
    "PlanHistory",
    "ReconcileSettings",
    "ReplicaFacts",
    "ReplicaState",
    "ReplicaStatus",
    "Slot",
    "Submit",
    "Trigger",
    "TriggerKind",
    "decide",
    "goes_on_serving",
    "replan_triggers",
    "replica_status",
]
