"""GPU type names as Slurm sites write them → the catalogue's GPU types. Pure.

Sites name GRES types by hand (``a100``, ``a100_80g``, ``v100s``) or let ``AutoDetect=nvml`` do
it: Slurm then lower-cases NVML's product name and turns spaces into underscores
(``NVIDIA A100-SXM4-80GB`` → ``nvidia_a100-sxm4-80gb``, ``Tesla V100-SXM2-32GB`` →
``tesla_v100-sxm2-32gb``, ``NVIDIA H100 80GB HBM3`` → ``nvidia_h100_80gb_hbm3``; Slurm's gres.conf
man page, "AutoDetect"). :func:`catalogue_type` maps all of these onto a catalogue name:

1. the site's own mapping (``cluster.gpu_type_map`` in models.yaml) wins;
2. the name itself, or one of the catalogue's aliases (``profiles/gpus.yaml``);
3. the name read as vendor + model + memory + form factor: vendor words and form factors
   (``sxm4``, ``pcie``, ``hbm3`` …) dropped, the model word and the memory size kept, then
   ``<model>-<memory>g`` or ``<model>`` when that entry has that memory.

:func:`untyped_gpu_type` gives an untyped ``gpu:N`` node its type from its node features
(``AvailableFeatures=a100,ib``) the same way. None from either means the plan cannot use the
GPU: the caller says so in a warning naming the node and the name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

#: words NVML and sites put around the model name that say nothing about the model
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon"})
#: form factors and memory technologies: the same chip and memory either way
_FORM_WORDS = frozenset({"sxm", "sxm2", "sxm3", "sxm4", "sxm5", "pcie", "pci", "nvl", "hbm2",
                         "hbm2e", "hbm3", "hbm3e", "mig", "dgx"})
_MEMORY_RE = re.compile(r"^(\d+)(?:g|gb)$")
_MODEL_RE = re.compile(r"^[a-z]+\d+[a-z]*$")


def name_words(name: str) -> tuple[str | None, int | None]:
    """``"nvidia_a100-sxm4-80gb"`` → ``("a100", 80)``; ``"tesla_v100s-pcie-32gb"`` →
    ``("v100s", 32)``; ``"a100"`` → ``("a100", None)``; a name without a model word → (None,
    None)."""
    model, memory = None, None
    for word in re.split(r"[-_\s.]+", name.strip().lower()):
        if not word or word in _VENDOR_WORDS or word in _FORM_WORDS:
            continue
        size = _MEMORY_RE.match(word)
        if size:
            memory = int(size.group(1))
        elif model is None and _MODEL_RE.match(word):
            model = word
    return model, memory


def catalogue_type(
    name: str | None,
    known: Callable[[str], str | None],
    memory_of: Callable[[str], float | None],
    site_map: Mapping[str, str] | None = None,
) -> str | None:
    """The catalogue GPU type for a site's GRES type ``name``, or None when none fits.

    ``known(name)`` is the catalogue's own lookup (names and aliases → canonical name or None);
    ``memory_of(canonical)`` its memory in GB; ``site_map`` the deployment's explicit
    mapping (site name → catalogue type), compared case-insensitively."""
    if not name:
        return None
    lowered = name.strip().lower()
    for site_name, target in (site_map or {}).items():
        if site_name.strip().lower() == lowered:
            return known(target) or target
    direct = known(lowered)
    if direct:
        return direct
    model, memory = name_words(lowered)
    if model is None:
        return None
    candidates = [f"{model}-{memory}g", model] if memory is not None else [model]
    for candidate in candidates:
        canonical = known(candidate)
        if canonical is None:
            continue
        if memory is None:
            return canonical
        have = memory_of(canonical)
        # vendors count memory in GB of 1e9 bytes or GiB: 80 vs 80, 32 vs 32; allow rounding
        if have is not None and abs(have - memory) <= 0.1 * memory:
            return canonical
    return None


def untyped_gpu_type(
    features: Iterable[str],
    known: Callable[[str], str | None],
    memory_of: Callable[[str], float | None],
    site_map: Mapping[str, str] | None = None,
) -> str | None:
    """The GPU type of a node whose GRES is an untyped ``gpu:N``, from its node features:
    the one catalogue type its features name; None when none or several different ones do."""
    found = {t for t in (catalogue_type(f, known, memory_of, site_map) for f in features) if t}
    return found.pop() if len(found) == 1 else None


def catalogue_lookup() -> tuple[Callable[[str], str | None], Callable[[str], float | None]]:
    """The solver catalogue's name and memory lookups; lookups that know nothing when the
    catalogue is not installed (observing Slurm does not need it)."""
    try:
        from coral_solver.catalog import canonical_gpu_name, gpu_memory_gb
    except ImportError:
        return (lambda _name: None), (lambda _name: None)

    def known(name: str) -> str | None:
        try:
            return canonical_gpu_name(name)
        except (OSError, ValueError):
            return None

    return known, gpu_memory_gb
