"""Checks of a deployment against this host: the paths ``serve`` writes, the measured profiles a
``measured_only`` plan needs, and folders other users could change."""

from __future__ import annotations

import os
from pathlib import Path

from coral_hpc.config.deployment import Deployment


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _writable_problem(path: Path, want_dir: bool) -> str | None:
    """Why ``path`` cannot be (created and) written as a file or directory; None if it can."""
    what = "directory" if want_dir else "file"
    if path.exists():
        if path.is_dir() != want_dir:
            actual = "a directory" if path.is_dir() else "not a directory"
            hint = f" such as {path / 'coral.db'}" if path.is_dir() else ""
            return f"{path} is {actual}; give the path of a {what}{hint}"
        if not want_dir and not path.is_file():
            return f"{path} is not a regular file; give the path of a {what}"
        if not os.access(path, os.W_OK | (os.X_OK if want_dir else 0)):
            return f"{path} is not writable by this user"
        return None
    parent = _nearest_existing(path.parent)
    if not parent.is_dir():
        return f"cannot create {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: {parent} is not writable by this user"
    return None


def measured_profiles_problems(deployment: Deployment) -> list[str]:
    """With ``policy.measured_only``, a plan needs measured profiles: a ``profiles_dir`` that is
    missing or holds none would plan nothing and exit 0 without a word (issue 29c)."""
    if not deployment.policy.measured_only:
        return []
    folder = deployment.measured_profiles_path
    if folder.is_dir() and any(folder.rglob("*.yaml")):
        return _role_profile_problems(deployment)
    field: tuple[str | int, ...] = ("profiles_dir",) if deployment.profiles_dir else (
        "policy", "measured_only")
    found = "holds no profiles" if folder.is_dir() else "does not exist"
    return [deployment.problem(field, (
        f"policy.measured_only plans from measured profiles only, and {folder} {found} "
        "(relative paths are against this file's folder); measure them with `coral-hpc "
        "profile` or set profiles_dir"))]


def role_profile_name(arch: str, gpu: str, tp: int, role: str) -> str:
    """The file name of a role profile (``roles/`` of the profiles folder): an architecture
    named by a path or Hugging Face id has its ``/`` written ``--``, as every profile's."""
    return f"{arch.strip('/').replace('/', '--')}__{gpu}__tp{tp}__{role}.yaml"


def _role_profile_problems(deployment: Deployment) -> list[str]:
    """With ``measured_only`` and ``disaggregation: on``, every generating model is planned as
    prefill and decode replicas from role profiles alone: a model without a prefill and a decode
    profile in ``<profiles_dir>/roles`` could never be planned, so say which to measure. (With
    ``auto`` the aggregated profiles suffice; role profiles add choices.)"""
    if deployment.policy.disaggregation != "on":
        return []
    folder = deployment.measured_profiles_path / "roles"
    problems = []
    for index, model in enumerate(deployment.models):
        if model.embedding:
            continue  # an embedding model is always planned aggregated
        prefix = model.arch_key.strip("/").replace("/", "--") + "__"
        missing = [role for role in ("prefill", "decode")
                   if not any(folder.glob(f"{_glob_escape(prefix)}*__{role}.yaml"))]
        if missing:
            problems.append(deployment.problem(("models", index), (
                f"policy.measured_only with disaggregation 'on' plans {model.name}'s prefill and "
                f"decode replicas from role profiles, and {folder} holds no "
                f"{' or '.join(missing)} profile of {model.arch_key}; measure them with "
                f"`coral-hpc profile --roles --model {model.name}`")))
    return problems


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def host_path_problems(deployment: Deployment) -> list[str]:
    """Problems with the paths ``serve`` writes on this host: ``db_path`` must be (or be
    creatable as) a writable regular file, ``state_dir`` a writable directory.

    Read-only commands (status, cost, logs) do not need this; ``validate`` and ``serve`` do."""
    problems = []
    for field, want_dir in (("db_path", False), ("state_dir", True)):
        path = Path(getattr(deployment, field)).expanduser()
        problem = _writable_problem(path, want_dir)
        if problem:
            problems.append(deployment.problem((field,), problem))
    return problems


def private_state_problems(deployment: Deployment) -> list[str]:
    """Problems that let other users of a shared login node change what ``serve`` reads: the
    state folder (and this deployment's folder in it) or the database's folder exists and is not
    this user's, or group or others may write it. ``serve`` refuses them (exit 2); folders that
    do not exist yet are created 0700."""
    from coral_hpc.atomic import not_private_problem

    problems = []
    state = Path(deployment.state_dir).expanduser()
    for field, path, what in (
        ("state_dir", state, "state folder"),
        ("state_dir", deployment.state_path, "deployment folder"),
        ("db_path", Path(deployment.db_path).expanduser().parent, "database folder"),
    ):
        problem = not_private_problem(path, what)
        if problem:
            problems.append(deployment.problem((field,), problem))
    return problems
