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
    """tiny-llama's PP 1 and 2 at both mixes (the recorded PP 3 and the other model are left
    out: the test adds a PP 3 of its own, and its rows are keyed by layout and mix)."""
    profiles = paper_pp.load_profiles([RECORDED / "prompt-heavy", RECORDED / "decode-heavy"])
    return [d for d in profiles if d["model"] == "tiny-llama" and d["pp"] <= 2]


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
    # PP 3 is priced with the hand-off of its own decode steps: 0.2 s more a token over its
    # 3 stage steps; PP 2's rise over PP 1 spread over its 2
    hand = {h["profile"]: h["measured_ms"] for h in paper_pp.handoffs(recorded + [pp3])}
    assert hand["pp3"] == pytest.approx(hand[pp2["_path"]] * 2 / 3 + 200.0 / 3, abs=0.02)
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


def test_the_measured_hand_off_reproduces_the_pipeline_tpot_it_was_taken_from():
    """A PP-2 profile whose decode steps are the PP-1 ones plus 0.1 s: the model, adding the
    hand-off to each of a token's two stage steps, predicts PP 1's token time plus 0.1 s."""
    import math

    from coral_solver import catalog
    from coral_solver.perf_model import step_time

    recorded = _recorded()
    pp1 = next(d for d in recorded if d["pp"] == 1 and d["throughput"][0]["input_tokens"] == 32)
    pp2 = copy.deepcopy(pp1)
    pp2.update(pp=2, layer_partition="2,2", _path="pp2")
    for point in pp2["step_latency"]:
        if point["prefill_tokens"] == 0:
            point["seconds"] += 0.1
    hand_s = next(h for h in paper_pp.handoffs([pp1, pp2]))["measured_ms"] / 1e3
    fit = paper_pp.fit_steps(pp1["step_latency"])
    hidden = catalog.model_arch(pp1["arch"]).hidden
    whole, half = (paper_pp.stage_coeffs(fit, n, 4, hidden) for n in (4, 2))
    for b in (1, 4, 8):
        one = step_time(whole, b, 0.0, b * 44.0, 0.0, fit[0], 1, 0.0, math.inf)
        two = 2 * step_time(half, b, 0.0, b * 44.0, 0.0, fit[0], 2, hand_s, math.inf)
        assert two == pytest.approx(one + 0.1, abs=1e-3)


def test_the_penalty_direction_counts_the_layouts_on_each_side_of_one():
    """The sign the medians hide: measured above 1 in one layout of two, the ring in none, the
    own-micro-batch charge in one (a missing prediction counts as not above)."""
    penalties = [{"measured": 1.2, "host_ring": 0.9, "host_own": 1.5},
                 {"measured": 0.8, "host_ring": 0.7, "host_own": None}]
    line = paper_pp.penalty_direction(penalties, "host_")[0]
    assert "in 1 of 2 layouts measured (1.20, 0.80)" in line
    assert "the ring predicts above 1 in 0 of 2, own micro-batch in 1 of 2" in line
    assert paper_pp.penalty_direction([], "host_") == []
