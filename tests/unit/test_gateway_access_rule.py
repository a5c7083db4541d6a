"""Who may reach the gateway (issue 28, item 1): without a keys file it starts only when the file
opts out, ``gateway.open_on_loopback: true``, and that only on a loopback address; the
refusals name the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from coral_hpc.config import GatewayConfig
from coral_hpc.gateway.server import GatewayStartError, check_exposure
from tests.conftest import REPO


def test_no_keys_and_no_opt_out_is_refused_naming_the_field_and_the_fix():
    with pytest.raises(GatewayStartError) as refused:
        check_exposure("127.0.0.1", None)
    message = str(refused.value)
    assert "gateway.api_keys_file is not set" in message
    assert "coral-hpc keys add" in message and "gateway.open_on_loopback: true" in message


def test_open_on_loopback_starts_on_loopback_only():
    check_exposure("127.0.0.1", None, open_on_loopback=True)
    check_exposure("::1", None, open_on_loopback=True)
    # `--listen` may move a loopback config elsewhere: still refused
    with pytest.raises(GatewayStartError, match="gateway.open_on_loopback only opens a loopback"):
        check_exposure("0.0.0.0", None, open_on_loopback=True)


def test_keys_start_on_loopback_and_beyond_with_tls():
    keys = Path("/nonexistent/keys")   # only whether one is configured matters here
    check_exposure("127.0.0.1", keys)
    check_exposure("0.0.0.0", keys, tls=True)
    with pytest.raises(GatewayStartError, match="in clear"):
        check_exposure("0.0.0.0", keys)


def test_open_on_loopback_with_a_non_loopback_listen_is_a_config_error_naming_the_field():
    with pytest.raises(ValidationError) as error:
        GatewayConfig(listen="0.0.0.0:8000", open_on_loopback=True)
    text = str(error.value)
    assert "open_on_loopback" in text and "'0.0.0.0:8000'" in text and "api_keys_file" in text
    assert GatewayConfig(listen="127.0.0.1:8000", open_on_loopback=True).open_on_loopback


def test_open_on_loopback_and_a_keys_file_together_is_a_config_error():
    with pytest.raises(ValidationError, match="open_on_loopback: true and api_keys_file"):
        GatewayConfig(open_on_loopback=True, api_keys_file="/etc/coral/keys")


def test_validate_warns_that_serve_will_refuse_a_file_without_keys(tmp_path):
    import json

    from click.testing import CliRunner

    from coral_hpc.cli.validate import validate
    from harness.gateway import write_models_yaml

    def warnings(path) -> list[str]:
        snapshot = REPO / "tests" / "data" / "plan" / "devcluster-snapshot.json"
        out = CliRunner().invoke(validate, [str(path), "--snapshot", str(snapshot), "--json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["warnings"]

    for name in ("closed", "open"):
        (tmp_path / name).mkdir()
    closed = write_models_yaml(tmp_path / "closed", ["m"], open_on_loopback=False)
    assert any(w.startswith("serve and gateway will refuse to start: gateway.api_keys_file")
               for w in warnings(closed))
    opened = write_models_yaml(tmp_path / "open", ["m"], open_on_loopback=True)
    assert any(w.startswith("gateway.open_on_loopback is true") for w in warnings(opened))
