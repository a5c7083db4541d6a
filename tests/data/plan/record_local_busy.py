"""Record the local cluster made busy by another lab, and reservations / preemption settings
Slurm prints, for the unit tests (run under the shared lock, ~1 min; it undoes what it sets):

    flock /tmp/coral-slurm.lock .venv/bin/python tests/data/plan/record_local_busy.py

1. ``coral-other`` (scripts/dev-cluster other-user) holds every GPU with 10-minute jobs; then
   ``coral-hpc plan`` of the university-like configuration (tests/support/university_local.py)
   asks Slurm (``sbatch --test-only`` per job shape) and saves the snapshot it planned on:
   tests/data/plan/local-busy-snapshot.json (nodes, partitions, limits, jobs, estimates: all
   parsed by coral-hpc from the real commands' output).
2. One of those jobs ends early; root gets an active reservation on its node and one that
   starts in 15 minutes on another; a root job runs in the first (account coral-busy) and one
   waits outside it (account coral). Recorded, raw, in tests/data/slurm/22.05/busy/:
   ``scontrol show reservation -o`` and ``squeue -O`` in today's SQUEUE_FORMAT.
3. A partition ``busy-scav`` of PriorityTier 0 beside the tier-1 partitions, and QOS
   ``busy-scav`` / ``busy-prio`` (Preempt=busy-scav): ``scontrol show partition -o`` and
   ``sacctmgr show qos`` as coral-hpc asks them. Removed after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from coral_hpc.slurm.parse_jobs import SQUEUE_FORMAT  # noqa: E402
from coral_hpc.slurm.parse_limits import QOS_FIELDS  # noqa: E402
from harness import busy_cluster  # noqa: E402
from tests.support.serve_harness import CLI  # noqa: E402
from tests.support.university_local import write_university_local  # noqa: E402

OUT = REPO / "tests" / "data" / "slurm" / "22.05" / "busy"
SNAPSHOT = REPO / "tests" / "data" / "plan" / "local-busy-snapshot.json"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=300)


def record(name: str, *argv: str) -> None:
    out = run(*argv, check=False)
    (OUT / name).write_text(out.stdout)
    if out.returncode:
        (OUT / f"{name}.rc").write_text(f"{out.returncode}\n")
        (OUT / f"{name}.stderr").write_text(out.stderr)


def main() -> None:
    os.environ.setdefault("SLURM_CONF", "/var/tmp/coral-dev-cluster/etc/slurm.conf")
    OUT.mkdir(parents=True, exist_ok=True)
    busy_cluster.ensure_other_user()
    made: list[list[str]] = []  # undo commands, run in reverse
    ours: list[str] = []
    try:
        jobs = busy_cluster.fill_every_gpu(600)
        for _ in range(60):
            if all(state == "RUNNING" for _, state, _ in busy_cluster.other_jobs()):
                break
            time.sleep(1)
        with tempfile.TemporaryDirectory() as folder:
            config = write_university_local(Path(folder))
            out = run(*CLI, "plan", str(config), "--save-snapshot", str(SNAPSHOT),
                      "--cache-dir", str(Path(folder) / "cache"), check=False)
            print(out.stdout[-3000:], out.stderr[-2000:])
        # 2. reservations: free one node, reserve it for root; another from in 15 min
        run("scancel", jobs["v100-02"])
        time.sleep(3)
        name = f"busy-rec-{os.getpid()}"
        run("scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now",
            "Duration=00:20:00", "Nodes=v100-02", "Users=root")
        made.append(["scontrol", "delete", f"ReservationName={name}"])
        later = f"busy-later-{os.getpid()}"
        run("scontrol", "create", "reservation", f"ReservationName={later}",
            "StartTime=now+15minutes", "Duration=00:30:00", "Nodes=a100-02", "Users=root")
        made.append(["scontrol", "delete", f"ReservationName={later}"])
        for argv in (["--reservation", name, "-A", "coral-busy", "-p", "v100",
                      "--gres=gpu:v100:2"],
                     ["-A", "coral", "-p", "a100", "--gres=gpu:a100:1"]):
            ours.append(run("sbatch", "--parsable", "-o", "/dev/null", "-J", "busy-record",
                            "--time=5", "--mem=1G", *argv, "--wrap=sleep 300"
                            ).stdout.strip().split(";")[0])
        time.sleep(4)
        record("scontrol_show_reservation.txt", "scontrol", "show", "reservation", "-o")
        record("squeue_own.txt", "squeue", "-h", "-t", "all", "-u", "root", "-O", SQUEUE_FORMAT)
        # 3. preemption: a tier-0 partition over the v100 nodes, QOS that preempt one another
        made.append(["scontrol", "delete", "PartitionName=busy-scav"])
        created = run("scontrol", "create", "PartitionName=busy-scav", "Nodes=v100-[01-02]",
                      "PriorityTier=0", "PreemptMode=REQUEUE", "State=UP", check=False)
        (OUT / "scontrol_create_partition.stderr").write_text(created.stderr)
        if created.returncode:
            run("scontrol", "create", "PartitionName=busy-scav", "Nodes=v100-[01-02]",
                "PriorityTier=0", "State=UP")
        record("scontrol_show_partition.txt", "scontrol", "show", "partition", "-o")
        run("sacctmgr", "-i", "add", "qos", "busy-scav")
        made.append(["sacctmgr", "-i", "delete", "qos", "busy-scav"])
        run("sacctmgr", "-i", "add", "qos", "busy-prio")
        made.append(["sacctmgr", "-i", "delete", "qos", "busy-prio"])
        run("sacctmgr", "-i", "modify", "qos", "busy-prio", "set", "Preempt=busy-scav")
        run("sacctmgr", "-i", "modify", "qos", "busy-scav", "set", "PreemptMode=requeue")
        record("sacctmgr_qos.txt", "sacctmgr", "-n", "-P", "show", "qos",
               "format=" + ",".join(QOS_FIELDS))
    finally:
        if ours:
            run("scancel", *ours, check=False)
        busy_cluster.cancel_other()
        time.sleep(2)
        for argv in reversed(made):
            run(*argv, check=False)
    print(json.dumps(sorted(p.name for p in OUT.iterdir())))


if __name__ == "__main__":
    main()
