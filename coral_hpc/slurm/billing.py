"""TRES strings and Slurm's billing formula. Pure.

Slurm computes a job's billing as the *sum* over its TRES of weight × amount (the default; sites
with ``PriorityFlags=MAX_TRES`` use a max per node instead, which coral-hpc does not model). The
``billing=`` value Slurm shows in AllocTRES is that sum truncated to an integer.
"""

from __future__ import annotations

import functools
import re

#: Memory units in TRES strings and billing-weight suffixes, in GB.
_MEM_UNITS_GB = {"K": 1 / (1024 * 1024), "M": 1 / 1024, "G": 1.0, "T": 1024.0, "P": 1024.0 * 1024}
_WEIGHT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*([KMGTP]?)\s*$")


def parse_tres(text: str | None) -> dict[str, float]:
    """See :func:`_parse_tres`; cached, since a queue repeats the same few job shapes."""
    return dict(_parse_tres(text))


@functools.lru_cache(maxsize=8192)
def _parse_tres(text: str | None) -> tuple[tuple[str, float], ...]:
    return tuple(_parse_tres_uncached(text).items())


def _parse_tres_uncached(text: str | None) -> dict[str, float]:
    """``"cpu=8,mem=32G,node=1,billing=5,gres/gpu=2,gres/gpu:a100=2"`` → ``{"cpu": 8.0,
    "mem": 32.0 (GB), "node": 1.0, "billing": 5.0, "gres/gpu": 2.0, "gres/gpu:a100": 2.0}``.

    Keys are lower-cased; ``mem`` is converted to GB (a bare number is MB, as Slurm prints it).
    Empty strings, ``(null)`` and ``N/A`` give ``{}``. Raises ValueError on a malformed item.
    """
    result: dict[str, float] = {}
    if not text or text in ("(null)", "N/A"):
        return result
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"TRES item {item!r} is not name=value")
        key = key.strip().lower()
        value = value.strip()
        if key == "mem":
            unit = value[-1].upper() if value and value[-1].isalpha() else "M"
            number = value[:-1] if value and value[-1].isalpha() else value
            result[key] = float(number) * _MEM_UNITS_GB[unit]
        else:
            result[key] = float(value)
    return result


def gpus_in_tres(tres: dict[str, float]) -> tuple[int, str | None]:
    """GPU count and GPU type from a parsed TRES dict; the type is None when untyped or when
    several types are present (then the count is still the total)."""
    total = int(tres.get("gres/gpu", 0))
    types = [key.split(":", 1)[1] for key in tres if key.startswith("gres/gpu:") and tres[key] > 0]
    if not total and types:
        total = int(sum(tres[f"gres/gpu:{t}"] for t in types))
    return total, (types[0] if len(types) == 1 else None)


def parse_billing_weights(text: str | None) -> dict[str, float]:
    """``"CPU=0.05,Mem=0.01G,GRES/gpu:a100=3.0"`` → ``{"cpu": 0.05, "mem": 0.01,
    "gres/gpu:a100": 3.0}``. Keys lower-cased; the ``mem`` weight is per GB (Slurm's default unit
    for a bare weight is per MB, a K/M/G/T suffix names the unit). Raises ValueError when malformed."""
    weights: dict[str, float] = {}
    if not text or text in ("(null)", "N/A"):
        return weights
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        match = _WEIGHT_RE.match(value)
        if not sep or not match:
            raise ValueError(f"TRESBillingWeights item {item!r} is not NAME=NUMBER[K|M|G|T]")
        key = key.strip().lower()
        number, suffix = float(match.group(1)), match.group(2)
        if key == "mem":
            # weight per <unit>; convert to per GB
            number = number / _MEM_UNITS_GB[suffix or "M"]
        elif suffix:
            raise ValueError(f"TRESBillingWeights item {item!r}: a unit suffix is only understood on Mem")
        weights[key] = number
    return weights


def billing_sum(
    weights: dict[str, float],
    gpus: int,
    gpu_type: str | None,
    cpus: float,
    mem_gb: float,
    nodes: int = 1,
) -> float:
    """Slurm's default billing formula: Σ weight × amount over cpu, mem (GB), node, gres/gpu and
    gres/gpu:<type>. A job of typed GPUs has both ``gres/gpu`` and ``gres/gpu:<type>`` TRES, so
    both weights apply when both are set. With no weights at all Slurm bills the CPU count."""
    if not weights:
        return float(cpus)
    total = weights.get("cpu", 0.0) * cpus + weights.get("mem", 0.0) * mem_gb
    total += weights.get("node", 0.0) * nodes + weights.get("gres/gpu", 0.0) * gpus
    if gpu_type:
        total += weights.get(f"gres/gpu:{gpu_type}", 0.0) * gpus
    return total
