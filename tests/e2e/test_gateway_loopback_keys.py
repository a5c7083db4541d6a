"""A key on every gateway route, on every address, loopback included (issue 28, item 1).

A login node's loopback is shared by everyone logged in: with a keys file, the OpenAI routes,
``/metrics`` and ``/internal/*`` answer 401 to a request from 127.0.0.1 without a key and 200
with one; the daemon reads ``/internal/demand`` with its internal key, which opens nothing
else. Without a keys file the gateway (and ``serve``) refuse to start unless the file says
``gateway.open_on_loopback: true``, which starts with a warning. Real processes, real HTTP.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - loaded here: the child, once coral-other, cannot read it
import http.client
import json
import os
import pwd
import subprocess
import urllib.error

import httpx
import pytest

from coral_hpc.daemon import ensure_key_file
from coral_hpc.daemon.scrape import fetch_demand
from coral_hpc.gateway.auth import add_key
from harness.gateway import (
    CORAL_HPC,
    start_gateway,
    start_stub,
    write_models_yaml,
    write_table,
)

COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 4}
#: every route but /health, as (method, path, JSON body)
ROUTES = [("POST", "/v1/completions", COMPLETION), ("GET", "/v1/models", None),
          ("GET", "/v1/models/m", None), ("GET", "/metrics", None),
          ("GET", "/internal/routing", None), ("GET", "/internal/demand", None)]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwloop")
    stub = start_stub(tmp, "r1")
    keys = tmp / "api-keys"
    alice = add_key(keys, "alice")
    models = write_models_yaml(tmp, ["m"], api_keys_file=keys)
    # where `serve` keeps the daemon's internal key, which this gateway reads by default
    internal = ensure_key_file(tmp / "state" / "gwtest" / "internal.key")
    table = tmp / "routing-table.json"
    write_table(table, 1, {"m": [("r1", stub.url, 1.0)]})
    gateway = start_gateway(tmp, models, table)   # listens on 127.0.0.1
    yield {"gw": gateway, "alice": alice, "internal": internal.read_text().strip()}
    gateway.stop()
    stub.stop()


def _call(env, method: str, path: str, body, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, env["gw"].url + path, json=body, headers=headers, timeout=10)


@pytest.mark.parametrize("method, path, body", ROUTES, ids=[r[1] for r in ROUTES])
def test_loopback_without_a_key_is_refused_on_every_route(env, method, path, body):
    assert env["gw"].url.startswith("http://127.0.0.1:")
    for key in (None, "coral-not-a-key"):
        refused = _call(env, method, path, body, key)
        assert refused.status_code == 401, (path, key, refused.text)
        assert refused.json()["error"]["type"] == "authentication_error"
    assert _call(env, method, path, body, env["alice"]).status_code == 200


def test_health_stays_open(env):
    # a liveness probe: says the gateway answers, nothing about models, keys or replicas
    answer = httpx.get(env["gw"].url + "/health", timeout=10)
    assert answer.status_code == 200 and set(answer.json()) == {"status", "table_version"}


def test_the_daemons_internal_key_opens_internal_routes_and_metrics_only(env):
    counters = fetch_demand(env["gw"].url, key=env["internal"])
    assert "m" in counters["models"]
    with pytest.raises(urllib.error.HTTPError, match="401"):
        fetch_demand(env["gw"].url)
    for path in ("/metrics", "/internal/routing"):
        assert _call(env, "GET", path, None, env["internal"]).status_code == 200
    # not a client key: it reaches no model
    for method, path, body in ROUTES[:3]:
        assert _call(env, method, path, body, env["internal"]).status_code == 401, path


def test_no_keys_file_and_no_opt_out_is_refused_naming_the_field(tmp_path):
    models = write_models_yaml(tmp_path, ["m"], open_on_loopback=False)
    result = subprocess.run([CORAL_HPC, "gateway", str(models), "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "gateway.api_keys_file is not set" in result.stderr
    assert "coral-hpc keys add" in result.stderr
    assert "gateway.open_on_loopback: true" in result.stderr


def test_serve_refuses_before_starting_anything(tmp_path):
    models = write_models_yaml(tmp_path, ["m"], open_on_loopback=False)
    result = subprocess.run([CORAL_HPC, "serve", str(models), "--listen", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "gateway.api_keys_file is not set" in result.stderr
    assert "nothing was started" in result.stderr
    assert not (tmp_path / "db.sqlite").exists()


def test_open_on_loopback_serves_without_a_key_and_warns(tmp_path):
    stub = start_stub(tmp_path, "r1")
    models = write_models_yaml(tmp_path, ["m"], open_on_loopback=True)
    table = tmp_path / "routing-table.json"
    write_table(table, 1, {"m": [("r1", stub.url, 1.0)]})
    gateway = start_gateway(tmp_path, models, table)
    try:
        assert httpx.post(gateway.url + "/v1/completions", json=COMPLETION,
                          timeout=10).status_code == 200
        assert httpx.get(gateway.url + "/internal/demand", timeout=10).status_code == 200
        assert "gateway.open_on_loopback is true" in gateway.log.read_text()
    finally:
        gateway.stop()
        stub.stop()
    # and never beyond loopback, even when --listen moves it there
    beyond = subprocess.run([CORAL_HPC, "gateway", str(models), "--listen", "0.0.0.0:0"],
                            capture_output=True, text=True, timeout=60)
    assert beyond.returncode == 2
    assert "gateway.open_on_loopback only opens a loopback address" in beyond.stderr


OTHER_USER = "coral-other"  # made by scripts/dev-cluster for the busy-cluster tests


def _other_user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        return None


@pytest.mark.skipif(_other_user() is None or os.geteuid() != 0,
                    reason=f"needs root and a second local user {OTHER_USER}")
def test_a_second_local_user_gets_401_from_every_route(env):
    """Another person on the login node: a process of theirs (a forked child that became
    coral-other) reaches every route but /health only to be refused."""
    other = _other_user()
    assert other is not None
    host, port = env["gw"].url.removeprefix("http://").rsplit(":", 1)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: coral-other from here on, plain sockets only
        try:
            os.setgid(other.pw_gid)
            os.setuid(other.pw_uid)
            statuses = []
            for method, path, body in [*ROUTES, ("GET", "/health", None)]:
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                conn.request(method, path, body=json.dumps(body) if body else None,
                             headers={"Content-Type": "application/json"})
                statuses.append(conn.getresponse().status)
                conn.close()
            os.write(write_end, json.dumps([os.getuid(), statuses]).encode())
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            os.write(write_end, json.dumps(["failed", repr(exc)]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        answer = reader.read()
    os.waitpid(pid, 0)
    uid, statuses = json.loads(answer)
    assert uid == other.pw_uid, statuses
    assert statuses == [401] * len(ROUTES) + [200], statuses   # /health answers, nothing else
