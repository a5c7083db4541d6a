"""TLS on the gateway, with real clients (httpx and the official ``openai`` client) that trust a
CA made for the test; and the exposure rules of ``models.yaml`` through ``coral-hpc validate`` and
``coral-hpc gateway`` (issue 17, item 1)."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error

import httpx
import openai
import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon import ensure_key_file, service
from coral_hpc.daemon.process import GatewayProcess
from coral_hpc.daemon.scrape import fetch_demand
from coral_hpc.gateway.auth import add_key
from coral_hpc.gateway.table import default_internal_key_path
from coral_hpc.gateway.tls import loopback_client_context
from harness.gateway import (
    CORAL_HPC,
    start_gateway,
    start_stub,
    write_models_yaml,
    write_table,
)
from tests.support.tls_certs import make_pki


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwtls")
    pki = make_pki(tmp / "pki")
    stub = start_stub(tmp, "r1")
    keys = tmp / "api-keys"
    key = add_key(keys, "alice")
    models = write_models_yaml(tmp, ["m"], api_keys_file=keys, tls_cert=str(pki.server_cert),
                               tls_key=str(pki.server_key))
    # the daemon's internal key, where serve keeps it and the gateway reads it
    ensure_key_file(default_internal_key_path(load_deployment(models)))
    table = tmp / "routing-table.json"
    write_table(table, 1, {"m": [("r1", stub.url, 1.0)]})
    gateway = start_gateway(tmp, models, table)
    port = gateway.address.rsplit(":", 1)[1]
    yield {"tmp": tmp, "pki": pki, "key": key, "keys": keys, "gw": gateway, "port": port,
           "url": f"https://localhost:{port}", "models": models, "table": table}
    gateway.stop()
    stub.stop()


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def test_openai_and_httpx_clients_talk_https_to_the_gateway(env):
    ca = ssl.create_default_context(cafile=str(env["pki"].ca_cert))
    client = openai.OpenAI(base_url=env["url"] + "/v1", api_key=env["key"], max_retries=0,
                           http_client=httpx.Client(verify=ca))
    answer = client.chat.completions.create(**CHAT)
    assert answer.choices[0].message.content and answer.usage.completion_tokens == 4
    chunks = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        **CHAT, stream=True) if c.choices]
    assert len("".join(chunks).split()) == 4
    with httpx.Client(verify=ca) as http:
        response = http.post(env["url"] + "/v1/chat/completions", json=CHAT,
                             headers={"Authorization": f"Bearer {env['key']}"})
        assert response.status_code == 200
        assert response.extensions["http_version"] == b"HTTP/1.1"
        assert http.get(env["url"] + "/v1/models").status_code == 401   # keys still apply


def test_no_cleartext_and_no_unknown_certificate(env):
    with pytest.raises(httpx.HTTPError):
        # plain HTTP to the TLS port: the handshake fails, nothing is answered in clear
        httpx.post(f"http://127.0.0.1:{env['port']}/v1/chat/completions", json=CHAT,
                   headers={"Authorization": f"Bearer {env['key']}"}, timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        # a client that does not trust the test CA refuses the certificate
        httpx.get(env["url"] + "/health", verify=ssl.create_default_context(), timeout=5)


def test_the_daemons_loopback_context_trusts_the_gateways_own_certificate(env):
    context = loopback_client_context(env["pki"].server_cert)
    response = httpx.get(f"https://127.0.0.1:{env['port']}/internal/demand", verify=context,
                         headers={"Authorization": f"Bearer {env['key']}"}, timeout=5)
    assert response.status_code == 200 and "models" in response.json()


def test_the_daemon_scrapes_demand_from_a_tls_gateway(env):
    """`serve` reads the gateway's counters over https when the gateway serves TLS: the URL it
    dials and the context it trusts both come from the deployment's gateway settings."""
    gateway = GatewayProcess(env["models"], load_deployment(env["models"]))
    gateway.address = f"127.0.0.1:{env['port']}"   # the address the started gateway reported
    assert gateway.url == f"https://127.0.0.1:{env['port']}"
    # with the daemon's internal key, as serve scrapes it (service.gateway_demand)
    counters = service.gateway_demand(gateway)
    assert "models" in counters
    with pytest.raises(urllib.error.HTTPError, match="401"):
        fetch_demand(gateway.url, tls_cert=gateway.deployment.gateway.tls_cert)   # no key
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch_demand(gateway.url)   # without the gateway's own certificate: refused, not cleartext


def _validate(path) -> subprocess.CompletedProcess:
    return subprocess.run([CORAL_HPC, "validate", str(path)], check=False, capture_output=True,
                          text=True, timeout=60)


def test_validate_requires_keys_and_tls_beyond_loopback(env, tmp_path):
    pki, keys = env["pki"], env["keys"]
    cases = {
        "no keys": ({}, "api_keys_file"),
        "keys, no TLS": ({"api_keys_file": keys}, "tls_cert"),
        "cert without key": ({"api_keys_file": keys, "tls_cert": str(pki.server_cert)},
                             "tls_cert and tls_key together"),
    }
    for name, (fields, expected) in cases.items():
        folder = tmp_path / name.replace(" ", "-").replace(",", "")
        folder.mkdir()
        models = write_models_yaml(folder, ["m"], listen="0.0.0.0:8443", **fields)
        result = _validate(models)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert expected in result.stderr and "gateway" in result.stderr, (name, result.stderr)
    for name, fields in {
        "tls": {"api_keys_file": keys, "tls_cert": str(pki.server_cert),
                "tls_key": str(pki.server_key)},
        "proxy": {"api_keys_file": keys, "behind_tls_proxy": True},
    }.items():
        folder = tmp_path / f"ok-{name}"
        folder.mkdir()
        result = _validate(write_models_yaml(folder, ["m"], listen="0.0.0.0:8443", **fields))
        assert result.returncode == 0, (name, result.stderr)
    loopback = tmp_path / "loopback"
    loopback.mkdir()
    assert _validate(write_models_yaml(loopback, ["m"], listen="127.0.0.1:8000")).returncode == 0


def _gateway_start(models, listen: str) -> subprocess.CompletedProcess:
    return subprocess.run([CORAL_HPC, "gateway", str(models), "--listen", listen],
                          check=False, capture_output=True, text=True, timeout=30)


def test_gateway_refuses_a_readable_tls_key_and_a_listen_override_without_tls(env, tmp_path):
    pki = env["pki"]
    loose = tmp_path / "loose.key"
    loose.write_bytes(pki.server_key.read_bytes())
    loose.chmod(0o644)
    models = write_models_yaml(tmp_path, ["m"], api_keys_file=env["keys"],
                               tls_cert=str(pki.server_cert), tls_key=str(loose))
    result = _gateway_start(models, "127.0.0.1:0")
    assert result.returncode == 2
    assert str(loose) in result.stderr and "0644" in result.stderr and "chmod 600" in result.stderr

    writable = tmp_path / "writable-keys"
    writable.write_bytes(env["keys"].read_bytes())
    writable.chmod(0o666)
    (tmp_path / "w").mkdir()
    models = write_models_yaml(tmp_path / "w", ["m"], api_keys_file=writable)
    result = _gateway_start(models, "127.0.0.1:0")
    assert result.returncode == 2 and str(writable) in result.stderr

    # --listen overrides models.yaml's loopback address: the same rules apply at start
    (tmp_path / "o").mkdir()
    models = write_models_yaml(tmp_path / "o", ["m"], api_keys_file=env["keys"])
    result = _gateway_start(models, "0.0.0.0:0")
    assert result.returncode == 2 and "tls_cert" in result.stderr


def test_a_certificate_that_is_not_pem_stops_the_start(env, tmp_path):
    bad = tmp_path / "bad.crt"
    bad.write_text("not a certificate\n")
    models = write_models_yaml(tmp_path, ["m"], api_keys_file=env["keys"], tls_cert=str(bad),
                               tls_key=str(env["pki"].server_key))
    result = _gateway_start(models, "127.0.0.1:0")
    assert result.returncode == 2 and str(bad) in result.stderr
    assert "Traceback" not in result.stderr


def test_tls_settings_are_documented_in_the_example(env):
    from coral_hpc.config import load_deployment
    from harness.gateway import REPO

    example = load_deployment(REPO / "examples" / "university.yaml")
    assert example.gateway.tls_cert and example.gateway.tls_key
    assert json.dumps(example.gateway.model_dump())   # a plain, serialisable section
