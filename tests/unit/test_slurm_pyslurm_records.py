"""The pyslurm backend's pure conversion, on pyslurm's real answers: what pyslurm 22.5.3's dict
API said about the local cluster (``22.05/pyslurm_*.json``) converts to exactly the records the
scontrol parsers make of scontrol's answer at the same moment (``*_pyslurm.txt``), both recorded
by ``tests/data/slurm/record-pyslurm-22.05.py``. Needs no pyslurm: runs everywhere."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from coral_hpc.slurm.build import node_state
from coral_hpc.slurm.errors import SlurmParseError
from coral_hpc.slurm.parse_nodes import parse_nodes_text, parse_partitions_text
from coral_hpc.slurm.pyslurm_backend import (
    raw_nodes_from_records,
    raw_partitions_from_records,
    state_words,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm" / "22.05"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.fixture
def recording_tz(monkeypatch):
    """scontrol printed reason times in the recording machine's local time: read them in it."""
    monkeypatch.setenv("TZ", _load("pyslurm_nodes.json")["meta"]["TZ"])
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_nodes_convert_to_what_scontrol_said_at_the_same_moment(recording_tz):
    ours = raw_nodes_from_records(_load("pyslurm_nodes.json")["nodes"])
    theirs = parse_nodes_text((DATA / "scontrol_show_node_pyslurm.txt").read_text())
    assert ours == theirs
    # the recording holds the cases that differ between pyslurm's APIs and scontrol
    by_name = {n.name: n for n in ours}
    drained = [n for n in ours if "DRAIN" in n.state_words]
    assert drained and all(n.reason and n.reason.endswith("]") for n in drained)
    assert any(n.state_words[0] == "MIXED" and n.gpus_alloc > 0 for n in ours)
    assert by_name["a100-80g-01"].gpu_type == "a100-80g" and by_name["a100-80g-01"].gpus_total == 8


def test_partitions_convert_to_what_scontrol_said_at_the_same_moment():
    ours = raw_partitions_from_records(_load("pyslurm_partitions.json")["partitions"])
    theirs = parse_partitions_text((DATA / "scontrol_show_partition_pyslurm.txt").read_text())
    assert ours == theirs
    by_name = {p.name: p for p in ours}
    # pyslurm's dict API reports an INACTIVE partition's state as ""
    assert by_name["a100-80g"].state == "inactive"
    assert by_name["gpu"].default and not by_name["v100"].default
    assert by_name["gpu"].billing_weights["gres/gpu:a100-80g"] == 4.0


@pytest.mark.parametrize(
    "pyslurm_state, words, coral_state",
    [
        ("MIXED+DRAIN", ("MIXED", "DRAIN"), "draining"),
        ("IDLE+DRAIN", ("IDLE", "DRAIN"), "drained"),
        ("DOWN*", ("DOWN", "NOT_RESPONDING"), "down"),
        ("IDLE*", ("IDLE", "NOT_RESPONDING"), "down"),
        ("IDLE~", ("IDLE", "POWERED_DOWN"), "powered_down"),
        ("IDLE+POWER", ("IDLE", "POWERED_DOWN"), "powered_down"),
        ("", ("UNKNOWN",), "unknown"),
    ],
)
def test_state_marks_become_scontrol_flag_words(pyslurm_state, words, coral_state):
    assert state_words(pyslurm_state) == words
    assert node_state(state_words(pyslurm_state)) == coral_state


def test_bad_records_are_parse_errors_naming_what():
    good = _load("pyslurm_partitions.json")["partitions"][0]
    with pytest.raises(SlurmParseError, match="unknown state 'SIDEWAYS'"):
        raw_partitions_from_records([{**good, "state": "SIDEWAYS"}])
    with pytest.raises(SlurmParseError, match=f"partition {good['name']}"):
        raw_partitions_from_records([{**good, "billing_weights_str": "CPU=abc"}])
    with pytest.raises(SlurmParseError, match="without a name"):
        raw_nodes_from_records([{"state": "IDLE"}])
