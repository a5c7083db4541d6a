"""Prices applied to usage: the deployment's one cost unit, the same formula plans use. Pure.

``models.yaml`` prices a partition either per GPU-hour per GPU type, or ``billing``
(../shared/ARCHITECTURE.md, "Units"):

- per GPU-hour: cost = GPUs × hours × price[partition][GPU type];
- ``billing``: cost = Slurm's billing units of the allocation (AllocTRES ``billing=N``, Slurm's
  TRESBillingWeights sum for the job's whole shape, truncated to an integer as Slurm stores it)
  × hours. A plan prices a replica the same way from the partition's weights and the job shape
  it will ask for (GPUs, cpus_per_gpu × GPUs, mem_per_gpu_gb × GPUs), so predicted and booked
  cost compare like with like.

Usage that no price covers (a partition or GPU type not in ``models.yaml``, a billing-priced run
without a billing TRES) gets cost None and is reported, never priced as zero.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Literal

from coral_hpc.accounting.usage import Usage
from coral_hpc.config import Deployment
from coral_hpc.site_prices import partition_prices

PriceUnit = Literal["gpu_hour", "billing"]


@dataclass(frozen=True)
class Pricing:
    """The deployment's prices: per (partition, GPU type) per GPU-hour, or Slurm billing."""

    unit: PriceUnit
    #: (partition, GPU type) → price per GPU-hour; empty under ``billing``
    gpu_hour_prices: dict[tuple[str, str], float]

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> Pricing:
        """Read the prices from a validated ``models.yaml``."""
        prices: dict[tuple[str, str], float] = {}
        for part in deployment.cluster.partitions:
            for gpu_type, price in (partition_prices(deployment, part) or {}).items():
                prices[(part.name, gpu_type)] = float(price)
        return cls(unit=deployment.cluster.price_unit, gpu_hour_prices=prices)

    def cost(self, piece: Usage) -> float | None:
        """Cost of one usage slice in the deployment's unit; None when no price covers it."""
        if self.unit == "billing":
            billing = piece.billing_seconds
            return None if billing is None else billing / 3600.0
        price = self.gpu_hour_prices.get((piece.run.partition, piece.run.gpu_type))
        return None if price is None else piece.gpu_seconds * price / 3600.0

    def unpriced_reason(self, piece: Usage) -> str:
        """Why :meth:`cost` gave None for ``piece`` (for the report's warnings)."""
        run = piece.run
        if self.unit == "billing":
            return f"job {run.job_id} on {run.partition}: sacct recorded no billing TRES"
        return (
            f"job {run.job_id}: no price for GPU type {run.gpu_type!r} on partition "
            f"{run.partition!r} in models.yaml"
        )


@dataclass
class Totals:
    """Summed figures of a group of usage slices."""

    gpu_seconds: int = 0
    billing_seconds: float = 0.0
    #: cost of the priced slices; None only when nothing in the group was priced
    cost: float | None = None
    #: GPU-seconds no price covered (they are in gpu_seconds, not in cost)
    unpriced_gpu_seconds: int = 0

    def add(self, piece: Usage, cost: float | None) -> None:
        self.gpu_seconds += piece.gpu_seconds
        self.billing_seconds += piece.billing_seconds or 0.0
        if cost is None:
            self.unpriced_gpu_seconds += piece.gpu_seconds
        else:
            self.cost = (self.cost or 0.0) + cost

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def billing_unit_hours(self) -> float:
        return self.billing_seconds / 3600.0

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": self.gpu_hours,
            "billing_unit_hours": self.billing_unit_hours,
            "cost": self.cost,
            "unpriced_gpu_seconds": self.unpriced_gpu_seconds,
        }


def group(
    pieces: Iterable[Usage], pricing: Pricing, key: Callable[[Usage], Hashable]
) -> dict[Hashable, Totals]:
    """Sum usage slices by ``key`` (e.g. model, (partition, GPU type), day), in first-seen order."""
    out: dict[Hashable, Totals] = defaultdict(Totals)
    for piece in pieces:
        out[key(piece)].add(piece, pricing.cost(piece))
    return dict(out)
