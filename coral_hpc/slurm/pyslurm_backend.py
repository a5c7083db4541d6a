"""The pyslurm backend: nodes and partitions through the Slurm C API instead of a subprocess.

pyslurm must match the cluster's Slurm major version (PyPI has no build for Slurm 22.05; one
built from pyslurm's v22.5.3 tag works). Nodes and partitions — the largest answers on a big
cluster — are read through pyslurm; jobs (one ``squeue`` with tags, hetjob folding and expected
starts), limits, accounting and every action go through the CLI client, so both backends share
one parser for those and produce the same snapshot.

The conversion is split in two so it can be tested without pyslurm: :func:`node_records` and
:func:`partition_records` copy the fields we use out of pyslurm's objects into plain dicts (what
``tests/data/slurm/22.05/pyslurm_*.json`` records), and the pure :func:`raw_nodes_from_records` /
:func:`raw_partitions_from_records` turn those into the records the scontrol parsers produce.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from coral_hpc.slurm.billing import parse_billing_weights
from coral_hpc.slurm.build import build_snapshot
from coral_hpc.slurm.cli_backend import CliSlurmClient
from coral_hpc.slurm.errors import SlurmParseError, SlurmUnavailable
from coral_hpc.slurm.hostlist import expand_hostlist
from coral_hpc.slurm.parse_jobs import version_tuple
from coral_hpc.slurm.parse_nodes import RawNode, RawPartition, gres_gpus
from coral_hpc.slurm.snapshot import ClusterSnapshot

#: keys of pyslurm's ``node().get()`` dicts a snapshot needs. pyslurm 22.5's ``Nodes.load()`` asks
#: slurmctld without SHOW_DETAIL, so its nodes carry no used GRES (no allocated GPUs) and it leaves
#: ALLOCATED where scontrol shows MIXED; the older dict API asks with SHOW_DETAIL and derives
#: MIXED as scontrol does.
NODE_FIELDS = (
    "name", "state", "reason", "reason_time", "reason_uid", "partitions", "gres", "gres_used",
    "cpus", "alloc_cpus", "real_memory", "alloc_mem",
)
#: keys of pyslurm's ``partition().get()`` dicts a snapshot needs. The older dict API is used for
#: partitions because pyslurm 22.5's ``Partition`` class does not expose TRESBillingWeights.
PARTITION_FIELDS = ("name", "state", "nodes", "max_time", "billing_weights_str", "flags")


#: where libslurm looks without SLURM_CONF (Slurm's default sysconfdir on Debian and RHEL builds)
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def _conf_path(env: Mapping[str, str]) -> str:
    return os.path.realpath(env.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


def pyslurm_unusable_reason(
    cluster_version: str | Callable[[], str], cli_env: Mapping[str, str] | None = None
) -> str | None:
    """None when pyslurm imports, its major version (``22.5.3`` → 22.05) matches the cluster's
    and it reads the same ``slurm.conf`` as the CLI commands; else why not. ``cluster_version``
    may be a callable, asked only once pyslurm imports. ``cli_env`` is the environment the CLI
    commands run with (None: this process's, which is what pyslurm reads)."""
    try:
        import pyslurm
    except ImportError as exc:
        return f"pyslurm does not import ({exc})"
    version = getattr(pyslurm, "__version__", "") or ""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        return f"pyslurm reports no version ({version!r})"
    ours = (int(match.group(1)), int(match.group(2)))
    # libslurm reads SLURM_CONF once, when pyslurm is imported: a client whose commands are
    # pointed at another slurm.conf would read a different cluster through pyslurm
    if cli_env is not None and _conf_path(cli_env) != _conf_path(os.environ):
        return (f"pyslurm reads {_conf_path(os.environ)} (this process's SLURM_CONF), the Slurm "
                f"commands read {_conf_path(cli_env)}")
    if callable(cluster_version):
        cluster_version = cluster_version()
    theirs = version_tuple(cluster_version)
    if ours != theirs:
        return f"pyslurm {version} is built for Slurm {ours[0]}.{ours[1]:02d}, the cluster runs {cluster_version}"
    if not hasattr(pyslurm, "node") or not hasattr(pyslurm, "partition"):
        return f"pyslurm {version} lacks the pyslurm.node or pyslurm.partition API"
    return None


# ------------------------------------------------------------------------ pyslurm objects → dicts


def node_records(nodes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``pyslurm.node().get()`` → one plain dict of :data:`NODE_FIELDS` per node."""
    return [{field: node.get(field) for field in NODE_FIELDS} for node in nodes.values()]


def partition_records(partitions: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``pyslurm.partition().get()`` → one plain dict of :data:`PARTITION_FIELDS` per partition."""
    return [{field: part.get(field) for field in PARTITION_FIELDS} for part in partitions.values()]


# ------------------------------------------------------------------------ dicts → raw records (pure)


#: marks slurm_node_state_string puts on the base state (pyslurm's dict API uses it) → the flag
#: words scontrol show node prints (node_state_string_complete)
_STATE_MARKS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                "!": "POWER_DOWN"}
#: pyslurm's dict API spells POWERED_DOWN as "+POWER"
_FLAG_WORDS = {"POWER": "POWERED_DOWN"}


def state_words(state: str | None) -> tuple[str, ...]:
    """pyslurm's node state (``"MIXED+DRAIN"``, ``"DOWN*"``, ``"IDLE+POWER"``) → the words
    scontrol prints: base state first, then flags (``("DOWN", "NOT_RESPONDING")``)."""
    words = [w for w in str(state or "UNKNOWN").upper().split("+") if w]
    if not words:
        return ("UNKNOWN",)
    base, flags = words[0], [_FLAG_WORDS.get(w, w) for w in words[1:]]
    if base[-1] in _STATE_MARKS:
        flags.append(_STATE_MARKS[base[-1]])
        base = base[:-1]
    return (base, *flags)


def _reason(rec: Mapping[str, Any]) -> str | None:
    """The reason as scontrol prints it: ``text [user@time]`` when Slurm recorded who set it
    and when (``time`` as scontrol formats it by default: ISO 8601 local time)."""
    text = rec.get("reason")
    if not text:
        return None
    when = rec.get("reason_time")
    if not when:
        return text
    uid = rec.get("reason_uid")
    try:
        user = pwd.getpwuid(int(uid)).pw_name if uid is not None else "nobody"
    except (KeyError, ValueError):
        user = "nobody"  # what Slurm's uid_to_string prints for an unknown uid
    return f"{text} [{user}@{datetime.fromtimestamp(int(when)).strftime('%Y-%m-%dT%H:%M:%S')}]"


def raw_nodes_from_records(records: Iterable[Mapping[str, Any]]) -> list[RawNode]:
    """:func:`node_records` dicts → RawNode records (the same records ``scontrol show node -o``
    parses to). GRES are Slurm's strings (``["gpu:a100:4"]``, used ``["gpu:a100:3(IDX:0-2)"]``),
    read by the scontrol parser's own :func:`gres_gpus`; memory is MB, as in scontrol."""
    raws = []
    for rec in records:
        name = rec.get("name")
        if not name:
            raise SlurmParseError(f"pyslurm node record without a name: {dict(rec)!r}")
        gpu_type, gpus_total = gres_gpus(",".join(rec.get("gres") or ()) or None)
        raws.append(
            RawNode(
                name=name,
                state_words=state_words(rec.get("state")),
                reason=_reason(rec),
                partitions=tuple(rec.get("partitions") or ()),
                gpu_type=gpu_type,
                gpus_total=gpus_total,
                gpus_alloc=gres_gpus(",".join(rec.get("gres_used") or ()) or None)[1],
                cpus=int(rec.get("cpus") or 0),
                cpus_alloc=int(rec.get("alloc_cpus") or 0),
                mem_gb=int(rec.get("real_memory") or 0) / 1024,
                mem_alloc_gb=int(rec.get("alloc_mem") or 0) / 1024,
            )
        )
    return raws


def _partition_state(value: Any, name: str) -> str:
    # pyslurm's dict API maps PARTITION_INACTIVE (0) to "" (its state helper skips a zero state)
    state = str(value or "").strip().lower() or "inactive"
    if state not in ("up", "down", "drain", "inactive"):
        raise SlurmParseError(f"pyslurm partition {name}: unknown state {value!r}")
    return state


def raw_partitions_from_records(records: Iterable[Mapping[str, Any]]) -> list[RawPartition]:
    """:func:`partition_records` dicts → RawPartition records (the same records ``scontrol show
    partition -o`` parses to). ``max_time`` is seconds or ``"UNLIMITED"``."""
    raws = []
    for rec in records:
        name = rec.get("name")
        if not name:
            raise SlurmParseError(f"pyslurm partition record without a name: {dict(rec)!r}")
        try:
            weights = parse_billing_weights(rec.get("billing_weights_str") or None)
        except ValueError as exc:
            raise SlurmParseError(f"pyslurm partition {name}: {exc}") from None
        max_time = rec.get("max_time")
        raws.append(
            RawPartition(
                name=name,
                state=_partition_state(rec.get("state"), name),
                nodes=expand_hostlist(rec.get("nodes") or None),
                max_time_s=None if max_time in (None, "UNLIMITED", "INFINITE") else int(max_time),
                billing_weights=weights,
                default=bool((rec.get("flags") or {}).get("Default")),
                # pyslurm reports "UNLIMITED" as the largest uint32
                max_nodes=rec["max_nodes"] if isinstance(rec.get("max_nodes"), int)
                and 0 < rec["max_nodes"] < 2**31 else None,
                qos=rec.get("qos") or None,
            )
        )
    return raws


# ------------------------------------------------------------------------ the client


class PyslurmClient:
    """A :class:`~coral_hpc.slurm.client.SlurmClient` reading nodes and partitions through
    pyslurm, everything else through the CLI client it wraps."""

    backend = "pyslurm"

    # the CLI client's own bound methods, set in __init__ (typed loosely: they are its methods)
    version: Callable[[], str]
    jobs: Callable[[], list[Any]]
    limits: Callable[[], Any]
    job_states: Callable[..., dict[str, Any]]
    accounting: Callable[..., list[Any]]
    test_only: Callable[..., Any]
    submit_script: Callable[..., str]
    cancel: Callable[..., None]
    cancel_with_grace: Callable[..., dict[str, str]]

    def __init__(self, cli: CliSlurmClient):
        self.cli = cli
        # everything but the node and partition reads is the CLI client's
        for name in ("version", "jobs", "limits", "job_states", "accounting", "test_only",
                     "submit_script", "cancel", "cancel_with_grace"):
            setattr(self, name, getattr(cli, name))

    def _load(self, what: str, load: Callable[[], Any]) -> Any:
        runner = self.cli.runner
        started = time.perf_counter()
        try:
            return load()
        except Exception as exc:  # pyslurm's dict API raises ValueError when slurmctld is unreachable
            raise SlurmUnavailable(f"pyslurm {what}: {exc}") from exc
        finally:
            runner.calls[f"pyslurm {what}"] += 1
            runner.slurm_seconds += time.perf_counter() - started
            if runner.budget is not None:  # an RPC like the command it replaces
                runner.budget.spend(1)

    def snapshot(self, deployment: str) -> ClusterSnapshot:
        """Nodes and partitions through pyslurm, this deployment's jobs and the limits through the
        CLI; ``observed_at`` is when the first read was sent."""
        import pyslurm

        version = self.cli.version()
        observed_at = self.cli.clock()
        nodes = node_records(self._load("node.get", lambda: pyslurm.node().get()))
        partitions = partition_records(self._load("partition.get", lambda: pyslurm.partition().get()))
        raw_parts = raw_partitions_from_records(partitions)
        snap = build_snapshot(
            slurm_version=version,
            observed_at=observed_at,
            deployment=deployment,
            backend=self.backend,
            raw_nodes=raw_nodes_from_records(nodes),
            raw_partitions=raw_parts,
            jobs=self.cli.jobs(),
            limits=self.cli.limits(),
            gpu_memory=self.cli.gpu_memory,
            gpu_type_map=self.cli.gpu_type_map,
            partition_qos_limits=self.cli.partition_qos_limits(
                sorted({p.qos for p in raw_parts if p.qos})),
        )
        return replace(snap, reservations=self.cli.reservations())
