"""Held-out check of the shipped calibration against measured Helix per-layer times.

Reads one of Helix's CSVs from ../shared/data at test time (never copied into the repository);
skips when that data is not on this machine.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from coral_solver.catalog import ModelArch, gpu_spec
from coral_solver.perf_model import build_coeffs, compute_time
from coral_solver.perf_profiles import load_calibration

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HELIX_T4 = DATA / "profiles-helix" / "llama2_70b" / "t4"

# Llama-2-70B, one layer (Helix's profiles time ONE transformer layer; no lm_head)
LLAMA2_70B = ModelArch(
    name="llama-2-70b", layers=80, hidden=8192, q_heads=64, kv_heads=8, head_dim=128, ffn=28672,
    experts=0, active_experts=0, params_b=68.45, active_params_b=68.45, vocab=0,
    max_context=4096, weight_bytes=2 * 855.6e6 * 80, kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
    quantization="bf16")


def _read(path: Path) -> list[tuple[int, float]]:
    with path.open() as fh:
        return [(int(float(t)), float(ms)) for t, ms in csv.reader(fh) if float(t) > 0]


@pytest.mark.skipif(not HELIX_T4.is_dir(), reason=f"measured data not present at {HELIX_T4}")
def test_t4_predicted_from_l4_fit_within_goal():
    """Leave T4 out: predict its per-layer times from the L4's fitted factors (the other member of
    its class) and T4 datasheet specs; median |error| must be within the 15 % goal."""
    cal = load_calibration()
    l4_factors = cal.gpus["l4"]  # fitted on L4 measurements only
    t4 = gpu_spec("t4")
    coeffs = build_coeffs(LLAMA2_70B, t4, 1, 1, l4_factors, 0.0, 1.0)
    errors = []
    for tokens, ms in _read(HELIX_T4 / "prompt_bs2time.csv"):
        if ms == round(ms) and ms < 5:  # whole-ms values under 5 ms: rounding, not signal
            continue
        predicted = compute_time(coeffs, 0, tokens, 0, min(tokens, 750) / 2)
        errors.append(abs(predicted * 1e3 / ms - 1))
    for batch, ms in _read(HELIX_T4 / "decode_bs2time.csv"):
        if ms == round(ms) and ms < 5:
            continue
        predicted = compute_time(coeffs, batch, 0, batch * 870, 0)
        errors.append(abs(predicted * 1e3 / ms - 1))
    assert len(errors) > 50
    assert statistics.median(errors) <= 0.15, statistics.median(errors)
