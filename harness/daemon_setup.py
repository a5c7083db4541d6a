"""A daemon set up outside ``serve``, for the tests and benches that drive one directly.

- :func:`write_models_yaml` writes the small sim-engine models.yaml they serve, with the state
  folder and database in the same folder;
- :func:`big_cluster_yaml` is the two-model deployment of the big local cluster
  (``scripts/dev-cluster up --big``): ``chat`` fits the free a100/v100/l40s nodes and
  ``reasoner`` only the full h100 partition, so every re-plan asks Slurm when it would start
  (bench/bigcluster.py live, tests/unit/test_call_budget_replay.py on its recording);
- :func:`headless_daemon` builds :class:`~coral_hpc.daemon.core.Daemon` as ``serve`` does, minus
  the gateway, metrics server, lease and status file.

Waiting is :func:`harness.wait.wait_until` and clean-up
:func:`harness.slurm_jobs.cancel_deployment`, for the tests and the benches alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coral_hpc.config import Deployment
from coral_hpc.daemon import ensure_replica_key
from coral_hpc.daemon.core import Daemon
from coral_hpc.gateway.table import default_replica_key_path, default_table_path
from coral_hpc.slurm.budget import CallBudget
from coral_hpc.slurm.client import SlurmClient
from coral_hpc.store import open_store


@dataclass(frozen=True)
class SimModel:
    """One ``models:`` entry: Qwen3-8B weights of ``architecture``, a 2 s TTFT / 0.1 s TPOT
    SLO; ``partitions`` and ``min_replicas`` only where given."""

    name: str
    mix: tuple[int, int]            # input, output tokens
    requests_per_s: float
    architecture: str = "qwen3-8b"
    partitions: tuple[str, ...] = ()
    min_replicas: int | None = None

    def yaml(self) -> str:
        lines = [f"  - name: {self.name}",
                 "    source: Qwen/Qwen3-8B",
                 f"    architecture: {self.architecture}",
                 f"    mix: {{input_tokens: {self.mix[0]}, output_tokens: {self.mix[1]}}}",
                 f"    demand: {{requests_per_s: {self.requests_per_s:g}}}",
                 "    slo: {ttft_s: 2.0, tpot_s: 0.1}"]
        if self.partitions:
            lines.append(f"    partitions: [{', '.join(self.partitions)}]")
        if self.min_replicas is not None:
            lines.append(f"    min_replicas: {self.min_replicas}")
        return "\n".join(lines)


def write_models_yaml(folder: Path, deployment: str, *, time_limit: str,
                      partitions: Sequence[str], models: Sequence[SimModel],
                      cluster: Mapping[str, object] | None = None,
                      policy: Mapping[str, object] | None = None) -> Path:
    """Write ``folder/models.yaml`` and return its path: ``deployment``, state folder
    ``folder/shared`` and database ``folder/daemon/coral.db``, one partition per GPU type of
    the same name, ``cluster`` settings after the time limit, the sim engine, a gateway on
    loopback without keys (``open_on_loopback``: the test host is no shared login node),
    ``policy`` (left out when None: the defaults) and ``models``."""
    cluster_lines = "".join(f"  {k}: {v}\n" for k, v in (cluster or {}).items())
    partition_lines = "".join(f"    - {{name: {p}, gpu_types: [{p}]}}\n" for p in partitions)
    policy_block = ("" if policy is None else
                    "policy:\n" + "".join(f"  {k}: {v}\n" for k, v in policy.items()))
    path = folder / "models.yaml"
    path.write_text(f"""
deployment: {deployment}
state_dir: {folder / 'shared'}
db_path: {folder / 'daemon' / 'coral.db'}
cluster:
  time_limit: "{time_limit}"
{cluster_lines}  partitions:
{partition_lines}engine: {{kind: sim}}
gateway: {{listen: "127.0.0.1:8000", open_on_loopback: true}}
{policy_block}models:
{chr(10).join(m.yaml() for m in models)}
""")
    return path


def big_cluster_yaml(folder: Path, deployment: str) -> Path:
    """The big local cluster's deployment (module docstring), default policy."""
    return write_models_yaml(
        folder, deployment, time_limit="01:00:00", partitions=("a100", "v100", "l40s", "h100"),
        models=(SimModel("chat", (512, 128), 2, partitions=("a100", "v100", "l40s")),
                SimModel("reasoner", (512, 128), 2, partitions=("h100",), min_replicas=1)))


def headless_daemon(deployment: Deployment, client: SlurmClient, planner: Callable, *,
                    budget: CallBudget | None = None) -> Daemon:
    """The daemon ``serve`` builds for ``deployment`` — its real store, the replica key and
    routing table where ``serve`` keeps them, ``client`` and ``planner`` — with no gateway,
    metrics server, lease or status file. Run it with ``daemon.loops(stop)``; close
    ``daemon.observer`` and ``daemon.store`` after."""
    store = open_store(deployment.db_path)
    key = ensure_replica_key(default_replica_key_path(deployment))
    return Daemon(deployment, store, client, planner, api_key_file=key,
                  table_path=default_table_path(deployment), budget=budget)
