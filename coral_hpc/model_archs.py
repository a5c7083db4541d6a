"""Each model's architecture, for the performance model: the catalogue entry ``architecture:``
names, or what the model's own ``config.json`` says.

:func:`derive_models` reads the config.json of every model without ``architecture:`` (found by
:mod:`coral_hpc.config.weights`), derives its architecture
(:func:`coral_solver.catalog.arch_from_config_json`) and registers it with the catalogue under
the model's source, the key :attr:`~coral_hpc.config.ModelConfig.arch_key` gives — so the
planner, the performance model and the sim engine read it as they read a catalogue entry.
Commands that plan or check against the performance model (validate, plan, simulate, profile,
serve) call it right after loading models.yaml; the configuration package itself stays free of
the solver (the decide step imports it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coral_hpc.config import Deployment, hf_home_of
from coral_hpc.config.weights import (
    ConfigJsonMissing,
    WeightsError,
    find_config_json,
    hub_caches,
    read_config_json,
)
from coral_hpc.errors import ConfigError
from coral_hpc.model_lengths import read_lengths
from coral_solver import catalog

if TYPE_CHECKING:
    from coral_solver.hf_config import HfModel


@dataclass(frozen=True)
class Derivation:
    """Where a model's architecture came from and what was derived."""

    source: str  # the model's source: path or Hugging Face id
    config_path: Path | None  # the config.json read; None when the catalogue knows the id
    model: HfModel | None  # the derivation; None when taken from the catalogue

    @property
    def generic(self) -> bool:
        """True when the model_type has no family rules: a generic dense estimate."""
        return self.model is not None and self.model.generic


def derive_from_file(source: str, path: Path) -> HfModel:
    """The architecture of ``source`` from its config.json at ``path``, registered with the
    catalogue under ``source``. Raises :class:`WeightsError` naming the file and field."""
    config = read_config_json(path)
    key = source.strip().lower()
    try:
        model = catalog.arch_from_config_json(config, name=key)
    except (ValueError, TypeError) as exc:  # HfConfigError, or a field of the wrong type
        message = str(exc).removeprefix("config.json: ")
        raise WeightsError(f"{path}: {message}") from None
    catalog.register_derived(key, model)
    return model


def derive(source: str, *, hubs: list[Path], state_path: Path | None,
           base_dir: Path | None = None) -> Derivation:
    """Find and read ``source``'s config.json and register its architecture; a source with no
    config.json anywhere that the catalogue knows by this id gets the catalogue's entry.
    Raises :class:`WeightsError` naming the file and field, or every place looked."""
    path, places = find_config_json(source, hubs=hubs, state_path=state_path,
                                    base_dir=base_dir)
    if path is not None:
        return Derivation(source, path, derive_from_file(source, path))
    try:
        catalog.model_arch(source)
    except KeyError:
        pass
    else:
        return Derivation(source, None, None)
    raise ConfigJsonMissing(
        f"no config.json for {source!r}: looked at {', '.join(str(p) for p in places)}; "
        "run `coral-hpc stage` to download it (and keep a copy for this host), or name a "
        f"catalogue entry with architecture: ({', '.join(sorted(catalog.load_models()))})"
    )


def apply_site_catalog(deployment: Deployment) -> list[str]:
    """Put ``deployment``'s site catalogue (``catalog:``) in force for this process, or none
    when it names none; one problem line (models.yaml's ``catalog`` field, then the catalogue's
    own file, line and field) when it cannot be read."""
    if deployment.catalog is None:
        catalog.use_site_catalog(None)
        return []
    try:
        site = catalog.read_site_catalog(deployment.catalog)
    except catalog.CatalogError as exc:
        catalog.use_site_catalog(None)
        return [deployment.problem(("catalog",), str(exc))]
    catalog.use_site_catalog(site)
    from coral_hpc.site_prices import unpriced_catalog_types

    return unpriced_catalog_types(deployment)


def derive_models(deployment: Deployment) -> list[str]:
    """Put the deployment's site catalogue in force (:func:`apply_site_catalog`), then derive
    and register the architecture of every model of ``deployment`` without ``architecture:``
    and read every model's observed lengths (:func:`coral_hpc.model_lengths.read_lengths`);
    one problem line (file, line, field) per model that cannot be derived or read."""
    problems = apply_site_catalog(deployment)
    if problems:
        return problems  # the catalogue may hold the very entries the models name
    problems = read_lengths(deployment)
    hubs = hub_caches(hf_home_of(deployment))
    # relative folders mean "beside this models.yaml", as every other path in it
    base_dir = (Path(os.path.abspath(deployment._source)).parent
                if deployment._source != "<string>" else None)
    for index, model in enumerate(deployment.models):
        if model.architecture is not None:
            continue
        try:
            found = derive(model.source, hubs=hubs, state_path=deployment.state_path,
                           base_dir=base_dir)
        except WeightsError as exc:
            problems.append(deployment.problem(("models", index, "source"), str(exc)))
            continue
        deployment._derived[model.name] = found
        if found.model is not None:
            problems += _kind_problems(deployment, index, found)
    return problems


def _kind_problems(deployment: Deployment, index: int, found: Derivation) -> list[str]:
    """A model whose config.json says it embeds (vLLM's suffix rule, coral_solver.hf_encoder)
    but whose models.yaml entry plans it as generating, or the other way round."""
    model = deployment.models[index]
    assert found.model is not None
    pools = found.model.arch.pooling
    where = f"{found.config_path} names architecture {_first_arch(found.config_path)}"
    if model.task is None and pools and not model.slo.embedding:
        return [deployment.problem(("models", index, "slo"),
                f"{where}, an embedding model (vLLM's pooling runner, /v1/embeddings): its SLO "
                "is one latency per request, slo: {latency_ms: N}, and its mix has no "
                "output_tokens")]
    if model.task is None and not pools and model.slo.embedding:
        return [deployment.problem(("models", index, "slo", "latency_ms"),
                f"{where}, which generates text; give slo: {{ttft_s: N, tpot_s: N}}, or "
                "task: embed to serve it as an embedding model (e.g. Qwen3-Embedding)")]
    if model.task == "generate" and pools:
        return [deployment.problem(("models", index, "task"),
                f"{where}, an embedding model: vLLM cannot generate text with it "
                "(\"Embedding models do not support --runner generate\"); use task: embed")]
    return []


def _first_arch(path: Path | None) -> str:
    """The first of ``architectures`` in the config.json at ``path`` (for messages)."""
    try:
        archs = read_config_json(path).get("architectures") if path is not None else None
    except WeightsError:
        archs = None
    return repr(archs[0]) if isinstance(archs, list) and archs else "(none)"


def derived_deployment(deployment: Deployment) -> Deployment:
    """``deployment`` with its models' architectures derived; raises :class:`ConfigError` with
    every model that cannot be (exit 2 in the CLI)."""
    problems = derive_models(deployment)
    if problems:
        raise ConfigError(deployment._source, problems)
    return deployment


def derivation(deployment: Deployment, name: str) -> Derivation | None:
    """Where model ``name``'s architecture came from; None for an ``architecture:`` override or
    a deployment not yet derived."""
    found = deployment._derived.get(name)
    return found if isinstance(found, Derivation) else None


def ensure_arch(name: str) -> None:
    """Make architecture ``name`` known in this process: a catalogue entry, or a model source
    whose config.json this process can find (an engine started by a job, with ``HF_HOME`` set).
    Leaves a name with no config.json anywhere unknown: the catalogue's lookup then says so;
    raises :class:`WeightsError` when the config.json found cannot be read or understood."""
    try:
        catalog.model_arch(name)
        return
    except KeyError:
        pass
    try:
        derive(name, hubs=hub_caches(), state_path=None)
    except ConfigJsonMissing:
        pass
