"""GPU names as sites write them, untyped GRES, reservations, partition and QOS limits, and
Slurm's start estimates within a call budget — on recorded Slurm 22.05 output (the busy
recordings come from the local cluster with every v100 GPU held by another user's jobs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coral_hpc.errors import TransientError
from coral_hpc.slurm.availability import StartProber
from coral_hpc.slurm.build import build_snapshot, resolve_gpu_types
from coral_hpc.slurm.errors import SlurmRejected, SlurmUnavailable
from coral_hpc.slurm.gpu_names import catalogue_lookup, catalogue_type, name_words
from coral_hpc.slurm.parse_jobs import parse_test_only
from coral_hpc.slurm.parse_limits import build_limits, parse_assoc, parse_qos, qos_limits
from coral_hpc.slurm.parse_nodes import parse_nodes_text, parse_partitions_text
from coral_hpc.slurm.parse_reservations import parse_reservations
from coral_hpc.slurm.snapshot import ClusterSnapshot, JobShape, StartEstimate
from tests.support.virtual_time import VirtualClock

REC = Path(__file__).resolve().parents[1] / "data" / "slurm" / "22.05"


def rec(name: str) -> str:
    return (REC / name).read_text()


KNOWN, MEMORY = catalogue_lookup()

# GRES type names as sites write them → the catalogue type (profiles/gpus.yaml). The NVML-style
# names are what Slurm's AutoDetect=nvml makes of NVML's product names (lower case, spaces as
# underscores); the rest are hand-written spellings seen in gres.conf files.
SITE_NAMES = [
    ("nvidia_a100-sxm4-80gb", "a100-80g"),
    ("nvidia_a100-sxm4-40gb", "a100"),
    ("nvidia_a100-pcie-40gb", "a100"),
    ("nvidia_a100_80gb_pcie", "a100-80g"),
    ("tesla_v100-sxm2-32gb", "v100-32g"),
    ("tesla_v100-sxm2-16gb", "v100"),
    ("tesla_v100-pcie-16gb", "v100"),
    ("nvidia_h100_80gb_hbm3", "h100"),
    ("nvidia_h100-sxm5-80gb", "h100"),
    ("tesla_t4", "t4"),
    ("nvidia_l40s", "l40s"),
    ("nvidia_a40", "a40"),
    ("nvidia_a10", "a10"),
    ("nvidia_l4", "l4"),
    ("A100_80GB", "a100-80g"),
    ("a100-80g", "a100-80g"),
    ("v100", "v100"),
    ("V100-32GB", "v100-32g"),
]


@pytest.mark.parametrize("site, expected", SITE_NAMES)
def test_site_gpu_names_map_to_catalogue_types(site, expected):
    assert catalogue_type(site, KNOWN, MEMORY) == expected


@pytest.mark.parametrize(
    "site",
    [
        "nvidia_geforce_rtx_3090",
        "tesla_v100s-pcie-32gb",
        "mi250x",
        "nvidia_a100-sxm4-64gb",
        "gpu",
        "",
    ],
)
def test_names_no_catalogue_type_fits_map_to_none(site):
    # V100S is a different chip (1134 GB/s), a 64 GB A100 does not exist: no guessing
    assert catalogue_type(site, KNOWN, MEMORY) is None


def test_the_site_map_wins_and_names_split_into_model_and_memory():
    assert (
        catalogue_type(
            "tesla_v100s-pcie-32gb", KNOWN, MEMORY, {"Tesla_V100S-PCIE-32GB": "v100-32g"}
        )
        == "v100-32g"
    )
    assert name_words("nvidia_h100_80gb_hbm3") == ("h100", 80)
    assert name_words("tesla_v100s-pcie-32gb") == ("v100s", 32)


def _renamed(line: str, gres: str, features: str = "(null)") -> str:
    """A recorded node line with another GRES (as a site using NVML names would show it)."""
    out = re.sub(r"Gres=\S+", f"Gres={gres}", line, count=1)
    return out.replace("AvailableFeatures=(null)", f"AvailableFeatures={features}", 1)


def test_nvml_gres_and_untyped_gres_with_features_are_typed_and_the_rest_warned():
    lines = rec("scontrol_show_node.txt").splitlines()
    text = "\n".join(
        [
            _renamed(lines[0], "gpu:nvidia_a100-sxm4-40gb:4(S:0)"),
            _renamed(lines[1], "gpu:4", "a100,ib"),
            _renamed(lines[2], "gpu:nvidia_geforce_rtx_3090:4"),
            _renamed(lines[3], "gpu:4"),
        ]
    )
    raw = parse_nodes_text(text)
    assert raw[1].gpu_type is None and raw[1].features == ("a100", "ib")
    typed, warnings, site_names = resolve_gpu_types(raw)
    assert [n.gpu_type for n in typed] == ["a100", "a100", "nvidia_geforce_rtx_3090", None]
    assert site_names == {raw[0].name: "nvidia_a100-sxm4-40gb"}
    assert len(warnings) == 1
    assert "'nvidia_geforce_rtx_3090'" in warnings[0] and raw[2].name in warnings[0]
    assert "cluster.gpu_type_map" in warnings[0]
    # the config mapping types every untyped gpu:N and renames what the catalogue lacks
    typed, warnings, _ = resolve_gpu_types(raw, {"gpu": "a100", "nvidia_geforce_rtx_3090": "l40s"})
    assert [n.gpu_type for n in typed] == ["a100", "a100", "l40s", "a100"] and warnings == []


def test_the_snapshot_carries_the_warnings_and_the_site_name():
    lines = rec("scontrol_show_node.txt").splitlines()
    text = "\n".join(
        [
            _renamed(lines[0], "gpu:nvidia_a100-sxm4-40gb:4"),
            _renamed(lines[2], "gpu:mystery_9000:4"),
        ]
    )
    snap = build_snapshot(
        slurm_version="22.05.8",
        observed_at=1.0,
        deployment="d",
        backend="cli",
        raw_nodes=parse_nodes_text(text),
        raw_partitions=parse_partitions_text(rec("scontrol_show_partition.txt")),
        jobs=[],
        limits=None,
        gpu_memory=MEMORY,
    )
    first = snap.nodes[0]
    assert first.gpu_type == "a100" and first.site_gpu_type == "nvidia_a100-sxm4-40gb"
    assert first.gpu_memory_gb == 40.0
    assert any("mystery_9000" in w for w in snap.warnings)
    again = ClusterSnapshot.from_json(snap.to_json())
    assert again.warnings == snap.warnings and again.nodes == snap.nodes


def test_partition_max_nodes_qos_and_preempt_mode_are_parsed():
    parts = {p.name: p for p in parse_partitions_text(rec("scontrol_show_partition.txt"))}
    assert parts["v100"].max_nodes is None and parts["v100"].qos is None
    assert parts["v100"].preempt_mode == "off"
    line = rec("scontrol_show_partition.txt").splitlines()[0]
    line = line.replace("MaxNodes=UNLIMITED", "MaxNodes=2").replace("QoS=N/A", "QoS=gpu-part")
    (part,) = parse_partitions_text(line.replace("PreemptMode=OFF", "PreemptMode=REQUEUE"))
    assert (part.max_nodes, part.qos, part.preempt_mode) == (2, "gpu-part", "requeue")


def test_qos_max_tres_per_user_and_nodes_per_job_are_kept_apart():
    assoc = parse_assoc("coral|root||normal|normal||gres/gpu=8,node=2|||\n")
    qos = parse_qos("normal||gres/gpu=4,node=1|gres/gpu=6|||\n")
    limits = build_limits(assoc, qos, "root", "coral", None, 1.0)
    assert limits.max_gpus_per_user == 6 and limits.grp_gpus == 6
    assert limits.max_gpus_per_job == 4 and limits.max_nodes_per_job == 1
    part = qos_limits(qos, "normal", 1.0)
    assert part is not None and part.max_gpus_per_job == 4
    assert qos_limits(qos, "other", 1.0) is None


def test_reservations_the_user_may_use():
    (res,) = parse_reservations(rec("scontrol_show_reservation.txt"), "root", None)
    assert res.name == "busy-record" and res.nodes == ("v100-02",) and res.state == "inactive"
    assert res.end - res.start == 60
    assert parse_reservations(rec("scontrol_show_reservation.txt"), "alice", "other") == ()
    assert parse_reservations(rec("scontrol_show_reservation_none.txt"), "root", None) == ()


def test_busy_test_only_recording_gives_a_start_after_the_holding_job():
    observed = float(rec("sbatch_test_only_busy.observed_at"))
    start, nodes, partition = parse_test_only(rec("sbatch_test_only_busy.txt.stderr"))
    # the other user's job on v100-01 had a 2-minute limit: Slurm expects to start ours then
    assert 60 < start - observed < 130 and nodes == ("v100-01",) and partition == "v100"


class FakeClient:
    """test_only answers replayed from recordings (or an error), counting calls."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def test_only(self, shape: JobShape) -> StartEstimate:
        self.calls.append(shape)
        answer = self.answers[(shape.partition, shape.gpus_per_node)]
        if isinstance(answer, Exception):
            raise answer
        start, nodes, partition = parse_test_only(rec(answer))
        return StartEstimate(
            start, nodes, partition, float(rec("sbatch_test_only_busy.observed_at"))
        )


def test_the_prober_keeps_to_its_budget_and_caches_per_epoch():
    observed = float(rec("sbatch_test_only_busy.observed_at"))
    client = FakeClient(
        {
            ("v100", 1): "sbatch_test_only_busy.txt.stderr",
            ("v100", 4): "sbatch_test_only_busy_4.txt.stderr",
            ("a100", 1): SlurmRejected(
                "sbatch: error: Batch job submission failed: Job violates "
                "accounting/QOS policy (job submit limit, user's size and/or "
                "time limits)"
            ),
            ("a100", 4): SlurmUnavailable("slurmctld not responding"),
        }
    )
    clock = VirtualClock(observed)
    prober = StartProber(client, calls_per_min=3, ttl_s=60, clock=clock)
    shapes = [
        JobShape("v100", 1, "v100"),
        JobShape("v100", 4, "v100"),
        JobShape("a100", 1, "a100"),
        JobShape("a100", 4, "a100"),
    ]
    first = prober.estimates(shapes)
    # 3 probes a minute: the fourth shape is not asked
    assert len(client.calls) == 3 and prober.calls == 3
    assert [(e.partition, e.gpus_per_node) for e in first] == [
        ("v100", 1),
        ("v100", 4),
        ("a100", 1),
    ]
    assert first[0].node_names == ("v100-01",) and 60 < first[0].wait_s < 130
    assert first[2].start is None and "QOS policy" in first[2].error and first[2].wait_s is None
    # within the epoch: everything from the cache, no call
    clock.now += 30
    assert prober.estimates(shapes[:3]) == first and len(client.calls) == 3
    # 40 s later the estimates are stale and the bucket holds 3 × 70/60 → capped at 3 probes
    clock.now += 40
    again = prober.estimates(shapes)
    assert len(client.calls) == 6
    # the transient failure keeps no new word; the shapes probed before keep theirs
    assert [(e.partition, e.gpus_per_node) for e in again] == [
        ("v100", 1),
        ("v100", 4),
        ("a100", 1),
    ]
    assert isinstance(SlurmUnavailable("x"), TransientError)


def test_a_shape_beyond_the_budget_keeps_its_stale_estimate():
    observed = float(rec("sbatch_test_only_busy.observed_at"))
    client = FakeClient(
        {
            ("v100", 1): "sbatch_test_only_busy.txt.stderr",
            ("v100", 4): "sbatch_test_only_busy_4.txt.stderr",
        }
    )
    clock = VirtualClock(observed)
    prober = StartProber(client, calls_per_min=1, ttl_s=10, clock=clock)
    (one,) = prober.estimates([JobShape("v100", 1, "v100")])
    clock.now += 20  # stale, and only 1/3 of a token back
    assert prober.estimates([JobShape("v100", 1, "v100")]) == (one,)
    assert len(client.calls) == 1
    with pytest.raises(ValueError):
        StartProber(client, calls_per_min=0)


def test_cached_gives_this_epochs_estimates_without_a_call():
    observed = float(rec("sbatch_test_only_busy.observed_at"))
    client = FakeClient({("v100", 1): "sbatch_test_only_busy.txt.stderr"})
    clock = VirtualClock(observed)
    prober = StartProber(client, calls_per_min=6, ttl_s=60, clock=clock)
    assert prober.cached() == ()
    (one,) = prober.estimates([JobShape("v100", 1, "v100")])
    clock.now += 30
    assert prober.cached() == (one,) and len(client.calls) == 1
    clock.now += 40
    assert prober.cached() == ()
