"""A login node whose Slurm commands fail at once, for CLI tests in child processes that must
not reach whatever Slurm the test machine has (and must not wait: ``SLURM_CONF=/nonexistent``
makes every command retry for 60 s before it fails).

:func:`no_slurm_env` puts a folder first on ``PATH`` whose ``squeue``, ``sacct``, ``sinfo``,
``scontrol``, ``sbatch`` and ``scancel`` print what Slurm 22.05 prints when its ``slurm.conf``
cannot be read, and exit 1."""

from __future__ import annotations

import os
from pathlib import Path

COMMANDS = ("squeue", "sacct", "sinfo", "scontrol", "sbatch", "scancel", "sacctmgr", "sshare")

_SCRIPT = """#!/bin/sh
name=$(basename "$0")
echo "$name: error: s_p_parse_file: cannot stat file /etc/slurm/slurm.conf: \
No such file or directory" >&2
echo "$name: fatal: Unable to process configuration file" >&2
exit 1
"""


def no_slurm_env(folder: Path) -> dict[str, str]:
    """Environment entries (``PATH``) under which every Slurm command fails at once."""
    bin_dir = folder / "no-slurm-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        path = bin_dir / name
        path.write_text(_SCRIPT)
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
