"""coral-hpc's only seam with Slurm: the one package that runs Slurm commands or imports pyslurm.

Public API (see the modules for details)::

    client = make_client("auto")                     # or client_for_deployment(deployment)
    snap = client.snapshot("mydeployment")          # ClusterSnapshot: nodes, partitions, groups, own jobs, limits
    states = client.job_states(["123", "124"])      # batched: squeue, then sacct
    job_id = client.submit_script(path)             # hetjob batch scripts
    client.cancel_with_grace(["123"], grace_s=60)   # TERM first, scancel after the grace
    est = client.test_only(JobShape("a100", 2, "a100"))
    records = client.accounting("mydeployment", start, end)

Errors are typed (coral_hpc.slurm.errors): SlurmUnavailable/SlurmTimeout are TransientError,
SlurmRejected/SlurmJobNotFound/SlurmParseError/SlurmCommandError are PermanentError.
"""

from coral_hpc.slurm.cli_backend import CliSlurmClient
from coral_hpc.slurm.client import (
    BackendUnavailable,
    SlurmClient,
    client_for_deployment,
    make_client,
)
from coral_hpc.slurm.errors import (
    SlurmCommandError,
    SlurmError,
    SlurmJobNotFound,
    SlurmNotInstalled,
    SlurmParseError,
    SlurmRejected,
    SlurmTimeout,
    SlurmUnavailable,
)
from coral_hpc.slurm.runner import CommandRunner
from coral_hpc.slurm.snapshot import (
    AccountingRecord,
    ClusterSnapshot,
    JobComponent,
    JobInfo,
    JobShape,
    JobStatus,
    Limits,
    NodeGroupInfo,
    NodeInfo,
    PartitionInfo,
    StartEstimate,
)

__all__ = [
    "AccountingRecord", "BackendUnavailable", "CliSlurmClient", "ClusterSnapshot", "CommandRunner",
    "JobComponent", "JobInfo", "JobShape", "JobStatus", "Limits", "NodeGroupInfo", "NodeInfo",
    "PartitionInfo", "SlurmClient", "SlurmCommandError", "SlurmError", "SlurmJobNotFound",
    "SlurmNotInstalled", "SlurmParseError", "SlurmRejected", "SlurmTimeout", "SlurmUnavailable",
    "StartEstimate", "client_for_deployment", "make_client",
]
