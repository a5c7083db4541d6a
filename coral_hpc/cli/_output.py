"""Shared output helpers for CLI commands: JSON to stdout, tables and errors through rich."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from rich.console import Console

console = Console()
err_console = Console(stderr=True)

#: Exit status for invalid input (bad config, bad arguments): nothing was done.
EXIT_INVALID = 2
#: Exit status when Slurm or another service could not be reached: try again later.
EXIT_UNAVAILABLE = 3


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON on stdout (machine-readable output, no colour)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fail(lines: list[str] | str, status: int = EXIT_INVALID) -> NoReturn:
    """Print every line on stderr and exit with ``status``."""
    # plain writes: rich would wrap long lines, and error lines must stay grep-able
    for line in [lines] if isinstance(lines, str) else lines:
        sys.stderr.write(line + "\n")
    raise SystemExit(status)
