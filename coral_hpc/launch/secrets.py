"""Secrets for the engine (API key, Hugging Face token), read from files only the user can read.

They reach the engine through its environment (``VLLM_API_KEY``, ``HF_TOKEN``), never argv or a
log line. A file that group or others could read is refused, as ssh refuses a loose private key.
"""

from __future__ import annotations

from pathlib import Path

from coral_hpc.config import stat_private_file
from coral_hpc.errors import PermanentError


class SecretFileError(PermanentError):
    """A secret file is missing, empty, not ours, or readable by others."""


def read_secret(path: str | Path, what: str) -> str:
    """The content of secret file ``path`` (stripped); ``what`` names it in errors."""
    file = Path(path)
    try:
        stat_private_file(file, what)
    except ValueError as exc:  # the same refusal as models.yaml's, as this module's error
        raise SecretFileError(str(exc)) from None
    value = file.read_text().strip()
    if not value:
        raise SecretFileError(f"{what} file {file} is empty")
    return value


def engine_secrets(api_key_file: str | None, hf_token_file: str | None) -> dict[str, str]:
    """Environment entries for the engine: ``VLLM_API_KEY`` and ``HF_TOKEN`` when configured."""
    env: dict[str, str] = {}
    if api_key_file:
        env["VLLM_API_KEY"] = read_secret(api_key_file, "API key")
    if hf_token_file:
        env["HF_TOKEN"] = read_secret(hf_token_file, "Hugging Face token")
    return env
