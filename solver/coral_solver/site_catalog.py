"""A site's own catalogue: GPU types and model entries that add to or override the shipped ones.

``catalog:`` in models.yaml names a YAML file of this shape
(``examples/catalogs/site-catalog.yaml``)::

    gpus:
      h100-nvl:                 # a new GPU type: every field of profiles/gpus.yaml
        memory_gb: 94
        ...
      a100-80g:                 # a shipped type: only the fields given change
        mem_bw_gbs: 1935
    models:
      our-lab-13b:              # a new architecture: every field of profiles/models.yaml
        ...

Keys are what models.yaml and Slurm name them (GPU keys are normalised as the shipped ones:
lowercase, ``_`` -> ``-``); a key that is a shipped alias overrides the shipped entry it names.
Every problem names the file, the line and the field. Pure: the file in, a :class:`SiteCatalog`
out; :func:`coral_solver.catalog.use_site_catalog` puts it in force for this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coral_solver import catalog
from coral_solver.catalog import CatalogError, GpuSpec, ModelArch

__all__ = ["GPU_FIELDS", "MODEL_FIELDS", "SiteCatalog", "read_site_catalog"]

#: fields a GPU entry may carry (those of profiles/gpus.yaml; ``source``: where the figures are
#: from, e.g. the datasheet's name or URL — kept for people, not read)
GPU_FIELDS = ("description", "source", "aliases", "memory_gb", "mem_bw_gbs", "fp16_tflops",
              "bf16", "fp8", "interconnect", "link_bw_gbs", "compute_capability", "class",
              "price_per_gpu_hour")
#: fields a model entry may carry (those of profiles/models.yaml)
MODEL_FIELDS = ("description", "source", "aliases", "layers", "hidden", "q_heads", "kv_heads",
                "head_dim", "ffn", "experts", "active_experts", "params_b", "active_params_b",
                "vocab", "max_context", "weight_gb", "kv_bytes_per_token", "quantization",
                "tied_embeddings")

Lines = dict[tuple[str, str | None], int]


@dataclass
class SiteCatalog:
    """What one site catalogue file adds or overrides."""

    path: Path
    gpus: dict[str, GpuSpec]
    gpu_aliases: dict[str, str]
    models: dict[str, ModelArch]
    model_aliases: dict[str, str]
    overridden: tuple[str, ...] = ()  # shipped entries this file changes ('gpus.a100', ...)
    _merged: dict[tuple[str, Path], tuple[dict, dict]] = field(default_factory=dict, repr=False)

    def merged(self, kind: str, profiles: Path, shipped: tuple[dict, dict]
               ) -> tuple[dict, dict]:
        """(entries, aliases) of the shipped ``kind`` ('gpus' | 'models') with this file's on
        top; computed once per profiles folder."""
        key = (kind, profiles)
        if key not in self._merged:
            own = (self.gpus, self.gpu_aliases) if kind == "gpus" else (self.models,
                                                                         self.model_aliases)
            entries = {**shipped[0], **own[0]}
            # a shipped alias that now names a site entry of its own stops naming the shipped one
            aliases = {a: k for a, k in shipped[1].items() if a not in own[0]}
            aliases.update(own[1])
            self._merged[key] = (entries, aliases)
        return self._merged[key]


def _problem(path: Path, line: int | None, message: str) -> CatalogError:
    return CatalogError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def _compose(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int | None, Lines]]]:
    """(the parsed file, per section its line numbers: (entry, field) -> line, 1-based)."""
    if not path.is_file():
        raise CatalogError(f"{path}: file not found (models.yaml catalog:)")
    text = path.read_text()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise CatalogError(f"{path}:1: expected a mapping with 'gpus:' and/or 'models:'")
    lines: dict[str, tuple[int | None, Lines]] = {}
    for key_node, section in node.value:
        own: Lines = {}
        if isinstance(section, yaml.MappingNode):
            for entry_key, entry in section.value:
                name = str(entry_key.value)
                own[(name, None)] = entry_key.start_mark.line + 1
                if isinstance(entry, yaml.MappingNode):
                    for field_key, _ in entry.value:
                        own[(name, str(field_key.value))] = field_key.start_mark.line + 1
        lines[str(key_node.value)] = (key_node.start_mark.line + 1, own)
    return data, lines


def read_site_catalog(path: str | Path, profiles: Path | None = None) -> SiteCatalog:
    """Read the site catalogue at ``path`` over the shipped catalogue (``profiles``: its folder,
    default the installed one). Raises :class:`CatalogError` naming the file, line and field."""
    path = Path(path)
    data, lines = _compose(path)
    for section in data:
        if section not in ("gpus", "models"):
            raise _problem(path, lines.get(str(section), (None,))[0],
                           f"unknown section {section!r}; a site catalogue has 'gpus:' and/or "
                           "'models:'")
    profiles = catalog._dir(profiles)
    site = SiteCatalog(path, {}, {}, {}, {})
    overridden: list[str] = []
    gpus_raw = catalog._raw(profiles / "gpus.yaml")
    shipped_gpus, shipped_gpu_aliases = catalog._gpus(profiles)
    no_lines: tuple[int | None, Lines] = (None, {})
    gpu_lines = lines.get("gpus", no_lines)
    for raw_key, entry in _section(path, data, "gpus", gpu_lines[0]).items():
        key = catalog._normalise(str(raw_key))
        entry_lines = {(key, f): n for (k, f), n in gpu_lines[1].items() if k == str(raw_key)}
        _check_fields(path, "gpus", key, entry, GPU_FIELDS, entry_lines)
        key = shipped_gpu_aliases.get(key, key)  # a shipped alias overrides the shipped entry
        base = _shipped_entry(gpus_raw, key, catalog._normalise)
        if base is not None:
            overridden.append(f"gpus.{key}")
            entry_lines = {(key, f): n for (_, f), n in entry_lines.items()}
        merged = {**(base or {}), **entry}
        site.gpus[key] = catalog.gpu_from_entry(path, key, merged,
                                                catalog._calibrated_gpus(profiles), entry_lines)
        for alias in entry.get("aliases") or []:
            site.gpu_aliases[catalog._normalise(str(alias))] = key
    models_raw = catalog._raw(profiles / "models.yaml")
    _, shipped_model_aliases = catalog._models(profiles)
    model_lines = lines.get("models", no_lines)
    for raw_key, entry in _section(path, data, "models", model_lines[0]).items():
        key = str(raw_key).strip().lower()
        entry_lines = {(key, f): n for (k, f), n in model_lines[1].items() if k == str(raw_key)}
        _check_fields(path, "models", key, entry, MODEL_FIELDS, entry_lines)
        key = shipped_model_aliases.get(key, key)
        base = _shipped_entry(models_raw, key, lambda k: k.strip().lower())
        if base is not None:
            overridden.append(f"models.{key}")
            entry_lines = {(key, f): n for (_, f), n in entry_lines.items()}
        site.models[key] = catalog.model_from_entry(path, key, {**(base or {}), **entry},
                                                    entry_lines)
        for alias in entry.get("aliases") or []:
            site.model_aliases[str(alias).strip().lower()] = key
    site.overridden = tuple(overridden)
    return site


def _section(path: Path, data: dict[str, Any], name: str, line: int | None) -> dict[str, Any]:
    section = data.get(name)
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise _problem(path, line, f"{name}: expected a mapping of name -> fields")
    return section


def _shipped_entry(raw: dict[str, Any], key: str, normalise) -> dict[str, Any] | None:
    for raw_key, entry in raw.items():
        if normalise(str(raw_key)) == key and isinstance(entry, dict):
            return entry
    return None


def _check_fields(path: Path, section: str, key: str, entry: Any, valid: tuple[str, ...],
                  lines: Lines) -> None:
    """An entry is a mapping of known fields: a misspelt field would otherwise be ignored and
    the shipped value (or a missing-field error) silently take its place."""
    if not isinstance(entry, dict):
        raise _problem(path, lines.get((key, None)),
                       f"{section}.{key}: expected a mapping of fields")
    for name in entry:
        if name not in valid:
            raise _problem(path, lines.get((key, str(name))) or lines.get((key, None)),
                           f"{section}.{key}.{name}: unknown field; valid: {', '.join(valid)}")
