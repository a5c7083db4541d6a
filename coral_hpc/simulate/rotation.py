"""What walltime rotation adds to a replica's cost: the daemon keeps a replica until its
successor is READY, so once per usable life the two overlap for the successor's start-up and
the predecessor's drain grace."""

from __future__ import annotations

from coral_hpc.config import Deployment
from coral_hpc.reconcile.settings import ReconcileSettings


def rotation_overhead(deployment: Deployment) -> float:
    """Fraction of a replica's cost that walltime rotation adds: (start-up + drain grace) over
    the usable life (time limit − Slurm's signal lead − the policy's walltime lead + start-up).

    Raises ValueError when the time limit leaves no usable life."""
    policy, cluster = deployment.policy, deployment.cluster
    settings = ReconcileSettings.from_policy(policy)
    life = (cluster.time_limit_s - settings.walltime_signal_s - policy.walltime_lead_s
            + policy.startup_time_s)
    if life <= 0:
        raise ValueError(f"cluster.time_limit ({cluster.time_limit_s:g} s) leaves no usable "
                         "life after the signal and walltime leads")
    return (policy.startup_time_s + settings.drain_grace_s) / life
