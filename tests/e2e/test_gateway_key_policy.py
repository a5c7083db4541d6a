"""Keys that carry policy (issue 28, item 4), through a real ``coral-hpc gateway``: a key scoped
to some models is refused the others (403) and sees only its own in ``/v1/models``; a key's
requests per minute hold under concurrent load (429 with Retry-After beyond them); an expired
key is no key (401). Keys are made with ``coral-hpc keys add`` as a site admin would."""

from __future__ import annotations

import asyncio
import json
import subprocess

import aiohttp
import httpx
import pytest

from coral_hpc.gateway.auth import add_key
from harness.gateway import (
    CORAL_HPC,
    start_gateway,
    start_stub,
    write_models_yaml,
    write_table,
)


def _keys_add(keys, name: str, *options: str) -> str:
    out = subprocess.run([CORAL_HPC, "keys", "add", str(keys), name, *options],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gwpolicy")
    stub = start_stub(tmp, "r1")
    keys = tmp / "api-keys"
    scoped = _keys_add(keys, "scoped", "--models", "chat", "--lab", "bio")
    limited = _keys_add(keys, "limited", "--rpm", "5")
    expired = add_key(keys, "expired", expires="2020-01-01")
    models = write_models_yaml(tmp, ["chat", "code"], api_keys_file=keys)
    table = tmp / "routing-table.json"
    write_table(table, 1, {"chat": [("r1", stub.url, 1.0)], "code": [("r1", stub.url, 1.0)]})
    gateway = start_gateway(tmp, models, table)
    yield {"gw": gateway, "keys": keys, "scoped": scoped, "limited": limited,
           "expired": expired}
    gateway.stop()
    stub.stop()


def _post(env, key: str, model: str) -> httpx.Response:
    return httpx.post(env["gw"].url + "/v1/completions", timeout=10,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "prompt": "hi", "max_tokens": 2})


def test_a_scoped_key_is_refused_other_models_and_sees_only_its_own(env):
    assert _post(env, env["scoped"], "chat").status_code == 200
    refused = _post(env, env["scoped"], "code")
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "permission_error"
    assert "may not use model 'code'" in refused.json()["error"]["message"]
    listed = httpx.get(env["gw"].url + "/v1/models", timeout=10,
                       headers={"Authorization": f"Bearer {env['scoped']}"}).json()
    assert [m["id"] for m in listed["data"]] == ["chat"]
    one = httpx.get(env["gw"].url + "/v1/models/code", timeout=10,
                    headers={"Authorization": f"Bearer {env['scoped']}"})
    assert one.status_code == 403


def test_requests_per_minute_hold_under_concurrent_load(env):
    async def burst() -> list[tuple[int, str | None]]:
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {env['limited']}"}) as session:
            async def one() -> tuple[int, str | None]:
                async with session.post(env["gw"].url + "/v1/completions",
                                        json={"model": "code", "prompt": "hi",
                                              "max_tokens": 2}) as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("Retry-After")
            return await asyncio.gather(*(one() for _ in range(20)))

    results = asyncio.run(burst())
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 5 + [429] * 15, statuses
    waits = [int(after) for status, after in results if status == 429]
    assert all(1 <= wait <= 60 for wait in waits), waits


def test_an_expired_key_is_refused(env):
    answer = _post(env, env["expired"], "chat")
    assert answer.status_code == 401, answer.text


def test_keys_list_shows_each_keys_policy(env):
    out = subprocess.run([CORAL_HPC, "keys", "list", str(env["keys"]), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert (rows["scoped"]["models"], rows["scoped"]["lab"]) == (["chat"], "bio")
    assert (rows["limited"]["rpm"], rows["limited"]["models"]) == (5, [])
    assert rows["expired"]["expires"] == "2020-01-01"
