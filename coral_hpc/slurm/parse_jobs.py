"""Jobs from ``squeue -O`` and ``sacct -P``, and the one-liners of sbatch and sinfo. Pure.

squeue is read through a fixed ``--Format`` list rather than ``--json``: the field names are the
same from Slurm 20.11 to 25.x, the answer for 10,000 jobs is a tenth of the JSON's size, and
``StartTime`` of a pending job is the expected start ``squeue --start`` shows, so one call gives
state, reason, nodes, times and the tag. Every field ends in ``|``; the free-text Comment sits
between the fixed fields and two trailing Slurm names (Account, Reservation, which hold no
``|``), so a ``|`` inside it cannot shift the other columns: the row splits from both ends.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from coral_hpc.slurm.billing import gpus_in_tres, parse_tres
from coral_hpc.slurm.errors import SlurmParseError
from coral_hpc.slurm.hostlist import expand_hostlist
from coral_hpc.slurm.snapshot import AccountingRecord, JobComponent, JobInfo, JobStatus
from coral_hpc.slurm.timefmt import parse_duration, parse_timestamp
from coral_hpc.types import JobTag

SQUEUE_FIELDS: tuple[str, ...] = (
    "JobID", "HetJobID", "HetJobOffset", "ArrayJobID", "ArrayTaskID", "State", "Reason",
    "Partition", "NodeList", "NumNodes", "SubmitTime", "StartTime", "EndTime", "TimeLeft",
    "TimeLimit", "RestartCnt", "tres-alloc", "Name", "Comment", "Account", "Reservation",
)
#: the ``squeue -O`` argument for :data:`SQUEUE_FIELDS`
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)
#: fields after the free-text Comment: Slurm names, never holding a ``|``
_AFTER_COMMENT = SQUEUE_FIELDS[SQUEUE_FIELDS.index("Comment") + 1:]
#: a row of the format before Account and Reservation were asked for (the 22.05 recordings of
#: tests/data/slurm): the fixed fields and the Comment only. A row of today's format always has
#: more fields, so the two never read alike
_LEGACY_FIELDS = len(SQUEUE_FIELDS) - len(_AFTER_COMMENT)

SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "JobName", "Partition", "State", "ExitCode", "Reason", "AllocTRES",
    "ElapsedRaw", "Submit", "Start", "End", "NNodes", "NodeList", "Comment",
)
SACCT_FORMAT = ",".join(SACCT_FIELDS)

_LIVE_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING")
_TEST_ONLY_RE = re.compile(
    r"Job (\d+) to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)"
)
_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def _none(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "N/A", "None", "(null)") else value


def _split_rows(text: str, n_fields: int, what: str, trailing_bar: bool) -> Iterable[list[str]]:
    """Rows of a ``|``-separated table; the last field (Comment) keeps any ``|`` it holds."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if trailing_bar:
            if not line.endswith("|"):
                raise SlurmParseError(f"{what} line {number}: not a '|'-terminated row: {line[:80]!r}")
            line = line[:-1]
        items = line.split("|")
        if len(items) < n_fields:
            raise SlurmParseError(
                f"{what} line {number}: {len(items)} fields, expected {n_fields}: {line[:80]!r}"
            )
        yield items[: n_fields - 1] + ["|".join(items[n_fields - 1:])]


def _int(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SlurmParseError(f"{what}: {value!r} is not a number") from None


def _time(value: str, what: str) -> float | None:
    try:
        return parse_timestamp(value)
    except ValueError:
        raise SlurmParseError(f"{what}: {value!r} is not a Slurm timestamp") from None


def _duration(value: str, what: str) -> int | None:
    try:
        return parse_duration(value)
    except ValueError:
        raise SlurmParseError(f"{what}: {value!r} is not a Slurm duration") from None


class RowCache:
    """Parsed squeue rows of the previous cycle, keyed by the raw line. Between two observe
    cycles most lines are unchanged (held and pending jobs print the same line), so each cycle
    parses only the lines that changed. Entries not seen in the latest cycle are dropped."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str | None, str | None, JobInfo]] = {}

    def __len__(self) -> int:
        return len(self._rows)


def parse_squeue(text: str, cache: RowCache | None = None) -> list[JobInfo]:
    """All jobs in ``squeue -h -O <SQUEUE_FORMAT>`` output; a hetjob's components are folded into
    one :class:`JobInfo` under the leader's id. Raises SlurmParseError on garbage. With a
    :class:`RowCache`, lines unchanged since the last call are not parsed again."""
    previous = cache._rows if cache is not None else {}
    current: dict[str, tuple[str | None, str | None, JobInfo]] = {}
    singles: list[JobInfo] = []
    het: dict[str, list[tuple[int, JobInfo]]] = defaultdict(list)
    n_fields = len(SQUEUE_FIELDS)
    for number, line in enumerate(text.splitlines(), 1):
        entry = previous.get(line)
        if entry is None:
            if not line.strip():
                continue
            items = _split_row(line, number, n_fields)
            row = dict(zip(SQUEUE_FIELDS, items))
            entry = (_none(row["HetJobID"]), _none(row["HetJobOffset"]), _job_from_row(row))
        current[line] = entry
        het_id, offset, job = entry
        if het_id:
            het[het_id].append((int(offset or 0), job))
        else:
            singles.append(job)
    if cache is not None:
        cache._rows = current
    for het_id, parts in het.items():
        singles.append(_fold_het(het_id, parts))
    return singles


def _split_row(line: str, number: int, n_fields: int) -> list[str]:
    """The row's fields in :data:`SQUEUE_FIELDS` order; a legacy row (no Account, Reservation)
    gets them empty."""
    if not line.endswith("|"):
        raise SlurmParseError(f"squeue line {number}: not a '|'-terminated row: {line[:80]!r}")
    items = line[:-1].split("|")
    after = len(_AFTER_COMMENT)
    if len(items) == _LEGACY_FIELDS:
        return items + [""] * after
    if len(items) < n_fields:
        raise SlurmParseError(f"squeue line {number}: {len(items)} fields, expected {n_fields}: {line[:80]!r}")
    comment = _LEGACY_FIELDS - 1
    return items[:comment] + ["|".join(items[comment:len(items) - after])] + items[len(items) - after:]


def _job_from_row(row: dict[str, str]) -> JobInfo:
    job_id = row["JobID"].strip()
    where = f"squeue job {job_id}"
    state = row["State"].strip()
    try:
        tres = parse_tres(_none(row["tres-alloc"]))
    except ValueError as exc:
        raise SlurmParseError(f"{where}: {exc}") from None
    gpus, gpu_type = gpus_in_tres(tres)
    start = _time(row["StartTime"], where)
    array_task = _none(row["ArrayTaskID"])
    array_job = _none(row["ArrayJobID"])
    return JobInfo(
        job_id=job_id,
        tag=JobTag.from_comment(row["Comment"]),
        name=row["Name"],
        state=state,
        reason=_none(row["Reason"]),
        partition=row["Partition"].strip(),
        nodes=expand_hostlist(_none(row["NodeList"])),
        num_nodes=_int(row["NumNodes"], where) if _none(row["NumNodes"]) else 0,
        submit_time=_time(row["SubmitTime"], where),
        start_time=start if state != "PENDING" else None,
        end_time=_time(row["EndTime"], where) if state != "PENDING" else None,
        time_limit_s=_duration(row["TimeLimit"], where),
        time_left_s=_duration(row["TimeLeft"], where) if state in _LIVE_STATES else None,
        expected_start=start if state == "PENDING" else None,
        restarts=_int(row["RestartCnt"], where) if _none(row["RestartCnt"]) else 0,
        gpus=gpus,
        gpu_type=gpu_type,
        array_job_id=array_job if array_task is not None else None,
        array_task_id=array_task,
        account=_none(row["Account"]),
        reservation=_none(row["Reservation"]),
    )


def _fold_het(het_id: str, parts: list[tuple[int, JobInfo]]) -> JobInfo:
    parts = sorted(parts, key=lambda p: p[0])
    leader = next((job for _, job in parts if job.job_id == het_id), parts[0][1])
    components = tuple(
        JobComponent(
            job_id=f"{het_id}+{offset}",
            offset=offset,
            state=job.state,
            partition=job.partition,
            nodes=job.nodes,
            num_nodes=job.num_nodes,
            gpus=job.gpus,
            gpu_type=job.gpu_type,
            reservation=job.reservation,
        )
        for offset, job in parts
    )
    types = {c.gpu_type for c in components if c.gpus}
    nodes: list[str] = []
    for component in components:
        nodes.extend(n for n in component.nodes if n not in nodes)
    return JobInfo(
        job_id=het_id,
        tag=leader.tag or next((job.tag for _, job in parts if job.tag), None),
        name=leader.name,
        state=leader.state,
        reason=leader.reason,
        partition=leader.partition,
        nodes=tuple(nodes),
        num_nodes=sum(c.num_nodes for c in components),
        submit_time=leader.submit_time,
        start_time=leader.start_time,
        end_time=leader.end_time,
        time_limit_s=leader.time_limit_s,
        time_left_s=leader.time_left_s,
        expected_start=leader.expected_start,
        restarts=leader.restarts,
        gpus=sum(c.gpus for c in components),
        gpu_type=types.pop() if len(types) == 1 else None,
        components=components,
        account=leader.account,
        reservation=leader.reservation,
    )


# --------------------------------------------------------------------------- sacct


def parse_sacct_rows(text: str) -> list[dict[str, str]]:
    """Rows of ``sacct -n -P -o <SACCT_FORMAT>`` as dicts (steps included if present)."""
    return [
        dict(zip(SACCT_FIELDS, items))
        for items in _split_rows(text, len(SACCT_FIELDS), "sacct", trailing_bar=False)
    ]


def _het_parts(job_id: str) -> tuple[str | None, int | None]:
    base, plus, offset = job_id.partition("+")
    if not plus:
        return None, None
    return base, int(offset.split(".")[0]) if offset.split(".")[0].isdigit() else None


def tag_from_job_name(name: str, deployment: str | None) -> JobTag | None:
    """A JobTag from a job name ``coral.<deployment>.<model>.<replica>`` (no template). Slurm
    22.05 stores the comment in sacct only when a job ends, so a running job is known by name.
    Model names may hold dots, so the deployment must be known; the replica id is the last part."""
    prefix = f"coral.{deployment}."
    if deployment is None or not name.startswith(prefix):
        return None
    model, sep, replica = name[len(prefix):].rpartition(".")
    if not sep:
        return None
    try:
        return JobTag(deployment=deployment, model=model, replica_id=replica)
    except ValueError:
        return None


def parse_sacct_accounting(
    text: str, deployment: str | None, observed_at: float
) -> list[AccountingRecord]:
    """Allocations (not steps) of jobs tagged for ``deployment`` (all tagged jobs when None).
    A hetjob's components each give a record; a component without a comment takes its leader's
    tag; a job without a comment (running, on Slurm 22.05) is known by its job name. A running
    job's elapsed time is what sacct reports now (ElapsedRaw up to now)."""
    rows = [r for r in parse_sacct_rows(text) if "." not in r["JobID"]]
    leader_tags: dict[str, JobTag | None] = {}
    for row in rows:
        base, offset = _het_parts(row["JobID"])
        if base is not None and offset == 0:
            leader_tags[base] = JobTag.from_comment(row["Comment"])
    records = []
    for row in rows:
        where = f"sacct job {row['JobID']}"
        base, offset = _het_parts(row["JobID"])
        tag = JobTag.from_comment(row["Comment"])
        if tag is None and base is not None:
            tag = leader_tags.get(base)
        if tag is None:
            tag = tag_from_job_name(row["JobName"], deployment)
        if tag is None or (deployment is not None and tag.deployment != deployment):
            continue
        try:
            tres = parse_tres(_none(row["AllocTRES"]))
        except ValueError as exc:
            raise SlurmParseError(f"{where}: {exc}") from None
        gpus, gpu_type = gpus_in_tres(tres)
        state = row["State"].strip()
        records.append(
            AccountingRecord(
                job_id=row["JobID"],
                het_job_id=base,
                het_offset=offset,
                tag=tag,
                partition=row["Partition"],
                state=state,
                gpus=gpus,
                gpu_type=gpu_type,
                cpus=int(tres.get("cpu", 0)),
                mem_gb=tres.get("mem", 0.0),
                nodes=_int(row["NNodes"], where) if _none(row["NNodes"]) else 0,
                billing=tres.get("billing"),
                submit_time=_time(row["Submit"], where),
                start_time=_time(row["Start"], where),
                end_time=_time(row["End"], where),
                elapsed_s=_int(row["ElapsedRaw"], where) if _none(row["ElapsedRaw"]) else 0,
                observed_at=observed_at,
            )
        )
    return records


def parse_sacct_states(text: str, observed_at: float) -> dict[str, JobStatus]:
    """Job id → :class:`JobStatus` from ``sacct -X`` rows, keyed by JobIDRaw (a hetjob's leader
    row ``123+0`` answers for ``123``; array tasks answer under their raw id too)."""
    statuses: dict[str, JobStatus] = {}
    for row in parse_sacct_rows(text):
        if "." in row["JobID"]:
            continue
        raw_id = row["JobIDRaw"].strip()
        statuses[raw_id] = JobStatus(
            job_id=raw_id,
            state=row["State"].strip(),
            reason=_none(row["Reason"]),
            source="sacct",
            observed_at=observed_at,
            exit_code=_none(row["ExitCode"]),
        )
    return statuses


# --------------------------------------------------------------------------- one-liners


def parse_sbatch_parsable(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` (``"123"`` or ``"123;cluster"``)."""
    for line in stdout.splitlines():
        head = line.strip().split(";")[0]
        if head.isdigit():
            return head
    raise SlurmParseError(f"sbatch --parsable printed no job id: {stdout.strip()[:200]!r}")


def parse_test_only(stderr: str) -> tuple[float, tuple[str, ...], str]:
    """``sbatch --test-only`` → (expected start as epoch seconds, nodes, partition)."""
    match = _TEST_ONLY_RE.search(stderr)
    if not match:
        raise SlurmParseError(f"sbatch --test-only gave no start estimate: {stderr.strip()[:200]!r}")
    start = parse_timestamp(match.group(2))
    assert start is not None
    return start, expand_hostlist(match.group(4)), match.group(5)


def parse_version(text: str) -> str:
    """``"slurm-wlm 22.05.8"`` / ``"slurm 23.11.4"`` → ``"22.05.8"``."""
    match = _VERSION_RE.search(text)
    if not match:
        raise SlurmParseError(f"no Slurm version in {text.strip()[:100]!r}")
    return match.group(0)


def version_tuple(version: str) -> tuple[int, int]:
    """``"22.05.8"`` → ``(22, 5)``."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)
