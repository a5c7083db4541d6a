"""What walltime rotation adds to a replica's cost (coral_hpc.simulate.rotation)."""

from __future__ import annotations

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.simulate.rotation import rotation_overhead
from coral_hpc.types import SIGNAL_LEAD_S, SIGNAL_RESOLUTION_S
from tests.conftest import REPO


def _example(tmp_path, time_limit: str):
    """examples/models.yaml with another cluster time limit."""
    text = (REPO / "examples" / "models.yaml").read_text()
    assert text.count('time_limit: "02:00:00"') == 1
    path = tmp_path / "models.yaml"
    path.write_text(text.replace('time_limit: "02:00:00"', f'time_limit: "{time_limit}"'))
    return load_deployment(path)


def test_rotation_overhead_is_a_successors_overlap_per_usable_life(tmp_path):
    deployment = _example(tmp_path, "04:00:00")
    policy = deployment.policy
    # 4 h limit less Slurm's signal lead (and the minute it may come early) and the walltime
    # lead (300 s), plus the successor's start-up (10 s); the overlap is that start-up plus
    # the drain grace: 2 polls of the example's 2 s, but at least 5 s
    assert (policy.walltime_lead_s, policy.startup_time_s, policy.poll_interval_s) == (300, 10, 2)
    life = 4 * 3600 - SIGNAL_LEAD_S - SIGNAL_RESOLUTION_S - 300 + 10
    assert rotation_overhead(deployment) == pytest.approx((10 + 5) / life)


def test_a_time_limit_with_no_usable_life_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="time_limit"):
        rotation_overhead(_example(tmp_path, "00:05:00"))
