"""Account limits from ``sacctmgr -n -P show assoc|qos``. Pure."""

from __future__ import annotations

from coral_hpc.slurm.billing import parse_tres
from coral_hpc.slurm.errors import SlurmParseError
from coral_hpc.slurm.snapshot import Limits

ASSOC_FIELDS = ("Account", "User", "Partition", "QOS", "DefaultQOS", "GrpTRES", "MaxTRES",
                "GrpJobs", "MaxJobs", "MaxSubmit")
QOS_FIELDS = ("Name", "GrpTRES", "MaxTRES", "MaxTRESPU", "GrpJobs", "MaxJobsPU", "MaxSubmitPU",
              "Preempt", "PreemptMode")
#: QOS rows recorded before Preempt/PreemptMode were asked for (tests/data/slurm/22.05)
_QOS_LEGACY_FIELDS = 7


def _rows(text: str, fields: tuple[str, ...], what: str,
          legacy: int | None = None) -> list[dict[str, str]]:
    """Rows as dicts; a row of ``legacy`` fields (an older format, a prefix of ``fields``) gets
    the fields it lacks empty."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        items = line.split("|")
        if legacy is not None and len(items) == legacy:
            items += [""] * (len(fields) - legacy)
        if len(items) != len(fields):
            raise SlurmParseError(f"{what} line {number}: {len(items)} fields, expected {len(fields)}")
        rows.append(dict(zip(fields, (i.strip() for i in items))))
    return rows


def parse_assoc(text: str) -> list[dict[str, str]]:
    """Rows of ``sacctmgr -n -P show assoc format=<ASSOC_FIELDS>``."""
    return _rows(text, ASSOC_FIELDS, "sacctmgr show assoc")


def parse_qos(text: str) -> list[dict[str, str]]:
    """Rows of ``sacctmgr -n -P show qos format=<QOS_FIELDS>``."""
    return _rows(text, QOS_FIELDS, "sacctmgr show qos", legacy=_QOS_LEGACY_FIELDS)


def qos_preemptors(qos_rows: list[dict[str, str]]) -> dict[str, tuple[str, ...]]:
    """QOS name → the QOS whose jobs may preempt its jobs (their ``Preempt`` lists name it;
    PreemptType=preempt/qos), for each QOS whose own PreemptMode is not OFF (``cluster`` = the
    cluster's mode, counted: the partitions' PreemptMode tells whether that is OFF)."""
    out: dict[str, list[str]] = {}
    modes = {q["Name"]: q.get("PreemptMode", "").lower() for q in qos_rows}
    for row in qos_rows:
        for victim in (v.strip() for v in row.get("Preempt", "").split(",")):
            if victim and modes.get(victim, "cluster") != "off":
                out.setdefault(victim, []).append(row["Name"])
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _min(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _gpu_limits(texts: list[str]) -> tuple[int | None, dict[str, int]]:
    total: list[int | None] = []
    by_type: dict[str, int] = {}
    for text in texts:
        try:
            tres = parse_tres(text)
        except ValueError as exc:
            raise SlurmParseError(f"sacctmgr TRES {text!r}: {exc}") from None
        if "gres/gpu" in tres:
            total.append(int(tres["gres/gpu"]))
        for key, value in tres.items():
            if key.startswith("gres/gpu:"):
                gpu_type = key.split(":", 1)[1]
                by_type[gpu_type] = min(by_type.get(gpu_type, int(value)), int(value))
    return _min(total), by_type


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def choose_qos(assoc_rows: list[dict[str, str]], qos: str | None) -> str | None:
    """The QOS jobs will run under: the configured one, else the association's default, else
    its only allowed QOS; None when that cannot be told."""
    if qos:
        return qos
    for row in assoc_rows:
        if row.get("DefaultQOS"):
            return row["DefaultQOS"]
    allowed = {q for row in assoc_rows for q in row.get("QOS", "").split(",") if q}
    return allowed.pop() if len(allowed) == 1 else None


def build_limits(  # noqa: PLR0913 - each input is one sacctmgr answer or a config value
    assoc_rows: list[dict[str, str]],
    qos_rows: list[dict[str, str]],
    user: str,
    account: str | None,
    qos: str | None,
    observed_at: float,
) -> Limits:
    """The tightest of the user's and account's association limits and the QOS limits. A QOS's
    per-user caps (MaxTRESPU, MaxJobsPU, MaxSubmitPU) bind the deployment's single user, so they
    count as group caps here."""
    rows = [
        r for r in assoc_rows
        if r["User"] in ("", user) and (account is None or r["Account"] == account)
        and not r["Partition"]  # partition-specific associations are not modelled
    ]
    accounts = {r["Account"] for r in rows}
    qos_name = choose_qos([r for r in rows if r["User"] == user], qos)
    qos_used = [q for q in qos_rows if q["Name"] == qos_name]
    grp, grp_by_type = _gpu_limits(
        [r["GrpTRES"] for r in rows] + [q["GrpTRES"] for q in qos_used] + [q["MaxTRESPU"] for q in qos_used]
    )
    per_job, per_job_by_type = _gpu_limits([r["MaxTRES"] for r in rows] + [q["MaxTRES"] for q in qos_used])
    per_user, _ = _gpu_limits([q["MaxTRESPU"] for q in qos_used])
    max_nodes = _min([_tres_count(t, "node") for t in
                      [r["MaxTRES"] for r in rows] + [q["MaxTRES"] for q in qos_used]])
    return Limits(
        account=account or (accounts.pop() if len(accounts) == 1 else None),
        qos=qos_name,
        grp_gpus=grp,
        grp_gpus_by_type=grp_by_type,
        max_gpus_per_job=per_job,
        max_gpus_per_job_by_type=per_job_by_type,
        max_jobs=_min([_int(r["MaxJobs"]) for r in rows] + [_int(r["GrpJobs"]) for r in rows]
                      + [_int(q["MaxJobsPU"]) for q in qos_used] + [_int(q["GrpJobs"]) for q in qos_used]),
        max_submit_jobs=_min([_int(r["MaxSubmit"]) for r in rows] + [_int(q["MaxSubmitPU"]) for q in qos_used]),
        observed_at=observed_at,
        max_gpus_per_user=per_user,
        max_nodes_per_job=max_nodes,
        qos_preempted_by=qos_preemptors(qos_rows),
    )


def qos_limits(qos_rows: list[dict[str, str]], name: str, observed_at: float) -> Limits | None:
    """The limits of one QOS alone (a partition's QOS binds every job in that partition)."""
    rows = [q for q in qos_rows if q["Name"] == name]
    if not rows:
        return None
    return build_limits([], rows, "", None, name, observed_at)


def _tres_count(text: str, key: str) -> int | None:
    try:
        value = parse_tres(text).get(key)
    except ValueError as exc:
        raise SlurmParseError(f"sacctmgr TRES {text!r}: {exc}") from None
    return int(value) if value is not None else None
