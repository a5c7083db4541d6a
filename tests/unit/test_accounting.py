"""coral_hpc.accounting: sacct records in, exact GPU-seconds and cost out.

The records are REAL sacct output from the local cluster (tests/data/accounting/22.05, recorded by
record-22.05.sh), parsed by the Slurm layer's own parser. Expected figures are worked out by hand
below from the times in that recording (UTC, one-second granularity):

    job 43 done   v100  2 GPUs  billing 3  22:04:50 → 22:04:54   4 s
    job 44 cross  a100  2 GPUs  billing 6  22:04:50 → 22:04:58   8 s
    job 45 run    a100  1 GPU   billing 3  22:04:52 → running (recorded at 22:05:08)
    job 46 rq     v100  1 GPU   billing 1  22:04:52 → 22:04:56 (REQUEUED), 22:04:58 → 22:05:03
    job 47 somebody-else (no coral tag)
    job 48 het    +0 a100 1 GPU billing 3, +1 v100 2 GPUs billing 3, 22:05:00 → 22:05:04
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from coral_hpc.accounting import build_report
from coral_hpc.accounting.cost import Pricing
from coral_hpc.accounting.predicted import compare, predicted_cost
from coral_hpc.accounting.usage import day_bins, runs_from_records, usage
from coral_hpc.config import parse_deployment
from coral_hpc.slurm.parse_jobs import parse_sacct_accounting
from coral_hpc.slurm.parse_nodes import parse_partitions_text
from coral_hpc.slurm.snapshot import AccountingRecord
from coral_hpc.store import DemandInterval, PlanRecord, ReplicaRecord
from coral_hpc.types import JobTag

DATA = Path(__file__).resolve().parent.parent / "data" / "accounting" / "22.05"
UTC = timezone.utc
V100, A100 = 1.0, 2.5  # prices per GPU-hour in the test deployment


def t(hms: str) -> float:
    """Epoch of a time of day on the recording's date (UTC)."""
    return datetime.fromisoformat(f"2026-11-29T{hms}+00:00").timestamp()


def deployment(price: str = "gpu_hour", name: str = "acctrec"):
    prices = (
        (f"{{v100: {V100}}}", f"{{a100: {A100}}}") if price == "gpu_hour" else ("billing", "billing")
    )
    models = "\n".join(
        f"  - {{name: {m}, source: x, architecture: x, mix: {{input_tokens: 100, output_tokens: 10}},"
        f" demand: auto, slo: {{ttft_s: 1, tpot_s: 0.1}}}}"
        for m in ("done", "cross", "run", "rq", "het")
    )
    return parse_deployment(
        f"""
deployment: {name}
state_dir: /tmp/coral-test-state
db_path: /tmp/coral-test.db
engine: {{kind: sim}}
cluster:
  partitions:
    - {{name: v100, gpu_types: [v100], price: {prices[0]}}}
    - {{name: a100, gpu_types: [a100], price: {prices[1]}}}
models:
{models}
"""
    )


@pytest.fixture(scope="module")
def recorded() -> tuple[list[AccountingRecord], float]:
    """The recorded sacct rows parsed by coral_hpc.slurm, and the recording's wall-clock time."""
    now = float((DATA / "now.txt").read_text())
    records = parse_sacct_accounting((DATA / "sacct_own.txt").read_text(), "acctrec", now)
    return records, now


def report(records, since, until, now, **kwargs):
    kwargs.setdefault("tz", UTC)
    return build_report(kwargs.pop("dep", None) or deployment(), records, since, until, now, **kwargs)


def model_row(data: dict, model: str) -> dict:
    return next(m for m in data["models"] if m["model"] == model)


# --------------------------------------------------------------------------- recorded jobs


def test_recording_is_what_the_expectations_assume(recorded):
    records, now = recorded
    assert now == t("22:05:08")
    ids = sorted({r.job_id for r in records})
    assert "47" not in ids  # someone else's job is not ours
    assert set(ids) == {"43", "44", "45", "46", "48+0", "48+1"}


def test_completed_job_gpu_seconds_and_cost(recorded):
    records, now = recorded
    data = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
    done = model_row(data, "done")
    assert done["gpu_seconds"] == 2 * (54 - 50)
    assert done["cost"] == pytest.approx(2 * 4 / 3600 * V100)
    assert done["gpu_hours"] == pytest.approx(8 / 3600)


def test_job_crossing_the_range_start_is_clipped(recorded):
    records, now = recorded
    data = report(records, t("22:04:55"), t("22:06:00"), now).to_dict()
    cross = model_row(data, "cross")
    assert cross["gpu_seconds"] == 2 * (58 - 55)
    assert cross["cost"] == pytest.approx(2 * 3 / 3600 * A100)
    # job 43 ended (22:04:54) before the range starts
    assert all(m["model"] != "done" for m in data["models"])


def test_job_crossing_the_range_end_is_clipped(recorded):
    records, now = recorded
    data = report(records, t("22:04:00"), t("22:04:53"), now).to_dict()
    assert model_row(data, "done")["gpu_seconds"] == 2 * (53 - 50)
    assert model_row(data, "rq")["gpu_seconds"] == 1 * (53 - 52)


def test_requeued_job_counts_each_run_once(recorded):
    records, now = recorded
    runs_46 = [r for r in records if r.job_id == "46"]
    assert len(runs_46) == 2 and {r.state for r in runs_46} == {"REQUEUED", "COMPLETED"}
    data = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
    rq = model_row(data, "rq")
    assert rq["gpu_seconds"] == 1 * ((56 - 52) + (63 - 58))
    assert [j["state"] for j in data["jobs"] if j["job_id"] == "46"] == ["REQUEUED", "COMPLETED"]


def test_the_same_run_listed_twice_is_not_double_counted(recorded):
    records, now = recorded
    once = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
    twice = report(records + records, t("22:04:00"), t("22:06:00"), now).to_dict()
    assert twice["total"] == once["total"]
    assert twice["rows"] == once["rows"]


def test_hetjob_components_are_added_on_their_own_partitions(recorded):
    records, now = recorded
    data = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
    het = model_row(data, "het")
    assert het["gpu_seconds"] == 1 * 4 + 2 * 4
    assert het["cost"] == pytest.approx((1 * 4 * A100 + 2 * 4 * V100) / 3600)
    rows = {(r["model"], r["partition"]): r["gpu_seconds"] for r in data["rows"]}
    assert rows[("het", "a100")] == 4 and rows[("het", "v100")] == 8


def test_totals_by_partition_add_up(recorded):
    records, now = recorded
    data = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
    by_part = {p["partition"]: p["gpu_seconds"] for p in data["partitions"]}
    # v100: done 8, rq 9, het+1 8;  a100: cross 16, het+0 4, run 16
    assert by_part["v100"] == 8 + 9 + 8
    assert by_part["a100"] == 16 + 4 + 16  # cross, het+0, the running job up to now
    assert data["total"]["gpu_seconds"] == sum(by_part.values())


def test_recorded_running_job_counts_up_to_now(recorded):
    """sacct shows no Comment for a running job: the Slurm layer tags it from its job name."""
    records, now = recorded
    data = report(records, t("22:04:00"), t("22:06:00"), now).to_dict()
    assert model_row(data, "run")["gpu_seconds"] == 1 * (8 + 8)  # 22:04:52 → 22:05:08


# --------------------------------------------------------------------------- records built by hand


def record(job_id, model, partition, gpu_type, gpus, start, end, billing=None, state="COMPLETED",
           deployment_name="acctrec"):
    return AccountingRecord(
        job_id=job_id, het_job_id=None, het_offset=None,
        tag=JobTag(deployment_name, model, "r1", "tpl"),
        partition=partition, state=state, gpus=gpus, gpu_type=gpu_type, cpus=4 * gpus,
        mem_gb=32.0 * gpus, nodes=1, billing=billing, submit_time=start, start_time=start,
        end_time=end, elapsed_s=int((end or start) - start), observed_at=0.0,
    )


def test_running_job_counts_up_to_now_and_not_beyond():
    running = record("7", "run", "a100", "a100", 2, t("10:00:00"), None, state="RUNNING")
    data = report([running], t("09:00:00"), t("12:00:00"), t("10:30:00")).to_dict()
    assert data["total"]["gpu_seconds"] == 2 * 30 * 60
    assert data["jobs"][0]["running"] is True
    assert data["total"]["cost"] == pytest.approx(2 * 0.5 * A100)


def test_other_deployments_and_never_started_jobs_are_left_out():
    theirs = record("8", "done", "v100", "v100", 1, t("10:00:00"), t("11:00:00"),
                    deployment_name="other")
    pending = AccountingRecord(**{**record("9", "done", "v100", "v100", 1, 0, 0).__dict__,
                                  "start_time": None, "end_time": None, "state": "PENDING"})
    assert report([theirs, pending], t("09:00:00"), t("12:00:00"), t("12:00:00")).usage == []


def test_days_split_at_midnight():
    job = record("9", "done", "v100", "v100", 4,
                 datetime(2026, 11, 29, 23, 0, tzinfo=UTC).timestamp(),
                 datetime(2026, 11, 30, 1, 30, tzinfo=UTC).timestamp())
    since = datetime(2026, 11, 29, tzinfo=UTC).timestamp()
    until = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    data = report([job], since, until, until).to_dict()
    by_day = {r["day"]: r["gpu_seconds"] for r in data["rows"]}
    assert by_day == {"2026-11-29": 4 * 3600, "2026-11-30": 4 * 5400}
    assert day_bins(since, until, UTC) == [since, since + 86400, until]


def test_billing_price_is_billing_units_times_hours(recorded):
    records, now = recorded
    data = report(records, t("22:04:00"), t("22:06:00"), now, dep=deployment("billing")).to_dict()
    assert data["price_unit"] == "billing"
    assert model_row(data, "done")["cost"] == pytest.approx(3 * 4 / 3600)
    assert model_row(data, "cross")["cost"] == pytest.approx(6 * 8 / 3600)
    assert model_row(data, "rq")["cost"] == pytest.approx(1 * 9 / 3600)
    assert model_row(data, "het")["cost"] == pytest.approx((3 * 4 + 3 * 4) / 3600)


def test_unpriced_usage_is_reported_not_priced_as_zero():
    job = record("3", "done", "gpu", "a100-80g", 1, t("10:00:00"), t("11:00:00"))
    data = report([job], t("09:00:00"), t("12:00:00"), t("12:00:00")).to_dict()
    assert data["total"]["cost"] is None
    assert data["total"]["unpriced_gpu_seconds"] == 3600
    assert any("a100-80g" in w and "gpu" in w for w in data["warnings"])


def test_untyped_gpus_take_the_partitions_single_gpu_type():
    job = record("4", "done", "v100", None, 2, t("10:00:00"), t("11:00:00"))
    runs = runs_from_records([job], "acctrec", {"v100": ("v100",)})
    assert runs[0].gpu_type == "v100"
    assert runs_from_records([job], "acctrec", {})[0].gpu_type == "unknown"


def test_empty_or_inverted_range_is_refused():
    with pytest.raises(ValueError, match="empty range"):
        report([], t("12:00:00"), t("12:00:00"), t("12:00:00"))


def test_fractional_bounds_are_floored_to_slurms_seconds():
    job = record("5", "done", "v100", "v100", 1, t("10:00:00"), t("10:00:10"))
    data = report([job], t("10:00:02") + 0.7, t("11:00:00") + 0.2, t("11:00:00") + 0.9).to_dict()
    assert data["total"]["gpu_seconds"] == 8
    assert isinstance(data["total"]["gpu_seconds"], int)


# --------------------------------------------------------------------------- tokens


def test_cost_per_million_tokens_per_model_and_api_key():
    job = record("6", "done", "a100", "a100", 2, t("10:00:00"), t("11:00:00"))
    demand = [
        DemandInterval(t("10:00:00"), t("10:30:00"), "done", 10, 600_000, 150_000, 0, "key-a"),
        DemandInterval(t("10:30:00"), t("11:00:00"), "done", 10, 150_000, 100_000, 0, "key-b"),
        # ends outside the range: not counted
        DemandInterval(t("11:00:00"), t("11:30:00"), "done", 10, 999, 999, 0, "key-a"),
    ]
    data = report([job], t("10:00:00"), t("11:00:00"), t("12:00:00"), demand=demand).to_dict()
    cost = 2 * 1 * A100
    done = model_row(data, "done")
    assert (done["prompt_tokens"], done["generated_tokens"]) == (750_000, 250_000)
    assert done["cost_per_million_tokens"] == pytest.approx(cost / 1.0)
    assert done["cost_per_million_generated_tokens"] == pytest.approx(cost / 0.25)
    keys = {k["api_key"]: k for k in data["api_keys"]}
    assert keys["key-a"]["cost"] == pytest.approx(cost * 0.75)
    assert keys["key-b"]["cost"] == pytest.approx(cost * 0.25)
    assert keys["key-a"]["cost_per_million_tokens"] == pytest.approx(cost)


def test_chargeback_per_lab_sums_with_the_unattributed_part_to_the_booked_cost():
    """Each lab pays each model's booked cost in proportion to its keys' tokens; a model no key
    used (and tokens without a key) stay unattributed; together they are the total."""
    used = record("6", "done", "a100", "a100", 2, t("10:00:00"), t("11:00:00"))
    idle = record("7", "idle", "a100", "a100", 1, t("10:00:00"), t("11:00:00"))
    demand = [
        DemandInterval(t("10:00:00"), t("10:30:00"), "done", 10, 300_000, 100_000, 0, "alice"),
        DemandInterval(t("10:00:00"), t("10:30:00"), "done", 10, 100_000, 100_000, 0, "bob"),
        DemandInterval(t("10:30:00"), t("11:00:00"), "done", 10, 200_000, 100_000, 0, "carol"),
        DemandInterval(t("10:30:00"), t("11:00:00"), "done", 10, 50_000, 50_000, 0, ""),
    ]
    labs = {"alice": "astro", "bob": "astro"}   # carol's key has no lab
    data = report([used, idle], t("10:00:00"), t("11:00:00"), t("12:00:00"), demand=demand,
                  labs=labs).to_dict()
    done_cost, tokens = 2 * A100, 1_000_000
    by_lab = {lab["lab"]: lab for lab in data["labs"]}
    assert set(by_lab) == {"astro", None}
    assert by_lab["astro"]["api_keys"] == ["alice", "bob"]
    assert by_lab["astro"]["cost"] == pytest.approx(done_cost * 600_000 / tokens)
    assert by_lab[None]["cost"] == pytest.approx(done_cost * 300_000 / tokens)
    # the anonymous tokens' share of 'done' and all of 'idle' are nobody's
    assert data["unattributed_cost"] == pytest.approx(done_cost * 100_000 / tokens + 1 * A100)
    assert sum(lab["cost"] for lab in data["labs"]) + data["unattributed_cost"] == \
        pytest.approx(data["total"]["cost"])


def test_no_tokens_gives_no_cost_per_token():
    job = record("6", "done", "a100", "a100", 2, t("10:00:00"), t("11:00:00"))
    data = report([job], t("10:00:00"), t("11:00:00"), t("12:00:00")).to_dict()
    assert model_row(data, "done")["cost_per_million_tokens"] is None


# --------------------------------------------------------------------------- plans


def plan(pid, time, cost_per_hour):
    return PlanRecord(pid, time, cost_per_hour, 0.1, "optimal", [], {})


def replica(rid, cost_per_hour, submitted, started, ready, ended, replaces=None):
    return ReplicaRecord(
        id=rid, model="done", template_id="tpl", layout=None, partitions=("a100",),
        throughput=1.0, cost_per_hour=cost_per_hour, created_at=submitted, replaces=replaces,
        submitted_at=submitted, started_at=started, ready_at=ready, ended_at=ended,
    )


def test_predicted_cost_integrates_each_plan_until_the_next():
    plans = [plan(2, t("11:00:00"), 4.0), plan(1, t("09:00:00"), 2.0)]
    # [10:00, 11:00) at 2/h + [11:00, 11:30) at 4/h
    assert predicted_cost(plans, t("10:00:00"), t("11:30:00")) == pytest.approx(2.0 + 2.0)
    assert predicted_cost([], t("10:00:00"), t("11:30:00")) == 0.0


def test_difference_is_explained_by_pending_startup_and_overlap():
    """One replica A (5/h) is rotated to B (5/h): the plan at 10:00 says one replica, all along.
    B is submitted 10:00, pends 6 min, starts 10:06, READY 10:10; A drains and ends 10:12."""
    a = replica("A", 5.0, t("08:00:00"), t("08:00:00"), t("08:05:00"), t("10:12:00"))
    b = replica("B", 5.0, t("10:00:00"), t("10:06:00"), t("10:10:00"), None, replaces="A")
    plans = [plan(1, t("08:00:00"), 5.0), plan(2, t("10:00:00"), 5.0)]
    since, until, now = t("09:00:00"), t("11:00:00"), t("11:00:00")
    # booked as sacct would: A 09:00→10:12, B 10:06→11:00 at 5/h
    booked = 5.0 * ((72 + 54) / 60)
    result = compare(booked, plans, [a, b], since, until, now)
    assert result.predicted == pytest.approx(5.0 * 2)
    # B pending 6 min not booked, A booked meanwhile: nets to zero
    assert result.pending == pytest.approx(-5.0 * 6 / 60 + 5.0 * 6 / 60)
    assert result.startup == pytest.approx(5.0 * 4 / 60)   # A while B starts: 10:06 → 10:10
    assert result.overlap == pytest.approx(5.0 * 2 / 60)   # A after B READY: 10:10 → 10:12
    assert result.other == pytest.approx(0.0, abs=1e-9)
    assert result.difference == pytest.approx(booked - 10.0)


def test_plan_comparison_in_the_report_uses_booked_cost():
    job = record("6", "done", "a100", "a100", 2, t("10:00:00"), t("11:00:00"))
    data = report([job], t("10:00:00"), t("11:00:00"), t("11:00:00"),
                  plans=[plan(1, t("09:00:00"), 4.0)]).to_dict()
    comparison = data["plan_comparison"]
    assert comparison["booked_cost"] == pytest.approx(2 * A100)
    assert comparison["predicted_cost"] == pytest.approx(4.0)
    assert comparison["parts"]["other"] == pytest.approx(2 * A100 - 4.0)
    assert report([job], t("10:00:00"), t("11:00:00"), t("11:00:00")).to_dict()[
        "plan_comparison"] is None


# --------------------------------------------------------------------------- billing agreement


def test_recorded_billing_equals_the_partition_formula_for_the_job_shape(recorded):
    """Slurm's billing TRES (what accounting books) equals the partition's TRESBillingWeights sum
    for the job's shape, truncated to an integer as Slurm stores it (what plans must price)."""
    records, _ = recorded
    partitions = {p.name: p for p in parse_partitions_text(
        (DATA / "scontrol_show_partition.txt").read_text())}
    from coral_hpc.slurm.billing import billing_sum

    checked = 0
    for rec in records:
        weights = partitions[rec.partition].billing_weights
        expected = math.floor(billing_sum(weights, rec.gpus, rec.gpu_type, rec.cpus, rec.mem_gb))
        assert rec.billing == expected, rec.job_id
        checked += 1
    assert checked >= 5
    # and a fractional sum is truncated, not rounded: job 46 is 0.05×4 + 0.01×32 + 1×1 = 1.52
    rq = next(r for r in records if r.job_id == "46")
    assert billing_sum(partitions["v100"].billing_weights, 1, "v100", 4, 32.0) == pytest.approx(1.52)
    assert rq.billing == 1


def test_pricing_reads_models_yaml():
    pricing = Pricing.from_deployment(deployment())
    assert pricing.unit == "gpu_hour"
    assert pricing.gpu_hour_prices == {("v100", "v100"): V100, ("a100", "a100"): A100}
    assert Pricing.from_deployment(deployment("billing")).unit == "billing"


def test_usage_rejects_bad_bins():
    with pytest.raises(ValueError, match="edges"):
        usage([], 0, 10, 10, [1, 10])
