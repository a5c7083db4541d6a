"""Per-GPU-hour prices of a partition: its own ``price:`` map, or with ``price: catalog`` the
site catalogue's ``price_per_gpu_hour`` of each GPU type (docs/catalog.md).

Read by the planner's inputs and by ``cost``, so plans and reports price a GPU-hour alike.
"""

from __future__ import annotations

from pathlib import Path

from coral_hpc.config import Deployment
from coral_hpc.config.cluster import PartitionConfig
from coral_hpc.errors import ConfigError
from coral_solver import catalog


def _catalogue_in_force(deployment: Deployment) -> None:
    """Put the deployment's site catalogue in force unless it already is (a command that did
    not derive the models first: ``cost``)."""
    from coral_hpc.model_archs import apply_site_catalog

    site = catalog.site_catalog()
    if deployment.catalog is not None and (site is None
                                           or site.path != Path(deployment.catalog)):
        problems = apply_site_catalog(deployment)
        if problems:
            raise ConfigError(deployment._source, problems)


def catalogue_prices() -> dict[str, float]:
    """GPU type (canonical name and every alias) -> price per GPU-hour, of the types the
    catalogue in force prices."""
    gpus = catalog.load_gpus()
    prices = {name: spec.price_per_gpu_hour for name, spec in gpus.items()
              if spec.price_per_gpu_hour is not None}
    for alias, name in catalog.gpu_aliases().items():
        if name in prices:
            prices.setdefault(alias, prices[name])
    return prices


def partition_prices(deployment: Deployment, part: PartitionConfig) -> dict[str, float] | None:
    """GPU type -> price per GPU-hour on ``part``; None under ``price: billing``. With ``price:
    catalog`` the site catalogue's prices, under the names ``gpu_types`` spells them too.
    Raises :class:`ConfigError` when the catalogue cannot be read."""
    if isinstance(part.price, dict):
        return dict(part.price)
    if part.price != "catalog":
        return None
    _catalogue_in_force(deployment)
    prices = catalogue_prices()
    for gpu in part.gpu_types:
        name = catalog.canonical_gpu_name(gpu)
        if name is not None and name in prices:
            prices.setdefault(gpu, prices[name])
    return prices


def unpriced_catalog_types(deployment: Deployment) -> list[str]:
    """One problem line per ``price: catalog`` partition naming GPU types the catalogue in force
    does not price."""
    problems = []
    prices = catalogue_prices()
    for index, part in enumerate(deployment.cluster.partitions):
        if part.price != "catalog":
            continue
        missing = [g for g in part.gpu_types
                   if g not in prices and catalog.canonical_gpu_name(g) not in prices]
        if missing:
            problems.append(deployment.problem(
                ("cluster", "partitions", index, "price"),
                f"'catalog', but the site catalogue {deployment.catalog} gives no "
                f"price_per_gpu_hour for GPU type(s) {missing}; add it there or give prices "
                "here"))
    return problems
