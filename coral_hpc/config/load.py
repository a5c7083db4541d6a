"""Reading ``models.yaml`` (a file, or text) into a validated :class:`Deployment`, every problem
reported at once as :class:`coral_hpc.errors.ConfigError`."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from coral_hpc.config.deployment import Deployment
from coral_hpc.config.problems import _problems_from
from coral_hpc.config.source import SourceError, YamlSource, load_yaml, parse_yaml
from coral_hpc.errors import ConfigError


def _validated(source: YamlSource, path: str, base_dir: Path | None) -> Deployment:
    data = source.data
    if not isinstance(data, dict):
        raise ConfigError(path, [f"{path}:1: (top level): expected a mapping of settings"])
    context = {"base_dir": base_dir} if base_dir is not None else None
    try:
        deployment = Deployment.model_validate(data, context=context)
    except ValidationError as exc:
        raise ConfigError(path, _problems_from(exc, source.lines, path)) from None
    deployment._source = path
    deployment._lines = source.lines
    return deployment


def parse_deployment(text: str, path: str = "<string>", base_dir: Path | None = None) -> Deployment:
    """Validate the YAML ``text`` of a models.yaml. Raises :class:`ConfigError`.

    With ``base_dir``, relative paths (state_dir, db_path, profiles_dir, api_keys_file, tls_cert,
    tls_key, hf_token_file, hf_home, kv_connector.shared_path, environment paths) are
    made absolute against it; without, they are kept as written."""
    try:
        source = parse_yaml(text, path)
    except SourceError as exc:
        raise ConfigError(path, [exc.problem]) from None
    return _validated(source, path, base_dir)


def load_deployment(path: str | Path) -> Deployment:
    """Read and validate ``models.yaml`` at ``path``. Raises :class:`ConfigError`.

    The file must be a regular file of at most ``source.MAX_CONFIG_BYTES`` of UTF-8 YAML;
    anything else is refused before it is read whole (see :mod:`coral_hpc.config.source`).
    Relative paths in it resolve against the file's own folder (absolute, ``~`` expanded).
    """
    try:
        source = load_yaml(path)
    except SourceError as exc:
        raise ConfigError(str(path), [exc.problem]) from None
    return _validated(source, str(path), Path(os.path.abspath(path)).parent)
