"""The CLI backend: every site has sinfo/squeue/scontrol/sacct/sbatch/scancel/sacctmgr.

One observe cycle (:meth:`CliSlurmClient.snapshot`) runs exactly one command per kind:
``scontrol show node``, ``scontrol show partition``, ``squeue`` (own user, all states, with the
expected start of pending jobs) — plus ``sacctmgr`` only when the cached limits are older than
their TTL, and ``sinfo --version`` once per client.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from coral_hpc.slurm.build import build_snapshot, gpu_memory_lookup
from coral_hpc.slurm.errors import SlurmJobNotFound
from coral_hpc.slurm.parse_jobs import (
    SACCT_FORMAT,
    SQUEUE_FORMAT,
    RowCache,
    parse_sacct_accounting,
    parse_sacct_states,
    parse_sbatch_parsable,
    parse_squeue,
    parse_test_only,
    parse_version,
    version_tuple,
)
from coral_hpc.slurm.parse_limits import (
    ASSOC_FIELDS,
    QOS_FIELDS,
    build_limits,
    parse_assoc,
    parse_qos,
    qos_limits,
)
from coral_hpc.slurm.parse_nodes import (
    parse_nodes_json,
    parse_nodes_text,
    parse_partitions_json,
    parse_partitions_text,
)
from coral_hpc.slurm.parse_reservations import parse_reservations
from coral_hpc.slurm.runner import CommandRunner
from coral_hpc.slurm.snapshot import (
    FINISHED_JOB_STATES,
    AccountingRecord,
    ClusterSnapshot,
    JobInfo,
    JobShape,
    JobStatus,
    Limits,
    StartEstimate,
)

#: ``scontrol --json`` exists from Slurm 23.02.
_JSON_SCONTROL = (23, 2)


def _slurm_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


class CliSlurmClient:
    """:class:`~coral_hpc.slurm.client.SlurmClient` over Slurm's command-line tools."""

    backend = "cli"

    def __init__(
        self,
        runner: CommandRunner | None = None,
        *,
        user: str | None = None,
        account: str | None = None,
        qos: str | None = None,
        limits_ttl_s: float = 300.0,
        gpu_memory: Callable[[str], float | None] = gpu_memory_lookup,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        gpu_type_map: Mapping[str, str] | None = None,
    ):
        self.runner = runner or CommandRunner()
        self.user = user or getpass.getuser()
        self.account = account
        self.qos = qos
        self.limits_ttl_s = limits_ttl_s
        self.gpu_memory = gpu_memory
        self.clock = clock
        self.sleep = sleep
        self._version: str | None = None
        self._limits: Limits | None = None
        self.gpu_type_map = dict(gpu_type_map or {})
        # partition QOS limits and usable reservations change as rarely as the account's limits
        self._partition_qos: tuple[float, dict[str, Limits]] | None = None
        self._reservations: tuple[float, tuple] | None = None
        # squeue lines unchanged since the last cycle are not parsed again
        self._squeue_rows = RowCache()

    # ----------------------------------------------------------------------------- observe

    def version(self) -> str:
        """The Slurm version (``"22.05.8"``), asked once per client."""
        if self._version is None:
            self._version = parse_version(self.runner.run(["sinfo", "--version"]).stdout)
        return self._version

    def _json_scontrol(self) -> bool:
        return version_tuple(self.version()) >= _JSON_SCONTROL

    def snapshot(self, deployment: str) -> ClusterSnapshot:
        """Nodes, partitions, node groups, this deployment's jobs and the account limits, as of
        the moment the first command was sent (``observed_at``)."""
        version = self.version()
        observed_at = self.clock()
        if self._json_scontrol():
            raw_nodes = parse_nodes_json(self.runner.run(["scontrol", "show", "node", "--json"]).stdout)
            raw_parts = parse_partitions_json(
                self.runner.run(["scontrol", "show", "partition", "--json"]).stdout
            )
        else:
            raw_nodes = parse_nodes_text(self.runner.run(["scontrol", "show", "node", "-o"]).stdout)
            raw_parts = parse_partitions_text(self.runner.run(["scontrol", "show", "partition", "-o"]).stdout)
        jobs = self.jobs()
        snap = build_snapshot(
            slurm_version=version,
            observed_at=observed_at,
            deployment=deployment,
            backend=self.backend,
            raw_nodes=raw_nodes,
            raw_partitions=raw_parts,
            jobs=jobs,
            limits=self.limits(),
            gpu_memory=self.gpu_memory,
            gpu_type_map=self.gpu_type_map,
            partition_qos_limits=self.partition_qos_limits(sorted({p.qos for p in raw_parts if p.qos})),
        )
        return replace(snap, reservations=self.reservations())

    def partition_qos_limits(self, names: Sequence[str]) -> dict[str, Limits]:
        """Limits of the partitions' own QOS (one sacctmgr call, cached like :meth:`limits`)."""
        now = self.clock()
        if not names:
            return {}
        cached = self._partition_qos
        if cached is not None and now - cached[0] < self.limits_ttl_s and set(names) <= set(cached[1]):
            return cached[1]
        rows = parse_qos(self.runner.run(
            ["sacctmgr", "-n", "-P", "show", "qos", "where", "names=" + ",".join(names),
             "format=" + ",".join(QOS_FIELDS)]).stdout)
        found = {name: qos_limits(rows, name, now) for name in names}
        self._partition_qos = (now, {k: v for k, v in found.items() if v is not None})
        return self._partition_qos[1]

    def reservations(self) -> tuple[Any, ...]:
        """Reservations this user or account may use (``scontrol show res``, cached like
        :meth:`limits`)."""
        now = self.clock()
        if self._reservations is not None and now - self._reservations[0] < self.limits_ttl_s:
            return self._reservations[1]
        out = self.runner.run(["scontrol", "show", "reservation", "-o"]).stdout
        self._reservations = (now, parse_reservations(out, self.user, self.account))
        return self._reservations[1]

    def jobs(self) -> list[JobInfo]:
        """Every job of this user that Slurm still holds (all states: recently finished ones
        show how they ended), hetjobs folded, tags parsed. One squeue call."""
        out = self.runner.run(["squeue", "-h", "-t", "all", "-u", self.user, "-O", SQUEUE_FORMAT])
        return parse_squeue(out.stdout, self._squeue_rows)

    def limits(self) -> Limits:
        """Association and QOS limits from sacctmgr, cached for ``limits_ttl_s``."""
        now = self.clock()
        if self._limits is not None and now - self._limits.observed_at < self.limits_ttl_s:
            return self._limits
        where = [f"accounts={self.account}"] if self.account else [f"users={self.user}"]
        assoc = parse_assoc(
            self.runner.run(
                ["sacctmgr", "-n", "-P", "show", "assoc", "where", *where, "format=" + ",".join(ASSOC_FIELDS)]
            ).stdout
        )
        # every QOS, not only ours: which of them may preempt ours (or a partition's) is in
        # their Preempt lists; one call either way
        qos_rows = parse_qos(
            self.runner.run(
                ["sacctmgr", "-n", "-P", "show", "qos", "format=" + ",".join(QOS_FIELDS)]
            ).stdout
        )
        self._limits = build_limits(assoc, qos_rows, self.user, self.account, self.qos, now)
        return self._limits

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """State of each job in one squeue call, then one sacct call for those squeue no longer
        holds. A job neither knows yet (sacct lags squeue) gets ``state=None``: not a reason to
        act. A hetjob answers under its leader's id."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        observed_at = self.clock()
        result: dict[str, JobStatus] = {}
        try:
            out = self.runner.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FORMAT])
            for job in parse_squeue(out.stdout):
                result[job.job_id] = JobStatus(job.job_id, job.state, job.reason, "squeue", observed_at)
        except SlurmJobNotFound:
            pass  # squeue errors when it knows none of the ids: all of them ask sacct
        missing = [i for i in ids if i not in result]
        if missing:
            out = self.runner.run(["sacct", "-n", "-P", "-X", "-j", ",".join(missing), "-o", SACCT_FORMAT])
            found = parse_sacct_states(out.stdout, observed_at)
            for job_id in missing:
                result[job_id] = found.get(job_id) or JobStatus(job_id, None, None, "none", observed_at)
        return {i: result[i] for i in ids}

    def accounting(self, deployment: str, start: float, end: float) -> list[AccountingRecord]:
        """This deployment's allocations that ran in ``[start, end]`` (epoch seconds), one per
        hetjob component and per requeued run; running jobs' elapsed time counts up to now.

        slurmdbd selects a range by the job's *eligible* time, which it may record a second or
        two after the job's start — after its end, for a job of a few seconds (seen on 22.05):
        until then ``sacct -j`` shows the job but this range query does not. A job that started
        in the last seconds may be missing; a later call counts it."""
        observed_at = self.clock()
        out = self.runner.run(
            ["sacct", "-n", "-P", "-X", "--duplicates", "-u", self.user, "-S", _slurm_time(start),
             "-E", _slurm_time(end), "-o", SACCT_FORMAT]
        )
        return parse_sacct_accounting(out.stdout, deployment, observed_at)

    def test_only(self, shape: JobShape) -> StartEstimate:
        """When Slurm would start a job of ``shape`` now (``sbatch --test-only``; nothing is
        submitted). Raises SlurmRejected when no node could ever run it."""
        observed_at = self.clock()
        gres = f"gpu:{shape.gpu_type}:{shape.gpus_per_node}" if shape.gpu_type else f"gpu:{shape.gpus_per_node}"
        argv = [
            "sbatch", "--test-only", "-p", shape.partition, f"--gres={gres}", "-N", str(shape.nodes),
            f"--cpus-per-task={shape.cpus_per_gpu * shape.gpus_per_node}",
            f"--mem={shape.mem_per_gpu_gb * shape.gpus_per_node}G",
            f"--time={max(1, shape.time_limit_s // 60)}",
        ]
        if shape.account:
            argv.append(f"--account={shape.account}")
        if shape.qos:
            argv.append(f"--qos={shape.qos}")
        if shape.reservation:
            argv.append(f"--reservation={shape.reservation}")
        argv.append("--wrap=true")
        out = self.runner.run(argv)
        start, nodes, partition = parse_test_only(out.stderr + out.stdout)
        return StartEstimate(start=start, nodes=nodes, partition=partition, observed_at=observed_at)

    # ----------------------------------------------------------------------------- act

    def submit_script(self, path: str | Path, extra_env: Mapping[str, str] | None = None) -> str:
        """Submit a batch script (hetjob replicas) with sbatch; return the job id. ``extra_env``
        goes to sbatch's environment (the job inherits it), never to argv. Not retried here: after
        a timeout the job may exist, so the caller adopts by tag on its next cycle instead of
        submitting twice. Raises SlurmRejected (bad partition/account/QOS/GRES) or
        SlurmUnavailable."""
        out = self.runner.run(["sbatch", "--parsable", str(path)], retry=False, extra_env=extra_env)
        return parse_sbatch_parsable(out.stdout)

    def cancel(self, job_ids: Iterable[str], signal: str | None = None, *, full: bool = True) -> None:
        """scancel the jobs (for good), or send them ``signal`` (``"TERM"``) — to every step and
        the batch shell when ``full``. Ids Slurm no longer knows are already gone: no error."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
            if full:
                argv.append("--full")
        try:
            self.runner.run([*argv, *ids])
        except SlurmJobNotFound:
            pass

    def cancel_with_grace(
        self, job_ids: Iterable[str], grace_s: float, signal: str = "TERM", poll_s: float = 1.0,
        *, full: bool = True,
    ) -> dict[str, str]:
        """Send ``signal`` to running jobs (all steps and the batch shell), wait up to ``grace_s``
        for them to end, then scancel what is left. ``full=False`` signals the job steps only, not
        the batch shell (srun-launched replicas: ``--full`` makes srun SIGKILL its tasks). Pending
        jobs are cancelled at once. Returns
        job id → ``"exited"`` (ended within the grace) or ``"cancelled"``."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        states = self.job_states(ids)
        pending = [i for i in ids if states[i].state == "PENDING"]
        running = [i for i in ids if i not in pending and not states[i].finished]
        outcome = {i: "exited" for i in ids if i not in pending and i not in running}
        if pending:
            self.cancel(pending)
            outcome.update({i: "cancelled" for i in pending})
        if running:
            self.cancel(running, signal=signal, full=full)
            deadline = self.clock() + grace_s
            alive = running
            while alive and self.clock() < deadline:
                self.sleep(min(poll_s, max(0.0, deadline - self.clock())))
                now = self.job_states(alive)
                alive = [i for i in alive
                         if (state := now[i].state) is None
                         or state.split()[0] not in FINISHED_JOB_STATES]
            outcome.update({i: "exited" for i in running if i not in alive})
            if alive:
                self.cancel(alive)
                outcome.update({i: "cancelled" for i in alive})
        return {i: outcome[i] for i in ids}
