"""The client protocol every backend implements, and :func:`make_client`, which picks one.

``slurm.backend`` in models.yaml: ``cli`` (Slurm's commands, every site has them), ``pyslurm``
(the Python binding; must match the cluster's Slurm major version), or ``auto`` (pyslurm when it
imports and matches, else the CLI).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from coral_hpc.errors import PermanentError
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.cli_backend import CliSlurmClient
from coral_hpc.slurm.runner import CommandRunner
from coral_hpc.slurm.snapshot import (
    AccountingRecord,
    ClusterSnapshot,
    JobInfo,
    JobShape,
    JobStatus,
    Limits,
    StartEstimate,
)


@runtime_checkable
class SlurmClient(Protocol):
    """What the rest of coral-hpc may ask of Slurm. Every method raises
    :class:`~coral_hpc.errors.TransientError` (retry later) or
    :class:`~coral_hpc.errors.PermanentError` (surface) — never returns an empty answer for a
    failed observation."""

    backend: str

    def version(self) -> str:
        """Slurm's version, e.g. ``"22.05.8"``."""
        ...

    def snapshot(self, deployment: str) -> ClusterSnapshot:
        """One observe cycle: nodes, partitions, node groups, own jobs, limits."""
        ...

    def jobs(self) -> list[JobInfo]:
        """All of this user's jobs Slurm still holds (every deployment; tags parsed)."""
        ...

    def limits(self) -> Limits:
        """Association and QOS limits (cached with a TTL)."""
        ...

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Batched state of the given jobs (squeue, then sacct for finished ones)."""
        ...

    def accounting(self, deployment: str, start: float, end: float) -> list[AccountingRecord]:
        """This deployment's allocations in ``[start, end]`` from sacct."""
        ...

    def test_only(self, shape: JobShape) -> StartEstimate:
        """When a job of ``shape`` would start (``sbatch --test-only``)."""
        ...

    def submit_script(self, path: str | Path, extra_env: Mapping[str, str] | None = None) -> str:
        """sbatch a batch script; the job id."""
        ...

    def cancel(self, job_ids: Iterable[str], signal: str | None = None, *, full: bool = True) -> None:
        """scancel, or signal, the jobs."""
        ...

    def cancel_with_grace(
        self, job_ids: Iterable[str], grace_s: float, signal: str = "TERM", poll_s: float = 1.0,
        *, full: bool = True,
    ) -> dict[str, str]:
        """Signal, wait up to ``grace_s``, then cancel what is left."""
        ...


class BackendUnavailable(PermanentError):
    """``slurm.backend: pyslurm`` was asked for but pyslurm cannot be used here."""


def make_client(
    backend: str = "auto",
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    account: str | None = None,
    qos: str | None = None,
    user: str | None = None,
    gpu_type_map: Mapping[str, str] | None = None,
    budget: CallBudget | None = None,
) -> SlurmClient:
    """The client for ``backend`` (``auto | cli | pyslurm``). ``auto`` takes pyslurm only when it
    imports and its major version matches the cluster's (asked through ``sinfo --version``);
    ``pyslurm`` raises :class:`BackendUnavailable` with the reason when it cannot be used.
    Every Slurm call is charged to ``budget`` when one is given (``coral_hpc.slurm.budget``)."""
    cli = CliSlurmClient(CommandRunner(env=env, timeout_s=timeout_s, budget=budget),
                         account=account, qos=qos, user=user, gpu_type_map=gpu_type_map)
    if backend == "cli":
        return cli
    if backend not in ("auto", "pyslurm"):
        raise ValueError(f"slurm.backend must be auto, cli or pyslurm, not {backend!r}")
    from coral_hpc.slurm.pyslurm_backend import PyslurmClient, pyslurm_unusable_reason

    reason = pyslurm_unusable_reason(cli.version, env)
    if reason is None:
        return PyslurmClient(cli)
    if backend == "pyslurm":
        raise BackendUnavailable(f"slurm.backend is pyslurm but {reason}; use 'auto' or 'cli'")
    return cli


def client_for_deployment(deployment: Any, env: Mapping[str, str] | None = None,
                          *, budgeted: bool = False) -> SlurmClient:
    """:func:`make_client` configured from a :class:`coral_hpc.config.Deployment`; with
    ``budgeted`` (the daemon), its calls are charged to a :class:`CallBudget` of
    :func:`coral_hpc.config.slurm_calls_per_min` (the client's ``runner.budget``)."""
    from coral_hpc.config import slurm_calls_per_min

    cluster = deployment.cluster
    budget = (CallBudget(slurm_calls_per_min(deployment),
                         probe_calls_per_min=cluster.slurm.probe_calls_per_min)
              if budgeted else None)
    return make_client(
        cluster.slurm.backend,
        env=env,
        timeout_s=cluster.slurm.command_timeout_s,
        account=cluster.account,
        qos=cluster.qos,
        gpu_type_map=cluster.gpu_type_map,
        budget=budget,
    )


def call_budget(client: object) -> CallBudget | None:
    """The :class:`CallBudget` ``client``'s commands are charged to, if any (the CLI client's
    runner's; the pyslurm client's CLI client's)."""
    runner = getattr(client, "runner", None) or getattr(getattr(client, "cli", None), "runner", None)
    return getattr(runner, "budget", None)
