"""The daemon's own metrics ask for a key on every address, loopback included (issue 28, item
1): a client key of the deployment's gateway or the daemon's internal key; open only when the
file opts out (``gateway.open_on_loopback``), and then never beyond loopback. Real HTTP against
the server ``serve`` starts."""

from __future__ import annotations

import httpx
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon import ensure_key_file, service
from coral_hpc.daemon.metrics import DaemonMetrics
from coral_hpc.errors import PermanentError
from coral_hpc.gateway.auth import add_key, remove_key
from harness.gateway import write_models_yaml


def _get(address: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"http://{address}/metrics", headers=headers, timeout=10)


@pytest.fixture
def keyed(tmp_path):
    keys = tmp_path / "api-keys"
    alice = add_key(keys, "alice")
    add_key(keys, "bob")
    deployment = load_deployment(write_models_yaml(tmp_path, ["m"], api_keys_file=keys))
    internal = ensure_key_file(tmp_path / "state" / "internal.key")
    metrics = DaemonMetrics()
    metrics.plan_cost.set(12.5)
    server, address = service.start_metrics("127.0.0.1:0", metrics, deployment, internal)
    yield {"address": address, "alice": alice, "keys": keys,
           "internal": internal.read_text().strip()}
    server.shutdown()


def test_loopback_without_a_key_gets_401_with_a_key_the_metrics(keyed):
    address = keyed["address"]
    refused = _get(address)
    assert refused.status_code == 401
    assert "coral_plan_cost_per_hour" not in refused.text
    assert _get(address, "coral-not-a-key").status_code == 401
    answer = _get(address, keyed["alice"])
    assert answer.status_code == 200 and "coral_plan_cost_per_hour 12.5" in answer.text
    # the daemon's internal key opens them too (it is in no keys file)
    assert _get(address, keyed["internal"]).status_code == 200


def test_a_removed_key_is_refused_at_once(keyed):
    assert _get(keyed["address"], keyed["alice"]).status_code == 200
    remove_key(keyed["keys"], "alice")
    assert _get(keyed["address"], keyed["alice"]).status_code == 401


def test_open_on_loopback_serves_without_a_key_but_not_beyond_loopback(tmp_path):
    deployment = load_deployment(write_models_yaml(tmp_path, ["m"]))
    assert deployment.gateway.open_on_loopback
    server, address = service.start_metrics("127.0.0.1:0", DaemonMetrics(), deployment)
    try:
        assert _get(address).status_code == 200
    finally:
        server.shutdown()
    with pytest.raises(PermanentError, match="open_on_loopback opens loopback only"):
        service.start_metrics("0.0.0.0:0", DaemonMetrics(), deployment)


def test_keys_beyond_loopback_without_tls_are_refused(tmp_path):
    keys = tmp_path / "api-keys"
    add_key(keys, "alice")
    deployment = load_deployment(write_models_yaml(tmp_path, ["m"], api_keys_file=keys))
    with pytest.raises(PermanentError, match="in clear: set gateway.tls_cert"):
        service.start_metrics("0.0.0.0:0", DaemonMetrics(), deployment)


def test_an_ipv6_loopback_listen_is_served_and_reported_in_brackets(tmp_path):
    deployment = load_deployment(write_models_yaml(tmp_path, ["m"]))
    server, address = service.start_metrics("[::1]:0", DaemonMetrics(), deployment)
    try:
        assert address == f"[::1]:{server.server_port}"
        assert _get(address).status_code == 200
    finally:
        server.shutdown()
