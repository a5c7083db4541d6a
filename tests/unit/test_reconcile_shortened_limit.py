"""An administrator shortens a running replica's time limit (``scontrol update JobId=N
TimeLimit=M``, what sites do before maintenance): the daemon follows Slurm's new end, not the
limit the job was submitted with, and starts the successor a whole walltime lead before Slurm's
warning at the *new* end.

The job is the recorded one (``tests/data/slurm/22.05/squeue_own.txt``: job 50,
``coral.dep1.llama.r1``, RUNNING from 22:05:03 with a 30-minute limit), read through the real
squeue parser and the observe step, then decided on. After the update squeue prints the same row
with ``TimeLimit`` the new limit and ``EndTime`` start + new limit (``scontrol(1)``: EndTime is
"the time the job is expected to terminate based on the job's time limit"); the test writes that
row from the recorded one, changing only those fields and ``TimeLeft``.

Were the limit the one seen at submission (the observe step writing it once), the successor
would fall due 300 s before the *old* end (22:27:33), ten minutes after Slurm's warning at the
new end (22:17:33): the replica would stop serving with no successor started.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.launch.endpoint import Endpoint, write_endpoint
from coral_hpc.plan.desired import DesiredPlan, Slot
from coral_hpc.reconcile import Submit, decide
from coral_hpc.reconcile.observe import Observer
from coral_hpc.reconcile.settings import ReconcileSettings
from coral_hpc.reconcile.status import successor_due, usable_until
from coral_hpc.slurm.parse_jobs import SQUEUE_FIELDS, parse_squeue
from coral_hpc.slurm.timefmt import parse_timestamp
from coral_hpc.store import ReplicaRecord, open_store
from coral_hpc.types import ReplicaLayout, StageLayout
from tests.conftest import REPO
from tests.fakes.slurm import FakeSlurm, recorded_snapshot
from tests.support.virtual_time import VirtualClock

SQUEUE = REPO / "tests" / "data" / "slurm" / "22.05" / "squeue_own.txt"
JOB = "50"
START = "2026-11-29T22:05:03"  # the recorded row's StartTime
#: the deployment's walltime lead; the learnt start-up is shorter, so this is the lead
SETTINGS = ReconcileSettings(walltime_lead_s=300.0, startup_s=120.0, poll_interval_s=2.0)
LAYOUT = ReplicaLayout(2, (StageLayout("a100", "a100", 36),), "auto")
SLOT = Slot("llama", "a100x2", 1, 2.0, 4.0, LAYOUT)


def recorded_row() -> str:
    (row,) = [line for line in SQUEUE.read_text().splitlines() if line.startswith(f"{JOB}|")]
    return row


def shortened(row: str, limit_min: int) -> str:
    """The row squeue prints once ``scontrol update JobId=50 TimeLimit=<limit_min>`` is done:
    EndTime start + the new limit, TimeLeft counted from the recording's moment."""
    items = row.split("|")
    at = {name: i for i, name in enumerate(SQUEUE_FIELDS)}
    assert items[at["TimeLimit"]] == "30:00" and items[at["StartTime"]] == START
    minutes, seconds = items[at["TimeLeft"]].split(":")
    recorded_at = at_time(items[at["EndTime"]]) - 60 * int(minutes) - int(seconds)
    end = at_time(START) + 60 * limit_min
    left = int(end - recorded_at)
    items[at["EndTime"]] = datetime.fromtimestamp(end).isoformat(timespec="seconds")
    items[at["TimeLeft"]] = f"{left // 60}:{left % 60:02d}"
    items[at["TimeLimit"]] = f"{limit_min}:00"
    return "|".join(items)


def at_time(text: str) -> float:
    """Epoch seconds of a Slurm timestamp (local time, as the recording and the parser read it)."""
    seconds = parse_timestamp(text)
    assert seconds is not None
    return seconds


class World:
    """The recorded job in a fake queue, its replica row READY in a real store, an observer."""

    def __init__(self, tmp_path: Path):
        self.clock = VirtualClock(at_time("2026-11-29T22:08:00"))
        self.slurm = FakeSlurm(recorded_snapshot(), self.clock)
        self.deployment = load_deployment(REPO / "examples" / "models.yaml").model_copy(
            update={"deployment": "dep1", "state_dir": tmp_path / "shared"})
        self.store = open_store(tmp_path / "daemon.db")
        self.show(recorded_row())
        started = at_time(START)
        url = "http://a100-01:8000"
        self.store.add_replica(ReplicaRecord(
            id="r1", model="llama", template_id=SLOT.template_id, layout=LAYOUT,
            partitions=("a100",), throughput=2.0, cost_per_hour=4.0, created_at=started - 1,
            job_id=JOB, submitted_at=started - 1, started_at=started, ready_at=started + 60,
            endpoint=url, health_ok_at=started + 60))
        write_endpoint(self.deployment.state_path / "endpoints" / "r1.json",
                       Endpoint("r1", JOB, url, "a100-01", 8000, "llama", 1, started,
                                started + 60, "a100-01"))
        self.observer = Observer(self.deployment, self.store, self.slurm, SETTINGS, self.clock,
                                 probe=lambda _url: True)

    def show(self, row: str) -> None:
        """What squeue prints for the job from now on."""
        (job,) = parse_squeue(row + "\n")
        self.slurm.add_job(job)

    def cycle_at(self, when: float) -> list[Submit]:
        """Observe and decide at ``when``: the successors submitted."""
        self.clock.now = when
        observed = self.observer.observe()
        decision = decide(DesiredPlan(0.0, (SLOT,)), observed.facts, when, SETTINGS)
        return [a for a in decision.actions if isinstance(a, Submit)]

    def close(self) -> None:
        self.observer.close()
        self.store.close()


@pytest.fixture
def world(tmp_path):
    built = World(tmp_path)
    yield built
    built.close()


def test_a_shortened_time_limit_brings_the_successor_a_whole_lead_before_the_new_end(world):
    assert world.cycle_at(world.clock.now) == []  # 30 min limit: nothing due yet
    world.show(shortened(recorded_row(), 15))  # the admin: TimeLimit=15, EndTime 22:20:03
    # Slurm warns (USR2) up to walltime_signal_s before the new end; the successor is due a
    # whole lead before that: 22:12:33
    warned = at_time("2026-11-29T22:20:03") - SETTINGS.walltime_signal_s
    due = warned - SETTINGS.walltime_lead_s
    assert world.cycle_at(due - 1) == []
    (successor,) = world.cycle_at(due)
    assert successor.replaces == "r1" and successor.slot == SLOT
    record = world.store.replica("r1")
    assert record is not None and record.time_limit_s == 15 * 60
    assert (usable_until(record, SETTINGS), successor_due(record, SETTINGS)) == (warned, due)


def test_the_unchanged_limit_brings_no_successor_at_that_moment(world):
    """The control: without the update the same moment is 15 minutes from the successor."""
    world.cycle_at(world.clock.now)
    record = world.store.replica("r1")
    assert record is not None and record.time_limit_s == 30 * 60
    due = successor_due(record, SETTINGS)
    assert due == at_time("2026-11-29T22:35:03") - SETTINGS.walltime_signal_s - 300
    assert world.cycle_at(at_time("2026-11-29T22:12:33")) == []
