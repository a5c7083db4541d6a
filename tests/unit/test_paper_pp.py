"""bench/paper_pp.py on the profiles `coral-hpc profile` recorded on the real engine: each
pipeline layout is priced with the hand-off measured on that layout, not on another."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from bench import paper_pp

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "bench/results/paper_pp_profiles"


def _recorded() -> list[dict]:
    """PP 1 and 2 at both mixes (the prompt-heavy PP-1 decode steps are token bursts under
    1 ms, so the hand-off is taken against the decode-heavy PP-1 steps)."""
    return paper_pp.load_profiles([RECORDED / "prompt-heavy", RECORDED / "decode-heavy"])


def _pp3_from(pp2: dict, extra_step_s: float) -> dict:
    """A 2,1,1 pipeline document built from the recorded PP 2 one, its decode steps each
    ``extra_step_s`` slower (a hand-off unlike PP 2's)."""
    doc = copy.deepcopy(pp2)
    doc.update(pp=3, layer_partition="2,1,1", stage_gpus=["v100", "v100", "a100"],
               _path="pp3")
    for point in doc["step_latency"]:
        if point["prefill_tokens"] == 0:
            point["seconds"] += extra_step_s
    return doc


def _rows(profiles: list[dict]) -> dict[tuple, dict]:
    return {(r["pp"], tuple(r["mix"])): r for r in paper_pp.compare(profiles)}


def test_each_pipeline_layout_is_priced_with_its_own_measured_hand_off():
    recorded = _recorded()
    pp2 = next(d for d in recorded if d["pp"] == 2 and d["throughput"][0]["input_tokens"] == 438)
    alone = _rows(recorded)
    pp3 = _pp3_from(pp2, extra_step_s=0.2)
    both = _rows(recorded + [pp3])
    # a PP-3 profile measured beside it does not move PP 2's prediction
    assert both[(2, (438, 6))]["host_ring_rps"] == alone[(2, (438, 6))]["host_ring_rps"]
    # PP 3 is priced with the hand-off of its own decode steps: 0.1 s more per boundary
    hand = {h["profile"]: h["measured_ms"] for h in paper_pp.handoffs(recorded + [pp3])}
    assert hand["pp3"] == pytest.approx(hand[pp2["_path"]] / 2 + 100.0, abs=0.02)
    pp2_median = (hand[pp2["_path"]] + [v for k, v in hand.items() if k not in
                                        ("pp3", pp2["_path"])][0]) / 2
    fit = paper_pp.fit_steps([p for d in recorded if d["pp"] == 1 for p in d["step_latency"]])
    point = pp3["throughput"][0]
    expected = paper_pp.predict(pp3, fit, point, True, handoff_s=hand["pp3"] / 1e3)
    assert both[(3, (438, 6))]["host_ring_rps"] == pytest.approx(expected, abs=1e-4)
    assert expected != pytest.approx(
        paper_pp.predict(pp3, fit, point, True, handoff_s=pp2_median / 1e3), abs=1e-3)


def test_a_single_stage_hands_nothing_off():
    rows = _rows(_recorded())
    one = rows[(1, (438, 6))]
    assert (one["host_ring_rps"], one["host_own_rps"]) == (one["ring_rps"], one["own_rps"])
