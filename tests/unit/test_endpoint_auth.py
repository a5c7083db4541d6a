"""Issue 28 item 2: an endpoint file decides where prompts and the replica key go, so the daemon
routes to one only when the job signed it with the replica key and it names one of the job's
nodes. Before this, any valid JSON at ``endpoints/<id>.json`` was trusted as is: another user who
could write the state folder received the traffic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coral_hpc.gateway.table import read_routing_table
from coral_hpc.launch.endpoint import (
    Endpoint,
    EndpointRefused,
    endpoint_mac,
    read_endpoint,
    write_endpoint,
)
from tests.unit.test_reconcile_loop import Loop, ScriptedPlanner, events, slot

KEY = "replica-key-0123456789"


def _endpoint(job_id: str = "7", node: str = "a100-01", url: str = "http://a100-01:8000"):
    return Endpoint("r", job_id, url, node, 8000, "m", 1, 0.0, 0.0, node)


def test_a_signed_endpoint_reads_back(tmp_path: Path):
    path = tmp_path / "r.json"
    write_endpoint(path, _endpoint(), KEY)
    assert read_endpoint(path, KEY) == _endpoint()
    assert oct(path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("forge", ["unsigned", "wrong-key", "edited-after-signing"])
def test_a_forged_endpoint_is_refused(tmp_path: Path, forge: str):
    path = tmp_path / "r.json"
    if forge == "unsigned":
        write_endpoint(path, _endpoint())
    elif forge == "wrong-key":
        write_endpoint(path, _endpoint(), "a-guessed-key")
    else:
        write_endpoint(path, _endpoint(), KEY)
        data = json.loads(path.read_text())
        data["url"] = "http://attacker:9999"
        path.write_text(json.dumps(data))
    with pytest.raises(EndpointRefused):
        read_endpoint(path, KEY)


def test_the_mac_covers_every_field():
    data = json.loads(json.dumps(_endpoint().__dict__))
    assert endpoint_mac(data, KEY) != endpoint_mac({**data, "port": 1}, KEY)


@pytest.fixture
def keyed_loop(tmp_path: Path):
    key_file = tmp_path / "replica.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    loop = Loop(tmp_path, ScriptedPlanner(slot()))
    loop.daemon.observer.api_key_file = key_file
    yield loop
    loop.close()


def _publish(loop: Loop, key: str | None, node: str = "a100-01",
             reported: str = "a100-01") -> tuple[str, str]:
    loop.cycle()
    (record,) = loop.live()
    loop.slurm.start(record.job_id, [node])
    url = f"http://{reported}:8000"
    now = loop.clock.now
    write_endpoint(loop.deployment.state_path / "endpoints" / f"{record.id}.json",
                   Endpoint(record.id, record.job_id, url, reported, 8000, record.model, 1,
                            now, now, reported), key)
    loop.healthy.add(url)
    loop.cycle(2)
    loop.cycle(2)
    return record.id, url


def _routed(loop: Loop) -> list[str]:
    routes = read_routing_table(loop.tmp / "routes.json").models
    return [r.url for r in routes.get("qwen3-8b", [])]


def test_a_signed_endpoint_on_the_jobs_node_is_routed(keyed_loop: Loop):
    replica_id, url = _publish(keyed_loop, KEY)
    assert keyed_loop.store.replica(replica_id).ready_at is not None
    assert _routed(keyed_loop) == [url]


@pytest.mark.parametrize("key", [None, "a-guessed-key"], ids=["no-mac", "wrong-mac"])
def test_a_forged_endpoint_file_is_never_routed_to(keyed_loop: Loop, key: str | None):
    replica_id, _ = _publish(keyed_loop, key)
    assert keyed_loop.store.replica(replica_id).ready_at is None
    assert _routed(keyed_loop) == []
    (refused,) = events(keyed_loop, "endpoint-refused")  # logged once, not every cycle
    assert "signature" in refused or "not signed" in refused


def test_an_endpoint_naming_another_node_is_refused(keyed_loop: Loop):
    replica_id, _ = _publish(keyed_loop, KEY, node="a100-01", reported="a100-02")
    assert keyed_loop.store.replica(replica_id).ready_at is None
    assert _routed(keyed_loop) == []
    assert any("a100-02" in e for e in events(keyed_loop, "endpoint-refused"))
