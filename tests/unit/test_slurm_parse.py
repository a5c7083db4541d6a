"""Pure parsers of coral_hpc.slurm, on real Slurm 22.05 output recorded from the local cluster
(tests/data/slurm/22.05) and on 23.02 JSON derived from the published schema."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coral_hpc.slurm.billing import billing_sum, parse_billing_weights, parse_tres
from coral_hpc.slurm.errors import SlurmParseError
from coral_hpc.slurm.hostlist import compress_hostlist, expand_hostlist
from coral_hpc.slurm.parse_jobs import (
    parse_sacct_accounting,
    parse_sacct_states,
    parse_sbatch_parsable,
    parse_squeue,
    parse_test_only,
    parse_version,
)
from coral_hpc.slurm.parse_limits import build_limits, parse_assoc, parse_qos
from coral_hpc.slurm.parse_nodes import (
    parse_nodes_json,
    parse_nodes_text,
    parse_partitions_json,
    parse_partitions_text,
    split_key_values,
)
from coral_hpc.slurm.timefmt import parse_duration, parse_timestamp

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
REC = DATA / "22.05"


def rec(name: str) -> str:
    return (REC / name).read_text()


# --------------------------------------------------------------------------- hostlists, times, TRES


@pytest.mark.parametrize(
    "expr, names",
    [
        ("a100-[01-02]", ("a100-01", "a100-02")),
        ("a100-[01-02],a100-80g-01,v100-[01-02]",
         ("a100-01", "a100-02", "a100-80g-01", "v100-01", "v100-02")),
        ("gpu[1,3-4]", ("gpu1", "gpu3", "gpu4")),
        ("r[1-2]n[08-09]", ("r1n08", "r1n09", "r2n08", "r2n09")),
        ("node7", ("node7",)),
        ("", ()),
        ("(null)", ()),
        ("N/A", ()),
    ],
)
def test_hostlist_expands_like_slurm(expr, names):
    assert expand_hostlist(expr) == names


def test_hostlist_compress_round_trips():
    names = ("a100-01", "a100-02", "a100-04", "v100-01")
    assert compress_hostlist(names) == "a100-[01-02,04],v100-01"
    assert expand_hostlist(compress_hostlist(names)) == names


def test_hostlist_rejects_reversed_range():
    with pytest.raises(ValueError):
        expand_hostlist("n[5-2]")


@pytest.mark.parametrize(
    "text, seconds",
    [("30:00", 1800), ("29:52", 1792), ("2-00:00:00", 172800), ("12:00:00", 43200), ("1:00", 60),
     ("5", 300), ("1-02", 93600), ("UNLIMITED", None), ("INVALID", None), ("N/A", None)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_duration_garbage_raises():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_timestamps_are_local_time():
    assert parse_timestamp("2026-11-29T22:30:10") - parse_timestamp("2026-11-29T22:00:10") == 1800
    assert parse_timestamp("Unknown") is None and parse_timestamp("N/A") is None


def test_tres_parses_memory_to_gb_and_typed_gpus():
    tres = parse_tres("cpu=8,mem=32G,node=1,billing=5,gres/gpu=2,gres/gpu:a100=2")
    assert tres == {"cpu": 8, "mem": 32.0, "node": 1, "billing": 5, "gres/gpu": 2, "gres/gpu:a100": 2}
    assert parse_tres("mem=512M")["mem"] == 0.5
    assert parse_tres("mem=2048")["mem"] == 2.0  # a bare number is MB
    with pytest.raises(ValueError):
        parse_tres("cpu")


def test_billing_weights_mem_unit_is_per_gb():
    weights = parse_billing_weights("CPU=0.05,Mem=0.01G,GRES/gpu:v100=1.2,GRES/gpu:a100=3.0")
    assert weights == {"cpu": 0.05, "mem": 0.01, "gres/gpu:v100": 1.2, "gres/gpu:a100": 3.0}
    assert parse_billing_weights("Mem=1024")["mem"] == pytest.approx(1024 * 1024)  # bare = per MB
    with pytest.raises(ValueError):
        parse_billing_weights("CPU=lots")


def test_billing_sum_counts_untyped_and_typed_gpu_weights():
    weights = {"gres/gpu": 1.0, "gres/gpu:a100": 2.0, "cpu": 0.5}
    assert billing_sum(weights, gpus=2, gpu_type="a100", cpus=4, mem_gb=0) == 2 * 1 + 2 * 2 + 2
    assert billing_sum({}, gpus=2, gpu_type="a100", cpus=4, mem_gb=8) == 4  # no weights: CPUs


# --------------------------------------------------------------------------- scontrol


def test_key_values_keep_spaces_in_values():
    line = "NodeName=a OS=Linux 6.1 #1 SMP  RealMemory=10 Reason=disk failed [root@2026]"
    assert split_key_values(line) == {
        "NodeName": "a", "OS": "Linux 6.1 #1 SMP", "RealMemory": "10", "Reason": "disk failed [root@2026]"
    }


def test_nodes_from_recorded_scontrol():
    nodes = {n.name: n for n in parse_nodes_text(rec("scontrol_show_node.txt"))}
    assert set(nodes) == {"a100-01", "a100-02", "a100-80g-01", "v100-01", "v100-02"}
    assert nodes["a100-80g-01"].gpu_type == "a100-80g" and nodes["a100-80g-01"].gpus_total == 8
    assert nodes["a100-01"].partitions == ("a100", "gpu")
    # a drained idle node and a draining busy node, as recorded
    assert nodes["a100-02"].state_words == ("IDLE", "DRAIN")
    assert nodes["a100-02"].reason.startswith("coral-record idle drain")
    assert "DRAIN" in nodes["v100-02"].state_words
    assert nodes["a100-01"].mem_gb == 64.0


def test_nodes_gpus_alloc_match_running_jobs():
    """GPUs scontrol counts as allocated on each node = GPUs of the running jobs squeue puts there."""
    nodes = {n.name: n for n in parse_nodes_text(rec("scontrol_show_node.txt"))}
    per_node: dict[str, int] = {}
    for job in parse_squeue(rec("squeue_own.txt")):
        parts = job.components or [job]
        for part in parts:
            if part.state == "RUNNING" and len(part.nodes) == 1:
                per_node[part.nodes[0]] = per_node.get(part.nodes[0], 0) + part.gpus
    for name, node in nodes.items():
        # other users' jobs may add GPUs, never remove them
        assert node.gpus_alloc >= per_node.get(name, 0), name


def test_down_node_recorded():
    nodes = {n.name: n for n in parse_nodes_text(rec("scontrol_show_node_down.txt"))}
    assert nodes["v100-02"].state_words[0] == "DOWN"


def test_partitions_from_recorded_scontrol():
    parts = {p.name: p for p in parse_partitions_text(rec("scontrol_show_partition.txt"))}
    assert parts["gpu"].nodes == ("a100-01", "a100-02", "a100-80g-01", "v100-01", "v100-02")
    assert parts["gpu"].default and not parts["a100"].default
    assert parts["a100-80g"].max_time_s == 86400 and parts["gpu"].max_time_s == 43200
    assert parts["a100"].billing_weights == {"cpu": 0.05, "mem": 0.01, "gres/gpu": 2.5}
    assert all(p.state == "up" for p in parts.values())


def test_partition_states_drain_down_inactive():
    parts = {p.name: p.state for p in parse_partitions_text(rec("scontrol_show_partition_drain_down.txt"))}
    assert parts["a100-80g"] == "drain" and parts["v100"] == "down" and parts["a100"] == "up"
    parts = {p.name: p.state for p in parse_partitions_text(rec("scontrol_show_partition_inactive.txt"))}
    assert parts["v100"] == "inactive"


def test_scontrol_garbage_raises_but_blank_lines_do_not():
    good = rec("scontrol_show_node.txt")
    assert len(parse_nodes_text("\n\n" + good + "\n\n")) == 5
    with pytest.raises(SlurmParseError, match="line 2"):
        parse_nodes_text(good.splitlines()[0] + "\nthis is not scontrol output\n")


def test_slurm_23_json_gives_the_same_records_as_22_text():
    """The derived 23.02 JSON describes the same cluster state as the recorded 22.05 text."""
    text_nodes = parse_nodes_text(rec("scontrol_show_node.txt"))
    json_nodes = parse_nodes_json((DATA / "23.02-derived" / "scontrol_show_node.json").read_text())
    assert json_nodes == text_nodes
    text_parts = parse_partitions_text(rec("scontrol_show_partition_drain_down.txt"))
    json_parts = parse_partitions_json((DATA / "23.02-derived" / "scontrol_show_partition.json").read_text())
    assert json_parts == text_parts


def test_json_errors_list_is_surfaced():
    with pytest.raises(SlurmParseError, match="Unable to contact"):
        parse_nodes_json('{"errors": [{"error": "Unable to contact slurm controller"}], "nodes": []}')
    with pytest.raises(SlurmParseError, match="not JSON"):
        parse_partitions_json("slurm_load_partitions error")


# --------------------------------------------------------------------------- squeue


def test_squeue_recorded_jobs():
    jobs = {j.job_id: j for j in parse_squeue(rec("squeue_own.txt"))}
    tagged = [j for j in jobs.values() if j.tag and j.tag.deployment == "dep1"]
    by_model = {j.tag.model: j for j in tagged if j.array_task_id is None}
    llama = by_model["llama"]
    assert llama.state == "RUNNING" and llama.gpus == 2 and llama.gpu_type == "a100"
    assert llama.nodes == ("a100-01",) and llama.time_limit_s == 1800
    assert 0 < llama.time_left_s <= 1800
    assert llama.end_time - llama.start_time == 1800
    # a hetjob is one job with two components
    hets = [j for j in jobs.values() if j.components and j.state == "RUNNING"]
    assert hets
    for het in hets:
        assert [c.job_id for c in het.components] == [f"{het.job_id}+0", f"{het.job_id}+1"]
        assert [c.partition for c in het.components] == ["a100", "v100"]
        assert het.gpus == sum(c.gpus for c in het.components) and het.gpu_type is None
        assert set(het.nodes) == {"a100-01", "v100-01"}
    tagged_het = next(j for j in jobs.values() if j.components and j.tag)
    assert tagged_het.tag.deployment == "lt" and len(tagged_het.components) == 2
    # a comment whose template id has characters outside the tag alphabet ('+') is not ours
    assert all(j.tag is None for j in jobs.values() if j.name == "coral.dep1.qwen.h1")
    # pending on Resources: an expected start in the future, no start time
    big = [j for j in tagged if j.tag.model == "big" and j.state == "PENDING"]
    assert big and all(j.expected_start and j.start_time is None for j in big)
    # someone else's job has no tag; a held job of another deployment keeps its own tag
    assert any(j.tag is None and j.name == "somebody" for j in jobs.values())
    held = [j for j in jobs.values() if j.tag and j.tag.deployment == "dep2"]
    assert held and held[-1].reason == "JobHeldUser" and held[-1].expected_start is None


def test_squeue_job_arrays_keep_task_ids():
    jobs = [j for j in parse_squeue(rec("squeue_own.txt")) if j.tag and j.tag.model == "mistral"]
    tasks = {j.array_task_id for j in jobs if j.state in ("RUNNING", "PENDING")}
    assert {"0", "1", "2-5%2"} <= tasks
    assert {j.array_job_id for j in jobs if j.state in ("RUNNING", "PENDING")} == {
        j.job_id for j in jobs if j.array_task_id == "2-5%2" and j.state == "PENDING"
    }


def test_squeue_finished_states_told_apart():
    jobs = parse_squeue(rec("squeue_job_states.txt"))
    kinds = {j.tag.model: j.end_kind for j in jobs if j.tag}
    assert kinds["tmo"] == "timeout" and kinds["nf"] == "node_fail"
    assert kinds["llama"] is None  # still running


def test_squeue_comment_with_bar_and_garbage():
    line = rec("squeue_own.txt").splitlines()[0]
    fields = line.split("|")
    # today's format: Account and Reservation follow the Comment, which may hold a "|"
    tricky = "|".join(fields[:-2]) + "|coral:deployment=d;model=m;replica=r|x|lab|maint|"
    job = parse_squeue(tricky)[0]
    assert job.tag is None  # "r|x" is not a safe replica id: not ours
    assert (job.account, job.reservation) == ("lab", "maint")
    # a recorded row of the format before them (19 fields) still reads, with neither known
    legacy = parse_squeue(line)[0]
    assert legacy.account is None and legacy.reservation is None
    with pytest.raises(SlurmParseError):  # 20 fields: neither format
        parse_squeue("|".join(fields[:-2]) + "|a|b|")
    with pytest.raises(SlurmParseError):
        parse_squeue("garbage without bars")
    with pytest.raises(SlurmParseError):
        parse_squeue("1|2|3|")
    assert parse_squeue("\n\n") == []


# --------------------------------------------------------------------------- sacct


def test_accounting_records_hetjob_components_and_requeues():
    now = 2e9
    records = parse_sacct_accounting(rec("sacct_own.txt"), "acctrec", now)
    ids = [r.job_id for r in records]
    assert any(i.endswith("+0") for i in ids) and any(i.endswith("+1") for i in ids)
    het = [r for r in records if r.het_job_id]
    assert {r.partition for r in het} == {"a100", "v100"}
    # a requeued job gives one record per run, each with its own start
    rq = [r for r in records if r.tag.model == "rq"]
    assert len(rq) >= 2 and len({r.start_time for r in rq}) == len(rq)
    assert all(r.tag.deployment == "acctrec" for r in records)
    assert all(r.observed_at == now for r in records)


def test_accounting_fields_from_alloctres():
    records = parse_sacct_accounting(rec("sacct_own.txt"), "dep1", 0.0)
    tmo = next(r for r in records if r.tag.model == "tmo" and r.state == "TIMEOUT")
    assert tmo.gpus == 1 and tmo.gpu_type == "a100-80g" and tmo.billing == 3
    assert tmo.elapsed_s == tmo.end_time - tmo.start_time
    assert tmo.end_kind == "timeout"
    nf = next(r for r in records if r.tag.model == "nf")
    assert nf.end_kind == "node_fail"


def test_running_jobs_known_by_name_while_sacct_lacks_the_comment():
    records = parse_sacct_accounting(rec("sacct_running.txt"), "dep1", 0.0)
    running = [r for r in records if r.state == "RUNNING"]
    assert running and all(r.end_time is None and r.elapsed_s > 0 for r in running)
    assert {r.tag.model for r in running} >= {"llama", "qwen"}
    assert all(r.tag.deployment == "dep1" for r in records)


def test_accounting_skips_steps_and_foreign_jobs():
    steps = rec("sacct_steps.txt")
    assert ".batch" in steps and "+0.0" in steps  # (no .extern: the dev cluster has no PrologFlags=contain)
    records = parse_sacct_accounting(steps, "dep1", 0.0)
    assert records and all("." not in r.job_id for r in records)
    assert all(r.tag is not None for r in parse_sacct_accounting(steps, None, 0.0))


def test_sacct_states_by_raw_id():
    states = parse_sacct_states(rec("sacct_job_states.txt"), 5.0)
    assert any(s.state == "TIMEOUT" for s in states.values())
    assert any(s.state.startswith("CANCELLED") and s.finished for s in states.values())
    assert all(s.source == "sacct" and s.observed_at == 5.0 for s in states.values())


# --------------------------------------------------------------------------- one-liners, limits


def test_sbatch_parsable_and_test_only():
    assert parse_sbatch_parsable("123\n") == "123"
    assert parse_sbatch_parsable("124;coral-dev\n") == "124"
    with pytest.raises(SlurmParseError):
        parse_sbatch_parsable("")
    start, nodes, partition = parse_test_only(rec("sbatch_test_only.txt.stderr"))
    assert nodes == ("a100-80g-01",) and partition == "a100-80g" and start > 0
    with pytest.raises(SlurmParseError):
        parse_test_only("sbatch: error: something")


def test_version():
    assert parse_version(rec("version.txt")) == "22.05.8"
    assert parse_version("slurm 23.11.4\n") == "23.11.4"
    with pytest.raises(SlurmParseError):
        parse_version("command not found")


def test_limits_recorded_and_tightest_wins():
    assoc = parse_assoc(rec("sacctmgr_assoc.txt"))
    qos = parse_qos(rec("sacctmgr_qos.txt"))
    limits = build_limits(assoc, qos, "root", None, None, 7.0)
    assert limits.qos == "normal" and limits.grp_gpus is None and limits.max_jobs is None
    assoc = parse_assoc("coral||||normal|gres/gpu=16|gres/gpu=8|||\ncoral|root||normal|normal|gres/gpu=12,gres/gpu:a100=4||5||\n")
    qos = parse_qos("normal|gres/gpu=20||gres/gpu=10||4|50\n")
    limits = build_limits(assoc, qos, "root", "coral", None, 7.0)
    assert limits.grp_gpus == 10  # QOS per-user cap binds the single daemon user
    assert limits.grp_gpus_by_type == {"a100": 4}
    assert limits.max_gpus_per_job == 8 and limits.max_jobs == 4 and limits.max_submit_jobs == 50
    with pytest.raises(SlurmParseError):
        parse_assoc("too|few\n")


def test_recorded_billing_matches_slurms_alloctres():
    """Slurm's billing= in AllocTRES equals floor(billing_for(...)) of the partition's weights,
    for every recorded job — the formula plans and accounting share is Slurm's own."""
    from coral_hpc.slurm.billing import gpus_in_tres

    parts = {p.name: p for p in parse_partitions_text(rec("scontrol_show_partition.txt"))}
    checked = 0
    for line in rec("sacct_own.txt").splitlines():
        fields = line.split("|")
        partition, tres_text = fields[3], fields[7]
        if not tres_text or partition not in parts:
            continue
        tres = parse_tres(tres_text)
        gpus, gpu_type = gpus_in_tres(tres)
        expected = billing_sum(parts[partition].billing_weights, gpus, gpu_type, tres["cpu"], tres["mem"])
        assert tres["billing"] == math.floor(expected + 1e-9), line
        checked += 1
    assert checked >= 10
