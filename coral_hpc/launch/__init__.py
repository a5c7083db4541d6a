"""Replica jobs: the spec of one replica, submission (submitit, or sbatch for heterogeneous
jobs), template rendering, the job-side entrypoint that starts the engine, and stopping.

For the daemon::

    spec = replica_spec(deployment, model, replica_id, template_id, slot.layout,
                        api_key_file=KEY_FILE)          # the plan row's ReplicaLayout
    job_id = submit_replica(spec, slurm_client)         # submitit, or a hetjob via the client
    endpoint = read_endpoint(spec.endpoint_file)         # None until the engine answers /health
    stop_replicas(slurm_client, [job_id], grace_s=60)    # SIGTERM to the steps, then scancel
"""

from coral_hpc.launch.endpoint import Endpoint, read_endpoint
from coral_hpc.launch.spec import ReplicaSpec, SpecError, StageSpec, replica_spec
from coral_hpc.launch.stop import stop_replicas
from coral_hpc.launch.submit import submit_replica

__all__ = [
    "Endpoint", "ReplicaSpec", "SpecError", "StageSpec", "read_endpoint",
    "replica_spec", "stop_replicas", "submit_replica",
]  # fmt: skip
