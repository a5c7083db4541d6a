"""A lease renewal never leaves the lease file without a record: the daemon's act step checks
``Lease.ours()`` from another thread while the main loop renews, and on the loaded 2-core
machine (real engines starting) a renewal that truncated the file first made that check read
nothing and the daemon skip acting ("lease no longer ours: not acting")."""

from __future__ import annotations

import json

from coral_hpc.daemon import lease as lease_module
from coral_hpc.daemon.lease import Lease, read_lease


def test_the_file_holds_a_record_while_a_renewal_is_being_written(tmp_path, monkeypatch):
    lease = Lease(tmp_path, "dep")
    lease.acquire(sleep=lambda _s: None)
    seen: list[dict | None] = []
    real_dumps = json.dumps

    def dumps_and_look(record, *args, **kwargs):
        # the renewal is being written right now: what does a reader see?
        seen.append(read_lease(lease.path))
        return real_dumps(record, *args, **kwargs)

    monkeypatch.setattr(lease_module.json, "dumps", dumps_and_look)
    assert lease.renew(force=True)
    monkeypatch.setattr(lease_module.json, "dumps", real_dumps)
    assert seen and all(r is not None and r["token"] == lease.token for r in seen), seen
    assert lease.ours()
