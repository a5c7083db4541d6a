"""Record the big local cluster's answers (``scripts/dev-cluster up --big``: 256 nodes, five GPU
types, >= 5,000 jobs of two other labs) into ``tests/data/slurm/big-22.05.json.gz``, for the
unit test that replays them to a real daemon (tests/unit/test_call_budget_replay.py).

Every command is the one the CLI client itself runs (recorded through its runner): one observe
cycle (``sinfo --version``, ``scontrol show node/partition/reservation``, ``squeue`` of this
user, ``sacctmgr``), and ``sbatch --test-only`` for each partition × GPUs per node × nodes a
plan may probe. Nothing is submitted. Re-run to refresh:

    .venv/bin/python tests/data/slurm/record-big.py
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from coral_hpc.errors import PermanentError  # noqa: E402
from coral_hpc.slurm import CliSlurmClient, CommandRunner, JobShape  # noqa: E402

OUT = Path(__file__).resolve().parent / "big-22.05.json.gz"
BIG_CONF = "/var/tmp/coral-big-cluster/etc/slurm.conf"
#: partition → GPU type, as tests/unit/test_call_budget_replay.py's deployment uses them
PARTITIONS = {"a100": "a100", "v100": "v100", "l40s": "l40s", "h100": "h100"}


class RecordingRunner(CommandRunner):
    def __init__(self, **kw):  # type: ignore[no-untyped-def]
        super().__init__(**kw)
        self.recorded: list[dict] = []

    def _run_once(self, argv, timeout_s, extra_env, ok_returncodes):  # type: ignore[no-untyped-def]
        try:
            result = super()._run_once(argv, timeout_s, extra_env, ok_returncodes)
        except PermanentError as exc:
            self.recorded.append({"argv": list(argv), "stdout": "", "stderr": str(exc),
                                  "rc": 1})
            raise
        self.recorded.append({"argv": list(argv), "stdout": result.stdout,
                              "stderr": result.stderr, "rc": 0})
        return result


def main() -> int:
    env = dict(os.environ, SLURM_CONF=os.environ.get("CORAL_BIG_SLURM_CONF", BIG_CONF))
    runner = RecordingRunner(env=env, timeout_s=120)
    client = CliSlurmClient(runner)
    recorded_at = time.time()
    snapshot = client.snapshot("recording")
    for partition, gpu in PARTITIONS.items():
        for gpus in (1, 2, 4, 8):
            for nodes in (1, 2):
                shape = JobShape(partition=partition, gpus_per_node=gpus, gpu_type=gpu,
                                 nodes=nodes, cpus_per_gpu=4, mem_per_gpu_gb=32,
                                 time_limit_s=3600)
                try:
                    client.test_only(shape)
                except PermanentError:
                    pass  # refused (e.g. 8 GPUs on a 4-GPU type): recorded as such
    jobs = subprocess.run(["squeue", "-h", "-r", "-o", "%u|%T|%r"], env=env, check=True,
                          capture_output=True, text=True).stdout.splitlines()
    data = {
        "recorded_at": recorded_at,
        "slurm_conf": env["SLURM_CONF"],
        "nodes": len(snapshot.nodes),
        "partitions": sorted(p.name for p in snapshot.partitions),
        "jobs_by_user_state_reason": dict(collections.Counter(jobs)),
        "commands": runner.recorded,
    }
    OUT.write_bytes(gzip.compress(json.dumps(data, indent=1).encode(), mtime=0))
    print(f"{OUT}: {len(runner.recorded)} commands, {len(snapshot.nodes)} nodes, "
          f"{len(jobs)} jobs in the queue, {OUT.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
