"""`coral-hpc status` says which templates are kept out of plans, why and when they are tried
again (issue 27: a layout that crashed at start for want of KV cache was resubmitted in a loop
with no word of why)."""

from __future__ import annotations

import time

from coral_hpc.cli.timefmt import local_time
from coral_hpc.store import Exclusion, open_store
from coral_hpc.types import ExclusionKind, ShapeExclusion, TemplateExclusion
from tests.unit.test_status_without_daemon import _status, setup  # noqa: F401 (a fixture)

KV = ("ValueError: To serve at least one request with the model's max seq len (600000), (1.14 "
      "GiB KV cache is needed, which is larger than the available KV cache memory (1.0 GiB).")


def test_status_shows_each_exclusion_its_reason_and_when_it_is_tried_again(setup):  # noqa: F811
    path, deployment, _slurm, _calls = setup
    now = time.time()
    reason = (f"template tiny.tp1.v100-4 failed to start (replica r1, job 77 FAILED): {KV}; "
              "kept out of plans for 120s")
    store = open_store(deployment.db_path)
    try:
        store.set_exclusion(Exclusion(TemplateExclusion("tiny.tp1.v100-4"),
                                      ExclusionKind.START_FAILED, now - 10, now + 110, reason))
        store.set_exclusion(Exclusion(ShapeExclusion("big.tp4.a100-32", ("a100",)),
                                      ExclusionKind.PENDING_TIMEOUT, now - 5, now + 595,
                                      "pending 610 s"))
        store.set_exclusion(Exclusion(TemplateExclusion("old"), ExclusionKind.START_FAILED,
                                      now - 100, now - 40, "over"))
    finally:
        store.close()
    data = _status(path, "--json")
    rows = {e["template"]: e for e in data["excluded"]}
    assert set(rows) == {"tiny.tp1.v100-4", "big.tp4.a100-32"}  # the expired one is not
    tiny = rows["tiny.tp1.v100-4"]
    assert (tiny["kind"], tiny["partitions"], tiny["reason"]) == ("start_failed", None, reason)
    assert abs(tiny["until"] - (now + 110)) < 1e-6
    assert rows["big.tp4.a100-32"]["partitions"] == ["a100"]
    human = _status(path)
    assert "kept out of plans" in human
    assert "1.14 GiB KV cache is needed" in human
    assert local_time(now + 110, now) in human and "(in 1 min)" in human
