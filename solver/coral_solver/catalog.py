"""GPU specs and model architectures: the static inputs of the performance model.

Read from ``profiles/gpus.yaml``, ``profiles/models.yaml`` and ``profiles/calibration.yaml`` (which
GPUs have their own fitted efficiency factors). Names are Slurm GRES type names for GPUs
(lowercase, hyphenated; a few aliases accepted) and ``architecture:`` keys for models.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from coral_solver.hf_config import HfModel
    from coral_solver.site_catalog import SiteCatalog

# libyaml's C loader parses the profile files ~10x faster (the sim engine and every plan load
# them at start-up); fall back to the pure-Python safe loader where libyaml is missing.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

from coral_solver.resources import profiles_dir

#: bytes per parameter of a served checkpoint, by quantization. int4: AWQ/GPTQ 4-bit with one fp16
#: scale and one 4-bit zero point per group of 128 (coral_solver.hf_config reads the real group)
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": (4 + 20 / 128) / 8,
                   "mxfp4": 4.25 / 8}
INTERCONNECTS = ("nvlink", "pcie")
#: highest price per GPU-hour a catalogue may give: models.yaml's own bound for partition prices
#: (coral_hpc.config.cluster.MAX_PRICE, which says why)
MAX_PRICE_PER_GPU_HOUR = 10_000.0


class CatalogError(ValueError):
    """A profiles file is missing, malformed, or names something invalid (message says where)."""


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet specs of one GPU type (per GPU)."""

    name: str
    memory_gb: float
    mem_bw_gbs: float
    fp16_tflops: float
    bf16: bool
    fp8: bool
    interconnect: str  # 'nvlink' | 'pcie'
    link_bw_gbs: float
    compute_capability: float
    calibrated: bool
    gpu_class: str = "hbm"  # efficiency class used when the GPU has no fitted factors
    #: the site's price per GPU-hour of this type (a site catalogue's; partitions with
    #: ``price: catalog`` use it); None: not priced here
    price_per_gpu_hour: float | None = None


@dataclass(frozen=True)
class ModelArch:
    """Architecture of one served model, as vLLM loads it."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense FFN width, or one expert's width for MoE
    experts: int
    active_experts: int
    params_b: float
    active_params_b: float
    vocab: int
    max_context: int
    weight_bytes: float  # total bytes of weights as served (bf16 2/param, mxfp4 ...)
    kv_bytes_per_token: int  # all layers, K and V, 16-bit
    quantization: str  # 'bf16' | 'mxfp4' | 'fp8' ...
    tied_embeddings: bool = False
    #: an embedding (pooling) model: one forward pass over the prompt, no decode, no lm_head
    #: (vLLM's pooling runner; coral_solver.hf_encoder, coral_solver.perf_pooling)
    pooling: bool = False

    @property
    def embedding_bytes(self) -> float:
        """Bytes of the input embedding plus lm_head (kept in 16 bit even in quantised models)."""
        return self.vocab * self.hidden * 2.0 * (1 if self.tied_embeddings else 2)

    @property
    def weights_per_layer_bytes(self) -> float:
        """(Weights minus embeddings/lm_head) / layers: the bytes one transformer layer holds."""
        return max(self.weight_bytes - self.embedding_bytes, 0.0) / self.layers

    @property
    def attention_params_per_layer(self) -> float:
        """Q, K, V and O projection parameters of one layer."""
        return float(self.hidden * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads))

    @property
    def expert_bytes_per_layer(self) -> float:
        """Bytes of all routed experts of one layer (0 for dense models)."""
        if not self.experts:
            return 0.0
        per_param = BYTES_PER_PARAM.get(self.quantization, 2.0)
        expert_bytes = self.experts * 3.0 * self.hidden * self.ffn * per_param
        return min(expert_bytes, self.weights_per_layer_bytes)

    @property
    def active_params_per_layer(self) -> float:
        """Parameters one token touches in one layer (excluding embeddings/lm_head)."""
        embed_params = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return max(self.active_params_b * 1e9 - embed_params, 0.0) / self.layers

    @property
    def is_moe(self) -> bool:
        """True for mixture-of-experts models."""
        return self.experts > 0


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CatalogError(f"{path}: file not found")
    try:
        data = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: expected a mapping of name -> fields at the top level")
    return data


def _at(path: Path, lines: dict[tuple[str, str | None], int] | None, key: str,
        field: str | None = None) -> str:
    """``path`` (shipped files) or ``path:line`` (a site catalogue: the field's own line, else
    its entry's), the prefix of every problem with an entry."""
    if not lines:
        return str(path)
    line = lines.get((key, field)) or lines.get((key, None))
    return f"{path}:{line}" if line else str(path)


def _field(path: Path, key: str, entry: dict[str, Any], field: str, kind: type, default: Any = None,
           lines: dict[tuple[str, str | None], int] | None = None):
    if field not in entry:
        if default is not None:
            return default
        raise CatalogError(f"{_at(path, lines, key)}: entry '{key}': missing field '{field}'")
    value = entry[field]
    try:
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if isinstance(value, bool) or (kind in (int, float) and isinstance(value, str)):
            raise TypeError  # yes/no is not a number; nor is "fast" (float("1e3") would pass)
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise CatalogError(
            f"{_at(path, lines, key, field)}: entry '{key}': field '{field}' = {value!r} is not "
            f"a {kind.__name__}"
        ) from exc


@functools.lru_cache(maxsize=8)
def _calibrated_gpus(profiles: Path) -> frozenset[str]:
    path = profiles / "calibration.yaml"
    if not path.is_file():
        return frozenset()
    gpus = _load_yaml(path).get("gpus") or {}
    return frozenset(_normalise(g) for g in gpus)


def gpu_from_entry(path: Path, key: str, entry: Any, calibrated: frozenset[str],
                   lines: dict[tuple[str, str | None], int] | None = None) -> GpuSpec:
    """One GPU type from its entry's fields; :class:`CatalogError` naming the file (and the
    line, where ``lines`` has it), the entry and the field otherwise."""
    if not isinstance(entry, dict):
        raise CatalogError(f"{_at(path, lines, key)}: entry '{key}': expected a mapping of fields")
    # fields in the order the files list them, so the first problem reported is the first
    memory_gb = _field(path, key, entry, "memory_gb", float, lines=lines)
    mem_bw_gbs = _field(path, key, entry, "mem_bw_gbs", float, lines=lines)
    fp16_tflops = _field(path, key, entry, "fp16_tflops", float, lines=lines)
    bf16 = _field(path, key, entry, "bf16", bool, lines=lines)
    fp8 = _field(path, key, entry, "fp8", bool, lines=lines)
    interconnect = _field(path, key, entry, "interconnect", str, lines=lines)
    if interconnect not in INTERCONNECTS:
        raise CatalogError(
            f"{_at(path, lines, key, 'interconnect')}: entry '{key}': interconnect "
            f"'{interconnect}' is not one of {INTERCONNECTS}"
        )
    spec = GpuSpec(
        name=key, memory_gb=memory_gb, mem_bw_gbs=mem_bw_gbs, fp16_tflops=fp16_tflops,
        bf16=bf16, fp8=fp8, interconnect=interconnect,
        link_bw_gbs=_field(path, key, entry, "link_bw_gbs", float, lines=lines),
        compute_capability=_field(path, key, entry, "compute_capability", float, lines=lines),
        calibrated=key in calibrated,
        gpu_class=_field(path, key, entry, "class", str, "hbm", lines=lines),
        price_per_gpu_hour=(_field(path, key, entry, "price_per_gpu_hour", float, lines=lines)
                            if "price_per_gpu_hour" in entry else None),
    )
    price = spec.price_per_gpu_hour
    if price is not None and not 0 <= price <= MAX_PRICE_PER_GPU_HOUR:
        raise CatalogError(f"{_at(path, lines, key, 'price_per_gpu_hour')}: entry '{key}': field "
                           f"'price_per_gpu_hour' must be within 0..{MAX_PRICE_PER_GPU_HOUR:g}, "
                           f"got {price:g}")
    for field in ("memory_gb", "mem_bw_gbs", "fp16_tflops", "link_bw_gbs", "compute_capability"):
        if not getattr(spec, field) > 0:
            raise CatalogError(f"{_at(path, lines, key, field)}: entry '{key}': field '{field}' "
                               f"must be > 0, got {getattr(spec, field)!r}")
    return spec


@functools.lru_cache(maxsize=8)
def _raw(path: Path) -> dict[str, Any]:
    """A shipped catalogue file as parsed (a site catalogue overrides its entries field by
    field)."""
    return _load_yaml(path)


@functools.lru_cache(maxsize=8)
def _gpus(profiles: Path) -> tuple[dict[str, GpuSpec], dict[str, str]]:
    path = profiles / "gpus.yaml"
    calibrated = _calibrated_gpus(profiles)
    specs: dict[str, GpuSpec] = {}
    aliases: dict[str, str] = {}
    for raw_key, entry in _raw(path).items():
        key = _normalise(str(raw_key))
        specs[key] = gpu_from_entry(path, key, entry, calibrated)
        for alias in entry.get("aliases") or []:
            aliases[_normalise(str(alias))] = key
    return specs, aliases


def model_from_entry(path: Path, key: str, entry: Any,
                     lines: dict[tuple[str, str | None], int] | None = None) -> ModelArch:
    """One model architecture from its entry's fields; :class:`CatalogError` naming the file
    (and the line, where ``lines`` has it), the entry and the field otherwise."""
    if not isinstance(entry, dict):
        raise CatalogError(f"{_at(path, lines, key)}: entry '{key}': expected a mapping of fields")

    def get(field: str, kind: type, default: Any = None) -> Any:
        return _field(path, key, entry, field, kind, default, lines=lines)

    quantization = get("quantization", str)
    if quantization not in BYTES_PER_PARAM:
        raise CatalogError(
            f"{_at(path, lines, key, 'quantization')}: entry '{key}': quantization "
            f"'{quantization}' is not one of {sorted(BYTES_PER_PARAM)}"
        )
    layers = get("layers", int)
    kv_heads = get("kv_heads", int)
    head_dim = get("head_dim", int)
    # GQA: K and V, every layer, kv_heads x head_dim, 16-bit (docs/catalog-sources.md)
    kv_default = 2 * layers * kv_heads * head_dim * 2
    arch = ModelArch(
        name=key,
        layers=layers,
        hidden=get("hidden", int),
        q_heads=get("q_heads", int),
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=get("ffn", int),
        experts=get("experts", int, 0),
        active_experts=get("active_experts", int, 0),
        params_b=get("params_b", float),
        active_params_b=get("active_params_b", float),
        vocab=get("vocab", int),
        max_context=get("max_context", int),
        weight_bytes=get("weight_gb", float) * 1e9,
        kv_bytes_per_token=get("kv_bytes_per_token", int, kv_default),
        quantization=quantization,
        tied_embeddings=get("tied_embeddings", bool, False),
    )
    for field in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "ffn", "params_b",
                  "active_params_b", "vocab", "max_context", "weight_bytes",
                  "kv_bytes_per_token"):
        if not getattr(arch, field) > 0:
            name = "weight_gb" if field == "weight_bytes" else field
            raise CatalogError(f"{_at(path, lines, key, name)}: entry '{key}': field '{name}' "
                               f"must be > 0, got {entry.get(name)!r}")
    if arch.experts and not 0 < arch.active_experts <= arch.experts:
        raise CatalogError(f"{_at(path, lines, key, 'active_experts')}: entry '{key}': field "
                           f"'active_experts' must be 1..experts ({arch.experts}), got "
                           f"{arch.active_experts}")
    return arch


@functools.lru_cache(maxsize=8)
def _models(profiles: Path) -> tuple[dict[str, ModelArch], dict[str, str]]:
    path = profiles / "models.yaml"
    archs: dict[str, ModelArch] = {}
    aliases: dict[str, str] = {}
    for raw_key, entry in _raw(path).items():
        key = str(raw_key).strip().lower()
        archs[key] = model_from_entry(path, key, entry)
        for alias in entry.get("aliases") or []:
            aliases[str(alias).strip().lower()] = key
    return archs, aliases


def _dir(profiles: Path | None) -> Path:
    return Path(profiles).resolve() if profiles is not None else profiles_dir().resolve()


#: The site catalogue in force in this process (models.yaml ``catalog:``), or None: its GPU
#: types and model entries add to or override the shipped ones in every lookup below. Set by
#: :func:`use_site_catalog` (the config layer, when it loads models.yaml).
_SITE: SiteCatalog | None = None


def use_site_catalog(site: SiteCatalog | None) -> None:
    """Put ``site`` (:func:`coral_solver.site_catalog.read_site_catalog`) in force for every
    later lookup of this process; None: the shipped catalogue alone."""
    global _SITE
    _SITE = site


def read_site_catalog(path: str | Path) -> SiteCatalog:
    """A site catalogue file read over the shipped catalogue
    (:func:`coral_solver.site_catalog.read_site_catalog`): the hook the config layer and the
    sim engine call, here because the import contract lets ``coral_hpc`` read the catalogue."""
    from coral_solver import site_catalog  # site_catalog imports this module

    return site_catalog.read_site_catalog(path)


def site_catalog() -> SiteCatalog | None:
    """The site catalogue in force, or None."""
    return _SITE


def _gpu_tables(profiles: Path | None) -> tuple[dict[str, GpuSpec], dict[str, str]]:
    where = _dir(profiles)
    shipped = _gpus(where)
    return shipped if _SITE is None else _SITE.merged("gpus", where, shipped)


def _model_tables(profiles: Path | None) -> tuple[dict[str, ModelArch], dict[str, str]]:
    where = _dir(profiles)
    shipped = _models(where)
    return shipped if _SITE is None else _SITE.merged("models", where, shipped)


def catalogue_files() -> str:
    """Where GPU types and architectures are looked up, for messages: the shipped files and the
    site catalogue in force."""
    shipped = "profiles/gpus.yaml, profiles/models.yaml"
    return shipped if _SITE is None else f"{shipped} and the site catalogue {_SITE.path}"


def load_gpus(profiles: Path | None = None) -> dict[str, GpuSpec]:
    """All GPU specs by canonical name (a fresh dict; the specs themselves are frozen)."""
    return dict(_gpu_tables(profiles)[0])


def load_models(profiles: Path | None = None) -> dict[str, ModelArch]:
    """All model architectures by canonical name: the catalogue's, then every one derived from a
    model's own config.json in this process (:func:`register_derived`)."""
    archs = dict(_model_tables(profiles)[0])
    archs.update({key: model.arch for key, model in _DERIVED.items()})
    return archs


def gpu_aliases(profiles: Path | None = None) -> dict[str, str]:
    """Every GPU alias -> its canonical type (a fresh dict)."""
    return dict(_gpu_tables(profiles)[1])


def canonical_gpu_name(name: str, profiles: Path | None = None) -> str | None:
    """The canonical GPU type for ``name`` or one of its aliases; None when unknown."""
    specs, aliases = _gpu_tables(profiles)
    key = _normalise(name)
    if key in specs:
        return key
    return aliases.get(key)


def gpu_spec(name: str, profiles: Path | None = None) -> GpuSpec:
    """The spec of GPU type ``name`` (aliases accepted); KeyError listing valid names otherwise."""
    specs, _ = _gpu_tables(profiles)
    key = canonical_gpu_name(name, profiles)
    if key is None:
        raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(sorted(specs))}")
    return specs[key]


def model_arch(name: str, profiles: Path | None = None) -> ModelArch:
    """The architecture ``name`` (or a Hugging Face id alias); KeyError listing valid names."""
    key = name.strip().lower()
    archs, aliases = _model_tables(profiles)
    # a catalogue entry's own name always means the entry (what `architecture:` names); a
    # model's own config.json outranks a catalogue alias of its id
    if key not in archs and key in _DERIVED:
        return _DERIVED[key].arch
    key = key if key in archs else aliases.get(key, "")
    if key not in archs:
        raise KeyError(f"unknown model architecture {name!r}; known: {', '.join(sorted(archs))}")
    return archs[key]


#: Architectures derived from models' own config.json, by lowercased source (path or HF id).
#: Process-wide, like the catalogue's cache: the config layer registers a deployment's models
#: when it loads models.yaml, so every later ``model_arch(source)`` finds them.
_DERIVED: dict[str, HfModel] = {}


def register_derived(key: str, model: HfModel) -> ModelArch:
    """Make ``model`` (from :func:`arch_from_config_json`) the architecture ``key`` answers to in
    :func:`model_arch`; its ``arch.name`` must be ``key`` lowercased. Returns its arch."""
    norm = key.strip().lower()
    if model.arch.name != norm:
        raise ValueError(f"derived architecture {model.arch.name!r} registered as {norm!r}")
    _DERIVED[norm] = model
    return model.arch


def derived_model(name: str) -> HfModel | None:
    """The derivation behind architecture ``name`` when it came from a config.json, else None."""
    return _DERIVED.get(name.strip().lower())


def arch_from_config_json(source: str | Path | dict[str, Any], name: str | None = None
                          ) -> HfModel:
    """A model outside the catalogue, from its own Hugging Face ``config.json`` (a path to the
    file or its folder, or the parsed dict): a :class:`coral_solver.hf_config.HfModel`, whose
    ``arch`` is a :class:`ModelArch`. The config layer's hook; it lives here because the import
    contract lets ``coral_hpc`` read the catalogue (pyproject.toml, importlinter)."""
    from coral_solver import hf_config  # hf_config imports this module

    return hf_config.arch_from_config_json(source, name)


def gpu_memory_gb(gpu_type: str) -> float | None:
    """Memory per GPU of ``gpu_type`` in GB, or None when the type is not in the catalog."""
    key = canonical_gpu_name(gpu_type)
    return None if key is None else _gpu_tables(None)[0][key].memory_gb
