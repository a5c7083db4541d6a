"""Reservations from ``scontrol show reservation -o``. Pure."""

from __future__ import annotations

from coral_hpc.slurm.hostlist import expand_hostlist
from coral_hpc.slurm.parse_nodes import split_key_values
from coral_hpc.slurm.snapshot import ReservationInfo
from coral_hpc.slurm.timefmt import parse_timestamp


def _names(value: str | None) -> tuple[set[str], set[str]]:
    """``"alice,-bob"`` → ({"alice"}, {"bob"}): allowed and denied names."""
    allowed: set[str] = set()
    denied: set[str] = set()
    for item in (value or "").split(","):
        item = item.strip()
        if not item or item == "(null)":
            continue
        (denied if item.startswith("-") else allowed).add(item.lstrip("-"))
    return allowed, denied


def parse_reservations(text: str, user: str, account: str | None) -> tuple[ReservationInfo, ...]:
    """The reservations ``user`` (or ``account``) may run in, of ``scontrol show res -o``.
    Slurm prints ``No reservations in the system`` when there are none."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("ReservationName="):
            continue
        rec = split_key_values(line)
        users, denied_users = _names(rec.get("Users"))
        accounts, denied_accounts = _names(rec.get("Accounts"))
        if user in denied_users or (account and account in denied_accounts):
            continue
        if not (user in users or (account and account in accounts)):
            continue
        partition = rec.get("PartitionName")
        out.append(
            ReservationInfo(
                name=rec["ReservationName"],
                nodes=expand_hostlist(rec.get("Nodes"))
                if rec.get("Nodes") not in (None, "(null)")
                else (),
                start=parse_timestamp(rec.get("StartTime")),
                end=parse_timestamp(rec.get("EndTime")),
                partition=None if partition in (None, "", "(null)") else partition,
                state=(rec.get("State") or "INACTIVE").lower(),
                flags=tuple(f.strip().upper() for f in (rec.get("Flags") or "").split(",")
                            if f.strip() and f.strip() != "(null)"),
            )
        )
    return tuple(out)
