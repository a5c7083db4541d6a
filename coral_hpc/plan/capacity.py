"""The most replicas the whole cluster could ever hold: where ``min_replicas`` is refused.

On a busy cluster a ``min_replicas`` beyond what can start now is queued: Slurm starts the
rest as other users' jobs end (ARCHITECTURE.md, "Available GPUs"). One beyond what the cluster
could hold if every other job ended would be queued for ever, so ``plan`` and ``serve`` refuse
it as invalid input (exit 2, naming the field) instead.

The bound is taken from every node Slurm lists, whatever its state (busy, draining or down:
a node may come back), in the partitions the model may use — the snapshot's nodes and the
partitions' node lists, not the solver's node groups, which hold only what is available now.
Each replica needs at least as many GPUs as the model's smallest Stage-1 template on those
GPU types, so ``min_replicas × that > the GPUs there`` can never be met; so can the models'
minimums together, beyond the GPUs of all their partitions. Sound, not tight: a refusal here
is certain, and a minimum that passes may still be held back by quotas or site limits, which
Stage 2 and the queue report as ``binding`` lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coral_hpc.config import Deployment
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_solver.types import Template


@dataclass(frozen=True)
class Shortfall:
    """Models whose ``min_replicas`` together need more GPUs than their partitions have."""

    #: indices into ``deployment.models``
    models: tuple[int, ...]
    #: GPUs the minimums need at the least (Σ min_replicas × smallest template's GPUs)
    needed_gpus: int
    #: every GPU of the nodes those models may use, busy or not
    total_gpus: int
    #: partitions counted
    partitions: tuple[str, ...]
    #: the smallest template's GPUs per replica, per model index
    gpus_per_replica: Mapping[int, int]

    def reason(self, deployment: Deployment) -> str:
        """The shortfall in words, for ``binding`` lines and the daemon's log."""
        asks = " and ".join(
            f"{deployment.models[i].name}'s {deployment.models[i].min_replicas} × ≥ "
            f"{self.gpus_per_replica[i]}" for i in self.models)
        return (f"min_replicas: {asks} GPUs need ≥ {self.needed_gpus} GPUs; "
                f"{self._where()}: the cluster could never hold them")

    def _where(self) -> str:
        return (f"partition(s) {', '.join(self.partitions) or '(none)'} have "
                f"{self.total_gpus} GPU(s) in total, busy or not")

    def refusal(self, deployment: Deployment, index: int) -> str:
        """Why model ``index``'s ``min_replicas`` is refused, and what would be valid."""
        model = deployment.models[index]
        each = self.gpus_per_replica[index]
        if len(self.models) == 1:
            return (f"{model.min_replicas} replica(s) of {model.name} need ≥ "
                    f"{self.needed_gpus} GPUs (≥ {each} each, its smallest layout); "
                    f"{self._where()}, so the cluster could never hold them; valid: at most "
                    f"{self.total_gpus // each}")
        others = ", ".join(deployment.models[i].name for i in self.models if i != index)
        return (f"{model.min_replicas} replica(s) of {model.name} (≥ {each} GPU(s) each) with "
                f"the minimums of {others} need ≥ {self.needed_gpus} GPUs together; "
                f"{self._where()}, so the cluster could never hold them; valid: minimums "
                f"that together need at most {self.total_gpus} GPUs")


def _eligible_gpus(deployment: Deployment, snapshot: ClusterSnapshot,
                   index: int) -> tuple[dict[str, tuple[str, int]], set[str]]:
    """node → (GPU type, GPUs) of every node model ``index`` could ever run on, and the
    partitions that hold them."""
    model = deployment.models[index]
    configured = {p.name: p for p in deployment.cluster.partitions}
    members: dict[str, set[str]] = {}
    for info in snapshot.partitions:
        for name in info.nodes:
            members.setdefault(name, set()).add(info.name)
    known = {p.name for p in snapshot.partitions}
    nodes: dict[str, tuple[str, int]] = {}
    used: set[str] = set()
    for node in snapshot.nodes:
        if not node.gpu_type or node.gpus_total <= 0:
            continue
        if model.gpu_types and node.gpu_type not in model.gpu_types:
            continue
        parts = {p for p in set(node.partitions) | members.get(node.name, set())
                 if p in configured and p in known
                 and (not model.partitions or p in model.partitions)
                 and (not configured[p].gpu_types or node.gpu_type in configured[p].gpu_types)}
        if parts:
            nodes[node.name] = (node.gpu_type, node.gpus_total)
            used |= parts
    return nodes, used


def _smallest_replica(templates: list[Template], gpu_types: set[str]) -> int | None:
    """GPUs of the smallest template whose every stage runs on one of ``gpu_types``."""
    sizes = [t.gpus for t in templates if all(s.gpu_type in gpu_types for s in t.stages)]
    return min(sizes) if sizes else None


def never_held(deployment: Deployment, snapshot: ClusterSnapshot,
               library: Mapping[str, list[Template]]) -> list[Shortfall]:
    """The models whose ``min_replicas`` the cluster could never hold (see the module
    docstring): each model alone, and, when every one fits alone, all of them together. A model
    with no template on its GPU types gets no bound here (Stage 2 reports it)."""
    eligible: dict[int, dict[str, tuple[str, int]]] = {}
    partitions: dict[int, set[str]] = {}
    per_replica: dict[int, int] = {}
    for index, model in enumerate(deployment.models):
        if model.min_replicas <= 0:
            continue
        nodes, parts = _eligible_gpus(deployment, snapshot, index)
        smallest = _smallest_replica(list(library.get(model.name, ())),
                                     {gpu for gpu, _ in nodes.values()})
        if not nodes:
            smallest = smallest or 1  # no GPU at all: even one GPU each is too many
        if smallest is None:
            continue
        eligible[index], partitions[index], per_replica[index] = nodes, parts, smallest

    def shortfall(indices: tuple[int, ...]) -> Shortfall | None:
        nodes: dict[str, tuple[str, int]] = {}
        parts: set[str] = set()
        for i in indices:
            nodes.update(eligible[i])
            parts |= partitions[i]
        total = sum(gpus for _, gpus in nodes.values())
        needed = sum(deployment.models[i].min_replicas * per_replica[i] for i in indices)
        if needed <= total:
            return None
        return Shortfall(indices, needed, total, tuple(sorted(parts)),
                         {i: per_replica[i] for i in indices})

    alone = [s for s in (shortfall((i,)) for i in sorted(eligible)) if s is not None]
    if alone or len(eligible) < 2:
        return alone
    together = shortfall(tuple(sorted(eligible)))
    return [together] if together is not None else []
