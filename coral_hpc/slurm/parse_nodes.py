"""Nodes and partitions from ``scontrol show node|partition`` — the one-line text format of
Slurm ≤ 22.05 (``-o``) and the JSON of Slurm ≥ 23.02 (``--json``, OpenAPI v0.0.39+). Pure.

The parsers return raw records; :mod:`coral_hpc.slurm.build` turns them into a snapshot.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from coral_hpc.slurm.billing import parse_billing_weights, parse_tres
from coral_hpc.slurm.errors import SlurmParseError
from coral_hpc.slurm.hostlist import expand_hostlist
from coral_hpc.slurm.timefmt import parse_duration

_GRES_RE = re.compile(r"^gpu(?::([^:(]+))?:(\d+)")


@dataclass(frozen=True)
class RawNode:
    """A node as Slurm describes it, before snapshot rules (free GPUs, memory) apply."""

    name: str
    #: upper-case state words: base state first, then flags (["MIXED", "DRAIN"])
    state_words: tuple[str, ...]
    reason: str | None
    partitions: tuple[str, ...]
    gpu_type: str | None
    gpus_total: int
    gpus_alloc: int
    #: CPUs jobs may be given (CPUEfctv: CPUTot less specialized cores) and those they hold
    cpus: int
    cpus_alloc: int
    #: memory jobs may be given (RealMemory less MemSpecLimit) and what they hold (AllocMem).
    #: FreeMem is not read: Slurm schedules on allocations, not on what the OS reports free
    mem_gb: float
    mem_alloc_gb: float
    #: AvailableFeatures (an untyped ``gpu:N`` node's GPU type may be named there)
    features: tuple[str, ...] = ()


def feature_list(value: Any) -> tuple[str, ...]:
    """``"a100,ib"`` or ``["a100", "ib"]`` → ``("a100", "ib")``; ``"(null)"`` → ``()``."""
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        items = str(value or "").split(",")
    return tuple(i.strip() for i in items if i.strip() and i.strip() not in ("(null)", "N/A"))


@dataclass(frozen=True)
class RawPartition:
    name: str
    state: str  # up | drain | down | inactive
    nodes: tuple[str, ...]
    max_time_s: int | None
    billing_weights: dict[str, float]
    default: bool
    #: MaxNodes per job; None = unlimited
    max_nodes: int | None = None
    #: the partition's QOS (its MaxTRES/MaxTRESPU bind every job here); None when N/A
    qos: str | None = None
    #: PreemptMode (``off``, ``requeue``, ``cancel``, ``suspend`` ...), lower case
    preempt_mode: str = "off"
    #: PriorityTier: with PreemptType=preempt/partition_prio, jobs of a higher tier preempt
    #: jobs of a lower one on the nodes they share
    priority_tier: int = 1
    #: the partition's JobDefaults DefCpuPerGPU and DefMemPerGPU (MB), and DefMemPerCPU (MB):
    #: what a job that asks no CPUs or memory of its own gets here; None = not set
    def_cpu_per_gpu: int | None = None
    def_mem_per_gpu_mb: int | None = None
    def_mem_per_cpu_mb: int | None = None


def split_key_values(line: str) -> dict[str, str]:
    """``"NodeName=a State=IDLE OS=Linux 6.1 #1"`` → ``{"NodeName": "a", "State": "IDLE",
    "OS": "Linux 6.1 #1"}`` (values run to the next ``Key=``; a word without one continues the
    previous value). Written with str.split rather than a regex: 1,000 nodes parse in a few ms."""
    result: dict[str, str] = {}
    key: str | None = None
    continued: set[str] = set()
    for token in line.split(" "):
        name, sep, value = token.partition("=")
        if sep and name.isidentifier():
            key = name
            result[key] = value
        elif key is not None:
            result[key] += " " + token
            continued.add(key)
    for key in continued:
        result[key] = result[key].strip()
    return result


def _records(text: str, first_key: str, what: str) -> list[dict[str, str]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not line.lstrip().startswith(f"{first_key}="):
            # scontrol prints "No nodes in the system" and similar; anything else is garbage
            if line.strip().startswith("No ") or line.strip().startswith("scontrol:"):
                continue
            raise SlurmParseError(f"{what} line {number}: expected '{first_key}=...', got {line[:80]!r}")
        records.append(split_key_values(line.strip()))
    return records


@functools.lru_cache(maxsize=4096)
def gres_gpus(gres: str | None) -> tuple[str | None, int]:
    """``"gpu:a100:4(S:0)"`` → ``("a100", 4)``; ``"gpu:4"`` → ``(None, 4)``; no GPU → ``(None, 0)``.
    Several GPU entries (``gpu:a100:2,gpu:v100:2``) sum; the type is then the first one's."""
    total, first_type = 0, None
    if not gres or gres in ("(null)", "N/A"):
        return None, 0
    for item in re.split(r",(?![^(]*\))", gres):
        match = _GRES_RE.match(item.strip())
        if match:
            total += int(match.group(2))
            first_type = first_type or match.group(1)
    return first_type, total


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value not in (None, "", "N/A") else default
    except ValueError:
        return default


_NODE_KEYS = ("NodeName", "State", "Partitions", "Gres", "AllocTRES", "CPUTot", "CPUEfctv",
              "CPUAlloc", "RealMemory", "MemSpecLimit", "AllocMem", "AvailableFeatures")
# The node fields we use are single words; only Reason holds spaces (it runs to the next Key=).
_NODE_FIELDS_RE = re.compile(r"(?:^| )(" + "|".join(_NODE_KEYS) + r")=(\S*)")
_REASON_RE = re.compile(r" Reason=(.*?)(?= [A-Za-z][A-Za-z0-9_]*=|$)")


def _node_record(line: str) -> dict[str, str]:
    rec = dict(_NODE_FIELDS_RE.findall(line))
    reason = _REASON_RE.search(line)
    if reason:
        rec["Reason"] = reason.group(1).strip()
    return rec


def parse_nodes_text(text: str) -> list[RawNode]:
    """Parse ``scontrol show node -o`` (Slurm ≤ 22.05). Raises SlurmParseError on garbage."""
    nodes = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("No nodes"):
            continue
        rec = _node_record(line)
        if "NodeName" not in rec or not line.startswith("NodeName="):
            raise SlurmParseError(f"scontrol show node line {number}: expected 'NodeName=...', got {line[:80]!r}")
        gpu_type, gpus_total = gres_gpus(rec.get("Gres"))
        alloc = _safe_tres(rec.get("AllocTRES"), rec["NodeName"])
        nodes.append(
            RawNode(
                name=rec["NodeName"],
                state_words=tuple(w for w in rec.get("State", "UNKNOWN").split("+") if w),
                reason=rec.get("Reason") or None,
                partitions=tuple(p for p in rec.get("Partitions", "").split(",") if p),
                gpu_type=gpu_type,
                gpus_total=gpus_total,
                gpus_alloc=int(alloc.get("gres/gpu", 0)),
                # CPUEfctv (21.08+): CPUTot less the cores kept for Slurm (CoreSpecCount)
                cpus=_int(rec.get("CPUEfctv"), _int(rec.get("CPUTot"))),
                cpus_alloc=_int(rec.get("CPUAlloc")),
                # MemSpecLimit is kept for Slurm's daemons: jobs get RealMemory less it
                mem_gb=(_int(rec.get("RealMemory")) - _int(rec.get("MemSpecLimit"))) / 1024,
                mem_alloc_gb=_int(rec.get("AllocMem")) / 1024,
                features=feature_list(rec.get("AvailableFeatures")),
            )
        )
    return nodes


def _safe_tres(text: str | None, where: str) -> dict[str, float]:
    try:
        return parse_tres(text)
    except ValueError as exc:
        raise SlurmParseError(f"{where}: {exc}") from None


def _partition_state(value: str) -> str:
    state = value.strip().lower()
    if state not in ("up", "down", "drain", "inactive"):
        raise SlurmParseError(f"unknown partition state {value!r}")
    return state


def _max_time(value: str | None) -> int | None:
    if value in (None, "", "UNLIMITED", "INFINITE", "NONE"):
        return None
    return parse_duration(value)


def parse_partitions_text(text: str) -> list[RawPartition]:
    """Parse ``scontrol show partition -o`` (Slurm ≤ 22.05)."""
    partitions = []
    for rec in _records(text, "PartitionName", "scontrol show partition"):
        try:
            weights = parse_billing_weights(rec.get("TRESBillingWeights"))
        except ValueError as exc:
            raise SlurmParseError(f"partition {rec['PartitionName']}: {exc}") from None
        partitions.append(
            RawPartition(
                name=rec["PartitionName"],
                state=_partition_state(rec.get("State", "UP")),
                nodes=expand_hostlist(rec.get("Nodes")),
                max_time_s=_max_time(rec.get("MaxTime")),
                billing_weights=weights,
                default=rec.get("Default") == "YES",
                max_nodes=_limit(rec.get("MaxNodes")),
                qos=_qos_name(rec.get("QoS")),
                preempt_mode=(rec.get("PreemptMode") or "OFF").lower(),
                priority_tier=_tier(_limit(rec.get("PriorityTier"))),
                **job_defaults(rec.get("JobDefaults"), _limit(rec.get("DefMemPerCPU"))),
            )
        )
    return partitions


def job_defaults(text: Any, mem_per_cpu_mb: int | None) -> dict[str, int | None]:
    """``JobDefaults=DefCpuPerGPU=8,DefMemPerGPU=65536`` (``(null)`` when none) and the
    partition's DefMemPerCPU (MB) as :class:`RawPartition` fields."""
    pairs = dict(item.split("=", 1) for item in str(text or "").split(",") if "=" in item)
    return {"def_cpu_per_gpu": _limit(pairs.get("DefCpuPerGPU")),
            "def_mem_per_gpu_mb": _limit(pairs.get("DefMemPerGPU")),
            "def_mem_per_cpu_mb": mem_per_cpu_mb}


def _limit(value: str | None) -> int | None:
    """``"UNLIMITED"`` → None, ``"4"`` → 4."""
    return int(value) if value and value.strip().isdigit() else None


def _tier(value: int | None) -> int:
    """PriorityTier, Slurm's default (1) when not shown."""
    return 1 if value is None else value


def _qos_name(value: Any) -> str | None:
    text = str(value or "").strip()
    return None if text in ("", "N/A", "(null)") else text


# --------------------------------------------------------------------------- Slurm ≥ 23.02 JSON


def load_json(text: str, what: str) -> dict[str, Any]:
    """``json.loads`` that raises SlurmParseError, and surfaces Slurm's own ``errors`` list."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{what}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SlurmParseError(f"{what}: expected a JSON object")
    errors = [e for e in data.get("errors") or [] if e]
    if errors:
        messages = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors)
        raise SlurmParseError(f"{what}: Slurm reported errors: {messages}")
    return data


def _number(value: Any) -> int | None:
    """OpenAPI numbers are plain (v0.0.38) or ``{"set", "infinite", "number"}`` (v0.0.39+);
    None when unset or infinite."""
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    if value is None:
        return None
    return int(value)


def _words(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v).upper() for v in value)
    return tuple(w for w in str(value or "UNKNOWN").upper().split("+") if w)


def parse_nodes_json(text: str) -> list[RawNode]:
    """Parse ``scontrol show node --json`` (Slurm ≥ 23.02; the OpenAPI ``nodes`` schema)."""
    data = load_json(text, "scontrol show node --json")
    nodes = []
    for raw in data.get("nodes", []):
        gpu_type, gpus_total = gres_gpus(raw.get("gres"))
        used = _safe_tres(raw.get("tres_used"), raw.get("name", "?"))
        gpus_alloc = int(used.get("gres/gpu", 0))
        if not used and raw.get("gres_used"):
            gpus_alloc = gres_gpus(raw["gres_used"])[1]
        nodes.append(
            RawNode(
                name=raw["name"],
                state_words=_words(raw.get("state")),
                reason=raw.get("reason") or None,
                partitions=tuple(raw.get("partitions") or ()),
                gpu_type=gpu_type,
                gpus_total=gpus_total,
                gpus_alloc=gpus_alloc,
                cpus=_number(raw.get("effective_cpus")) or _number(raw.get("cpus")) or 0,
                cpus_alloc=_number(raw.get("alloc_cpus")) or 0,
                mem_gb=((_number(raw.get("real_memory")) or 0)
                        - (_number(raw.get("specialized_memory")) or 0)) / 1024,
                mem_alloc_gb=(_number(raw.get("alloc_memory")) or 0) / 1024,
                features=feature_list(raw.get("features")),
            )
        )
    return nodes


def _preempt_mode(value: Any) -> str:
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return str(value or "off").lower()


def parse_partitions_json(text: str) -> list[RawPartition]:
    """Parse ``scontrol show partition --json`` (Slurm ≥ 23.02; nested OpenAPI partition schema,
    with the flat v0.0.38 names accepted too)."""
    data = load_json(text, "scontrol show partition --json")
    partitions = []
    for raw in data.get("partitions", []):
        nodes = raw.get("nodes")
        node_list = nodes.get("configured") if isinstance(nodes, dict) else nodes
        state = raw.get("partition", {}).get("state") if isinstance(raw.get("partition"), dict) else raw.get("state")
        state_word = (state[0] if isinstance(state, list) and state else state) or "UP"
        tres = raw.get("tres") if isinstance(raw.get("tres"), dict) else {}
        weights_text = tres.get("billing_weights") if tres else raw.get("billing_weights")
        maximums = raw.get("maximums") or {}
        max_time = _number(maximums.get("time")) if maximums else _number(raw.get("max_time_limit"))
        inner = raw.get("partition") if isinstance(raw.get("partition"), dict) else {}
        defaults = raw.get("defaults") if isinstance(raw.get("defaults"), dict) else {}
        flags = list(raw.get("flags") or []) + list(inner.get("flags") or [])
        try:
            weights = parse_billing_weights(weights_text)
        except ValueError as exc:
            raise SlurmParseError(f"partition {raw.get('name')}: {exc}") from None
        partitions.append(
            RawPartition(
                name=raw["name"],
                state=_partition_state(str(state_word)),
                nodes=expand_hostlist(node_list),
                # Slurm reports MaxTime in minutes
                max_time_s=max_time * 60 if max_time is not None else None,
                billing_weights=weights,
                default="DEFAULT" in [str(f).upper() for f in flags or []],
                max_nodes=_number(maximums.get("nodes")) if maximums else _number(raw.get("max_nodes")),
                qos=_qos_name((raw.get("qos") or {}).get("assigned") if isinstance(raw.get("qos"), dict)
                              else raw.get("qos")),
                preempt_mode=_preempt_mode(raw.get("preempt_mode")),
                priority_tier=_tier(_number(raw["priority"].get("tier"))
                                    if isinstance(raw.get("priority"), dict) else None),
                # OpenAPI v0.0.39+: defaults.job is the JobDefaults text, and
                # defaults.partition_memory_per_cpu the partition's DefMemPerCPU
                **job_defaults(defaults.get("job"),
                               _number(defaults.get("partition_memory_per_cpu"))),
            )
        )
    return partitions
