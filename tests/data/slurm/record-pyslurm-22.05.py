"""Record what pyslurm's dict API says about nodes and partitions, next to scontrol's answer at
the same moment, for tests/unit/test_slurm_pyslurm_records.py.

Run with a Python that has pyslurm built for the cluster's Slurm (22.5.x) and SLURM_CONF set:
    SLURM_CONF=/var/tmp/coral-dev-cluster/etc/slurm.conf /path/to/pyslurm-venv/bin/python \\
        tests/data/slurm/record-pyslurm-22.05.py
It submits GPU jobs (nodes become MIXED), drains a node under a job (MIXED+DRAIN), sets partition
a100-80g INACTIVE for the moment of the reading, then cancels, resumes and sets it UP again — also
on error. Writes 22.05/pyslurm_nodes.json, pyslurm_partitions.json and the scontrol output taken
around them (retried until scontrol before == after).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyslurm

from coral_hpc.slurm.pyslurm_backend import node_records, partition_records

OUT = Path(__file__).resolve().parent / "22.05"


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


def scontrol() -> tuple[str, str]:
    return run("scontrol", "show", "node", "-o"), run("scontrol", "show", "partition", "-o")


def main() -> None:
    jobs: list[str] = []
    busy = None
    try:
        for gres in ("gpu:v100:1", "gpu:a100:2"):
            jobs.append(run("sbatch", "--parsable", "-p", "gpu", f"--gres={gres}", "-t", "5", "-o", "/dev/null",
                            "-J", "coral-record-pyslurm", "--wrap=sleep 120").strip())
        deadline = time.time() + 60
        while run("squeue", "-h", "-j", ",".join(jobs), "-o", "%T").split() != ["RUNNING"] * len(jobs):
            if time.time() > deadline:
                sys.exit("jobs did not start")
            time.sleep(0.5)
        busy = run("squeue", "-h", "-j", jobs[0], "-o", "%N").strip()
        run("scontrol", "update", f"NodeName={busy}", "State=DRAIN", "Reason=coral-record pyslurm drain")
        run("scontrol", "update", "PartitionName=a100-80g", "State=INACTIVE")
        for _ in range(20):
            before = scontrol()
            nodes = node_records(pyslurm.node().get())
            partitions = partition_records(pyslurm.partition().get())
            if scontrol() == before:
                break
        else:
            sys.exit("the cluster kept changing")
    finally:
        subprocess.run(["scancel", *jobs], check=False)
        if busy:
            subprocess.run(["scontrol", "update", f"NodeName={busy}", "State=RESUME"], check=False)
        subprocess.run(["scontrol", "update", "PartitionName=a100-80g", "State=UP"], check=False)
    meta = {"TZ": time.strftime("%Z"), "pyslurm": pyslurm.__version__, "recorded_at": int(time.time())}
    (OUT / "pyslurm_nodes.json").write_text(json.dumps({"meta": meta, "nodes": nodes}, indent=1) + "\n")
    (OUT / "pyslurm_partitions.json").write_text(json.dumps({"meta": meta, "partitions": partitions}, indent=1) + "\n")
    (OUT / "scontrol_show_node_pyslurm.txt").write_text(before[0])
    (OUT / "scontrol_show_partition_pyslurm.txt").write_text(before[1])
    print(f"recorded {len(nodes)} nodes, {len(partitions)} partitions ({os.environ.get('SLURM_CONF')})")


if __name__ == "__main__":
    main()
