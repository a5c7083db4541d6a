"""The most replicas the whole cluster could ever hold: where ``min_replicas`` is refused.

On a busy cluster a ``min_replicas`` beyond what can start now is queued: Slurm starts the
rest as other users' jobs end (ARCHITECTURE.md, "Available GPUs"). One beyond what the cluster
could hold if every other job ended would be queued for ever, so ``plan`` and ``serve`` refuse
it as invalid input (exit 2, naming the field) instead.

The GPUs counted are those of every node Slurm lists, whatever its state (busy, draining or
down: a node may come back), in the partitions the model may use — the snapshot's nodes and
the partitions' node lists, not the solver's node groups, which hold only what is available
now. What fits on them is bounded by an LP over the model's Stage-1 templates (the layouts
``serve`` would ever run) and the GPUs per type (:mod:`coral_solver.capacity`): each model
alone, then all minimums together. Sound, not tight: a refusal here is certain, and a minimum
that passes may still be held back by node sizes, quotas or site limits, which Stage 2 and the
queue report as ``binding`` lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coral_hpc.config import Deployment
from coral_hpc.slurm.snapshot import ClusterSnapshot
from coral_solver.capacity import minimums_fit, most_replicas
from coral_solver.types import Template


@dataclass(frozen=True)
class Shortfall:
    """Models whose ``min_replicas`` (together, when more than one) the cluster could never
    hold."""

    #: indices into ``deployment.models``
    models: tuple[int, ...]
    #: at most this many replicas of each model fit at once alone, per model index
    most: Mapping[int, int]
    #: every GPU of the nodes those models may use, busy or not
    total_gpus: int
    #: partitions counted
    partitions: tuple[str, ...]
    #: configured partitions these models may use that Slurm does not have
    missing: tuple[str, ...] = ()
    #: every partition Slurm has
    slurm_partitions: tuple[str, ...] = ()

    @property
    def no_partition(self) -> str | None:
        """When no partition these models may use is in Slurm, that is the problem to name
        (not "at most 0 on partition(s) (none), 0 GPUs"); else None."""
        if self.partitions or not self.missing:
            return None
        return (f"Slurm has no partition {', '.join(self.missing)} (Slurm's partitions: "
                f"{', '.join(self.slurm_partitions) or 'none'})")

    def _where(self) -> str:
        return (f"partition(s) {', '.join(self.partitions) or '(none)'}, {self.total_gpus} "
                "GPU(s) in total, busy or not")

    def reason(self, deployment: Deployment) -> str:
        """The shortfall in words, for ``binding`` lines and the daemon's log."""
        if self.no_partition is not None:
            return f"min_replicas: {self.no_partition}"
        asks = " and ".join(f"{deployment.models[i].name}'s {deployment.models[i].min_replicas}"
                            for i in self.models)
        return (f"min_replicas: {asks} replica(s) do not fit at once on every GPU of "
                f"{self._where()}: the cluster could never hold them")

    def refusal(self, deployment: Deployment, index: int) -> str:
        """Why model ``index``'s ``min_replicas`` is refused, and what would be valid."""
        model = deployment.models[index]
        if self.no_partition is not None:
            return (f"{self.no_partition}: {model.min_replicas} replica(s) of {model.name} can "
                    "never run")
        if len(self.models) == 1:
            return (f"{model.min_replicas} replica(s) of {model.name}: its layouts (Stage 1's "
                    f"templates) fit at most {self.most[index]} at once on every GPU of "
                    f"{self._where()}, so the cluster could never hold them; valid: at most "
                    f"{self.most[index]}")
        others = ", ".join(deployment.models[i].name for i in self.models if i != index)
        return (f"{model.min_replicas} replica(s) of {model.name} (at most "
                f"{self.most[index]} alone) with the minimums of {others} do not fit together "
                f"on every GPU of {self._where()}, so the cluster could never hold them; "
                "valid: minimums that fit together")


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


def _by_type(nodes: Mapping[str, tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for gpu, count in nodes.values():
        out[gpu] = out.get(gpu, 0) + count
    return out


def never_held(deployment: Deployment, snapshot: ClusterSnapshot,
               library: Mapping[str, list[Template]]) -> list[Shortfall]:
    """The models whose ``min_replicas`` the cluster could never hold (see the module
    docstring): each model alone, and, when every one fits alone, all of them together."""
    eligible: dict[int, dict[str, tuple[str, int]]] = {}
    partitions: dict[int, set[str]] = {}
    most: dict[int, int] = {}
    for index, model in enumerate(deployment.models):
        if model.min_replicas <= 0:
            continue
        eligible[index], partitions[index] = _eligible_gpus(deployment, snapshot, index)
        most[index] = most_replicas(library.get(model.name, ()), _by_type(eligible[index]))

    known = {p.name for p in snapshot.partitions}

    def shortfall(indices: tuple[int, ...]) -> Shortfall:
        nodes: dict[str, tuple[str, int]] = {}
        parts: set[str] = set()
        missing: set[str] = set()
        for i in indices:
            nodes.update(eligible[i])
            parts |= partitions[i]
            may_use = deployment.models[i].partitions or tuple(
                p.name for p in deployment.cluster.partitions)
            missing |= {p for p in may_use if p not in known}
        return Shortfall(indices, {i: most[i] for i in indices},
                         sum(gpus for _, gpus in nodes.values()), tuple(sorted(parts)),
                         tuple(sorted(missing)), tuple(sorted(known)))

    alone = [shortfall((i,)) for i in sorted(eligible)
             if deployment.models[i].min_replicas > most[i]]
    if alone or len(eligible) < 2:
        return alone
    together = tuple(sorted(eligible))
    union: dict[str, tuple[str, int]] = {}
    for i in together:
        union.update(eligible[i])
    names = {i: deployment.models[i].name for i in together}
    if minimums_fit({names[i]: deployment.models[i].min_replicas for i in together},
                    {names[i]: library.get(names[i], ()) for i in together},
                    {names[i]: _by_type(eligible[i]) for i in together}, _by_type(union)):
        return []
    return [shortfall(together)]
