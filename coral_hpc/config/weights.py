"""A model named by its weights: finding and reading its ``config.json``.

A model in ``models.yaml`` needs only ``source:`` — a folder on the shared filesystem or a
Hugging Face id, as vLLM takes them. Its ``config.json`` is looked for, in this order:

1. a folder source: ``<folder>/config.json`` (relative folders against the models.yaml's own);
2. a Hugging Face id, in the site's cache (``engine.hf_home``, else ``<state_dir>/huggingface``)
   and in this process's own (``HF_HUB_CACHE``, ``HF_HOME``):
   ``hub/models--<org>--<name>/snapshots/<rev>/config.json``, the revision ``refs/main`` names
   first (the hub cache layout of ``huggingface_hub``);
3. the copy ``coral-hpc stage`` keeps: ``<state_dir>/<deployment>/model-configs/`` — so
   ``validate`` and ``plan`` work on a login node that cannot read the weights.

The file is read with the same care as models.yaml (bounded, regular file, UTF-8). Deriving
the architecture from it is the performance model's business (:mod:`coral_hpc.model_archs`);
this module only finds and reads files, so the configuration stays free of the solver.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

#: The largest config.json read. Real ones are 1-10 KB (DeepSeek-V3's: 1.7 KB; multimodal
#: wrappers with a vision_config: tens of KB); a 4 MiB file is not a config.json.
MAX_CONFIG_JSON_BYTES = 4 << 20
#: where `coral-hpc stage` keeps each model's config.json, below the deployment's state folder
STAGED_CONFIGS = "model-configs"


class WeightsError(ValueError):
    """A model's config.json cannot be found, read or understood; the message names the file
    (or every place looked) and the field."""


class ConfigJsonMissing(WeightsError):
    """No config.json in any place looked (the message lists them)."""


def is_local_path(source: str) -> bool:
    """Whether ``source`` names a folder (as the staging job and vLLM tell them apart) rather
    than a Hugging Face id."""
    return os.path.isabs(source) or source.startswith((".", "~"))


def staged_copy(state_path: Path, source: str) -> Path:
    """Where ``coral-hpc stage`` keeps ``source``'s config.json: named as the hub cache names a
    repository (``models--org--name``), a folder source as ``path--`` and its parts."""
    kind = "path" if is_local_path(source) else "models"
    return state_path / STAGED_CONFIGS / f"{kind}--{source.strip('/').replace('/', '--')}.json"


def _hub_folder(hub: Path, repo_id: str) -> Path:
    return hub / f"models--{repo_id.replace('/', '--')}"


def _hub_snapshot_configs(hub: Path, repo_id: str) -> list[Path]:
    """config.json files of ``repo_id`` in the hub cache ``hub``, the revision ``refs/main``
    names first, then the newest."""
    folder = _hub_folder(hub, repo_id)
    found: list[Path] = []
    try:
        main = (folder / "refs" / "main").read_text().strip()
    except (OSError, UnicodeDecodeError):
        main = ""
    if main and "/" not in main:
        found.append(folder / "snapshots" / main / "config.json")
    try:
        others = sorted((p for p in (folder / "snapshots").glob("*/config.json")),
                        key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        others = []
    return found + [p for p in others if p not in found]


def config_json_candidates(source: str, *, hubs: list[Path], state_path: Path | None,
                           base_dir: Path | None = None) -> list[Path]:
    """Every place ``source``'s config.json may be, in the order they are tried."""
    places: list[Path] = []
    if is_local_path(source):
        folder = Path(source).expanduser()
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        places.append(folder / "config.json")
    else:
        for hub in dict.fromkeys(hubs):
            places += (_hub_snapshot_configs(hub, source)
                       or [_hub_folder(hub, source) / "snapshots" / "*" / "config.json"])
    if state_path is not None:
        places.append(staged_copy(state_path, source))
    return places


def read_config_json(path: Path) -> dict[str, Any]:
    """The parsed JSON object at ``path``: a regular file of at most
    :data:`MAX_CONFIG_JSON_BYTES` of UTF-8 JSON. Raises :class:`WeightsError` naming it."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise WeightsError(f"{path}: not a regular file; a model's config.json is a JSON file")
    if info.st_size > MAX_CONFIG_JSON_BYTES:
        raise WeightsError(f"{path}: {info.st_size:,} bytes; a config.json is at most "
                           f"{MAX_CONFIG_JSON_BYTES:,} (is this the right file?)")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_JSON_BYTES + 1)
        text = data.decode("utf-8")
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise WeightsError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(parsed, dict):
        raise WeightsError(f"{path}: expected a JSON object at the top level")
    return parsed


def find_config_json(source: str, *, hubs: list[Path], state_path: Path | None,
                     base_dir: Path | None = None) -> tuple[Path | None, list[Path]]:
    """The first of :func:`config_json_candidates` that exists (None when none does), and
    every place looked. Something there that is not a regular file is returned too: reading it
    says what it is, rather than that nothing was found."""
    places = config_json_candidates(source, hubs=hubs, state_path=state_path,
                                    base_dir=base_dir)
    for place in places:
        if "*" not in place.parts and place.exists():
            return place, places
    return None, places


def hub_caches(configured: str | None = None) -> list[Path]:
    """Hugging Face hub caches to look in: ``<engine.hf_home>/hub`` (the deployment's), then
    this process's own as huggingface_hub finds it: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``."""
    hubs = [Path(configured).expanduser() / "hub"] if configured else []
    if os.environ.get("HF_HUB_CACHE"):
        hubs.append(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    elif os.environ.get("HF_HOME"):
        hubs.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    else:
        hubs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return hubs
