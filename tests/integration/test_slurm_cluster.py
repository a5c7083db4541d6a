"""coral_hpc.slurm against the real local Slurm cluster: the snapshot matches Slurm's own truth
(read through a different command, sinfo) before and after jobs take GPUs, after a node drain and
after a partition drain / down; submit, cancel with grace, adopt after restart, batched states,
accounting and the test-only probe on real jobs; an unreachable controller is a typed transient
error and `coral-hpc cluster` exits 3 instead of printing an empty cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coral_hpc.slurm import (
    CliSlurmClient,
    CommandRunner,
    JobShape,
    SlurmRejected,
    SlurmUnavailable,
)
from coral_hpc.types import JobTag
from tests.conftest import wait_until

pytestmark = pytest.mark.slurm

# sinfo is our independent witness: the snapshot reads scontrol, the truth reads sinfo.
_SINFO_FMT = "NodeList:|,StateLong:|,Gres:|,GresUsed:|,Partition:|"


def _client(env: dict[str, str], **kw) -> CliSlurmClient:
    return CliSlurmClient(CommandRunner(env=env, timeout_s=60, **kw))


def slurm_truth(slurm) -> dict:
    """Per node: GPUs total, GPUs a new job could get, state; per partition: availability."""
    out = slurm.run("sinfo", "-N", "-h", "-O", _SINFO_FMT).stdout
    nodes: dict[str, dict] = {}
    for line in out.splitlines():
        name, state, gres, used, partition = line.split("|")[:5]
        total = int(re.match(r"gpu:[^:]+:(\d+)", gres).group(1))
        taken = int(re.match(r"gpu:[^:]+:(\d+)", used).group(1))
        state = state.strip().lower()
        up = state.rstrip("*~#!%$@^-") in ("idle", "mixed", "allocated", "completing") and not state.endswith("*")
        node = nodes.setdefault(name.strip(), {"total": total, "free": total - taken if up else 0, "state": state, "partitions": set()})
        node["partitions"].add(partition.strip().rstrip("*"))
    parts = {}
    for line in slurm.run("sinfo", "-h", "-o", "%R|%a").stdout.splitlines():
        name, avail = line.split("|")
        parts[name] = {"up": "up", "down": "down", "drain": "drain", "inact": "inactive"}[avail.strip()]
    return {"nodes": nodes, "partitions": parts}


def cluster_json(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """Run the installed ``coral-hpc cluster --json`` as a user would."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "coral-hpc"), "cluster", "--json", *args],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )


def ours_vs_truth(slurm) -> tuple[dict, dict]:
    """`coral-hpc cluster --json` and Slurm's truth taken around it; retried while the shared
    cluster moves underneath (other sessions' jobs), until truth before == truth after."""
    for _ in range(10):
        before = slurm_truth(slurm)
        proc = cluster_json(slurm.env)
        after = slurm_truth(slurm)
        assert proc.returncode == 0, proc.stderr
        if before == after:
            return json.loads(proc.stdout), before
        time.sleep(0.5)
    raise AssertionError("the cluster kept changing; could not take a stable reading")


def assert_matches(ours: dict, truth: dict) -> None:
    by_name = {n["name"]: n for n in ours["nodes"]}
    assert set(by_name) == set(truth["nodes"])
    for name, t in truth["nodes"].items():
        node = by_name[name]
        assert node["gpus_total"] == t["total"], name
        assert node["gpus_free"] == t["free"], (name, node["state"], t["state"])
        assert set(node["partitions"]) == t["partitions"], name
        if "drain" in t["state"]:
            assert node["state"] in ("drained", "draining"), (name, t["state"])
    assert {p["name"]: p["state"] for p in ours["partitions"]} == truth["partitions"]


def test_cluster_json_matches_slurm_before_and_after_jobs_take_gpus(slurm):
    ours, truth = ours_vs_truth(slurm)
    assert_matches(ours, truth)
    assert re.match(r"\d+\.\d+\.\d+$", ours["slurm_version"])
    job = slurm.sbatch("-p", "a100", "--gres=gpu:a100:3", "-t", "5", "-J", "coral-itest-take",
                       "--output=/dev/null", "--wrap=sleep 120")
    wait_until(lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
               30, f"job {job} RUNNING")
    ours, truth = ours_vs_truth(slurm)
    assert_matches(ours, truth)
    node = slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    mine = next(n for n in ours["nodes"] if n["name"] == node)
    assert mine["gpus_total"] - mine["gpus_free"] >= 3


def test_cluster_json_matches_after_node_drain(slurm, node_restorer):
    node_restorer.drain_node("v100-02", "coral-itest drain")
    ours, truth = ours_vs_truth(slurm)
    assert_matches(ours, truth)
    v = next(n for n in ours["nodes"] if n["name"] == "v100-02")
    assert v["gpus_free"] == 0 and v["state"] in ("drained", "draining")
    assert "coral-itest drain" in v["reason"]


@pytest.mark.parametrize("state, expected", [("DRAIN", "drain"), ("DOWN", "down")])
def test_cluster_json_matches_after_partition_drain_or_down(slurm, node_restorer, state, expected):
    node_restorer.set_partition("a100-80g", state)
    ours, truth = ours_vs_truth(slurm)
    assert_matches(ours, truth)
    assert next(p for p in ours["partitions"] if p["name"] == "a100-80g")["state"] == expected


def test_snapshot_file_round_trips_through_the_cli(slurm, tmp_path):
    proc = cluster_json(slurm.env)
    saved = tmp_path / "snap.json"
    saved.write_text(proc.stdout)
    again = cluster_json(slurm.env, "--snapshot", str(saved))
    assert again.returncode == 0 and json.loads(again.stdout) == json.loads(proc.stdout)


def _tagged_script(tmp_path: Path, tag: JobTag, body: str, extra: str = "") -> Path:
    script = tmp_path / f"{tag.replica_id}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -p v100 --gres=gpu:v100:1 -t 5 --no-requeue --output={tmp_path}/{tag.replica_id}.out\n"
        f"#SBATCH -J {tag.job_name()}\n#SBATCH --comment={tag.comment()}\n{extra}{body}"
    )
    return script


def _wait_trap_set(client, job_id: str, ready: Path) -> None:
    """Wait until the job's script has set its TERM trap. RUNNING in squeue only says the
    controller allocated the job; slurmd may not have started the script yet, and a TERM that
    lands before the ``trap`` line kills the shell with no trap run."""
    wait_until(lambda: client.job_states([job_id])[job_id].state == "RUNNING", 30, f"job {job_id} RUNNING")
    wait_until(ready.exists, 30, f"job {job_id}'s script to set its TERM trap")


def test_submit_cancel_with_grace_sends_term_first(slurm, tmp_path):
    dep = f"itest{os.getpid()}"
    marker, ready = tmp_path / "got-term", tmp_path / "trap-set"
    tag = JobTag(dep, "m", "grace1", "v100x1")
    script = _tagged_script(
        tmp_path, tag,
        f'trap \'echo "$CORAL_ITEST_WORD" > {marker}; exit 0\' TERM\ntouch {ready}\nsleep 300 &\nwait\n',
    )
    client = _client(slurm.env)
    job_id = client.submit_script(script, extra_env={"CORAL_ITEST_WORD": "drained"})
    slurm.track(job_id)
    _wait_trap_set(client, job_id, ready)
    outcome = client.cancel_with_grace([job_id], grace_s=20, poll_s=0.5)
    assert outcome == {job_id: "exited"}
    wait_until(marker.exists, 10, "the job's TERM trap to write its marker")
    assert marker.read_text().strip() == "drained"


def test_cancel_with_grace_kills_what_ignores_term(slurm, tmp_path):
    tag = JobTag(f"itest{os.getpid()}", "m", "stubborn", "v100x1")
    ready = tmp_path / "trap-set"
    script = _tagged_script(tmp_path, tag, f"trap '' TERM\ntouch {ready}\nwhile true; do sleep 1; done\n")
    client = _client(slurm.env)
    job_id = client.submit_script(script)
    slurm.track(job_id)
    _wait_trap_set(client, job_id, ready)
    started = time.monotonic()
    assert client.cancel_with_grace([job_id], grace_s=3, poll_s=0.5) == {job_id: "cancelled"}
    assert time.monotonic() - started >= 3
    wait_until(lambda: (client.job_states([job_id])[job_id].state or "").startswith("CANCELLED"),
               30, f"job {job_id} CANCELLED")


def test_adopt_after_restart_and_batched_states(slurm, tmp_path):
    dep = f"itest{os.getpid()}"
    first = _client(slurm.env)
    ids = []
    for replica in ("a1", "a2"):
        job = first.submit_script(_tagged_script(tmp_path, JobTag(dep, "m", replica, "v100x1"), "sleep 120\n"))
        slurm.track(job)
        ids.append(job)
    # a new client (the daemon restarted) finds both by their tag
    fresh = _client(slurm.env)
    def both_seen():
        snapshot = fresh.snapshot(dep)
        return snapshot if {j.job_id for j in snapshot.jobs} >= set(ids) else None

    snap = wait_until(both_seen, 30, "both tagged jobs in a new client's snapshot")
    adopted = {j.job_id: j for j in snap.jobs}
    assert {adopted[i].tag.replica_id for i in ids} == {"a1", "a2"}
    assert all(j.tag.deployment == dep for j in snap.jobs)
    fresh.runner.reset_counters()
    states = fresh.job_states(ids)
    assert set(states) == set(ids) and fresh.runner.calls["squeue"] == 1
    fresh.cancel(ids)
    # after the end, sacct answers once squeue has forgotten (or squeue still shows CANCELLED)
    wait_until(lambda: all((s.state or "").startswith("CANCELLED") for s in fresh.job_states(ids).values()),
               30, "both jobs CANCELLED")


def test_accounting_reads_a_finished_job(slurm, tmp_path):
    dep = f"itest{os.getpid()}"
    client = _client(slurm.env)
    start = time.time() - 5
    job = client.submit_script(_tagged_script(tmp_path, JobTag(dep, "acct", "r1", "v100x1"), "sleep 2\n"))
    slurm.track(job)
    records = wait_until(
        lambda: [r for r in client.accounting(dep, start, time.time() + 5) if r.job_id == job and r.end_time],
        60, f"sacct to record job {job} as finished",
    )
    record = records[0]
    assert record.gpus == 1 and record.gpu_type == "v100" and record.partition == "v100"
    assert record.state == "COMPLETED" and record.elapsed_s >= 2 and record.billing is not None
    assert record.tag == JobTag(dep, "acct", "r1", "v100x1")


def test_test_only_probe_and_permanent_errors(slurm):
    client = _client(slurm.env)
    estimate = client.test_only(JobShape("v100", 1, "v100", time_limit_s=600))
    assert estimate.partition == "v100" and estimate.nodes and estimate.wait_s < 3 * 86400
    with pytest.raises(SlurmRejected):
        client.test_only(JobShape("no-such-partition", 1, "v100"))
    with pytest.raises(SlurmRejected):
        client.test_only(JobShape("v100", 99, "v100"))


@pytest.fixture
def unreachable_env(slurm, tmp_path) -> dict[str, str]:
    """SLURM_CONF pointing at a copy of the conf whose controller port is closed (the shared
    cluster itself stays up)."""
    conf = Path(slurm.env["SLURM_CONF"])
    text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1", conf.read_text())
    (tmp_path / "slurm.conf").write_text(text)
    for extra in ("gres.conf",):
        if (conf.parent / extra).exists():
            (tmp_path / extra).write_text((conf.parent / extra).read_text())
    return {**slurm.env, "SLURM_CONF": str(tmp_path / "slurm.conf")}


def test_unreachable_controller_is_transient_not_empty(unreachable_env):
    client = _client(unreachable_env, attempts=1)
    with pytest.raises(SlurmUnavailable):
        client.snapshot("any")
    proc = cluster_json(unreachable_env)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "unreachable" in proc.stderr.lower()
