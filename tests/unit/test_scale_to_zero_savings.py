"""``cost``'s GPU-hours saved by scale to zero: the hours a model held no replica, times its
smallest replica's GPUs."""

from __future__ import annotations

from coral_hpc.accounting.idle_savings import scale_to_zero_savings
from coral_hpc.config import parse_deployment
from tests.unit.reconcile_facts import layout, rec
from tests.unit.test_config import BASE

H = 3600.0


def _deployment():
    text = BASE.replace("    slo: {ttft_s: 2, tpot_s: 0.05}\n",
                        "    slo: {ttft_s: 2, tpot_s: 0.05}\n    idle_after: 20m\n")
    return parse_deployment(text, "z.yaml")


def test_cold_hours_times_the_smallest_replica():
    deployment = _deployment()
    replicas = [
        # 1 h to 3 h on one GPU, 2 h to 4 h on two (overlapping: one held span 1 h .. 4 h),
        # then 10 h to now (12 h) on one GPU, still live
        rec("a", model="small", created_at=1 * H, ended_at=3 * H),
        rec("b", model="small", created_at=2 * H, ended_at=4 * H, layout=layout(tp=2)),
        rec("c", model="small", created_at=10 * H),
        rec("x", model="other", created_at=0.0),  # not this model
    ]
    (row,) = scale_to_zero_savings(deployment, replicas, 0.0, 12 * H, 12 * H)
    # held 1..4 and 10..12: 5 of 12 hours; cold 7 hours on the smallest (1 GPU)
    assert row == {"model": "small", "cold_hours": 7.0, "smallest_replica_gpus": 1,
                   "gpu_hours_saved": 7.0}


def test_a_model_never_woken_reports_cold_hours_without_a_size():
    (row,) = scale_to_zero_savings(_deployment(), [], 0.0, 2 * H, 2 * H)
    assert row["cold_hours"] == 2.0 and row["gpu_hours_saved"] is None


def test_models_not_scaled_to_zero_are_not_listed():
    deployment = parse_deployment(BASE, "z.yaml")
    assert scale_to_zero_savings(deployment, [], 0.0, H, H) == []
