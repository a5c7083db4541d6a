"""The gateway's access log (issue 28): one JSON line per request, never the prompt or the
answer, in private files rotated per UTC day and pruned after ``retention.access_log_days``.

The writer is tested on its own with a fake clock; the hook (``ServerSettings.on_answered``)
with the gateway in-process behind its own HTTP server on a real socket, for the answers no
replica is needed for: refusals by key (on the head, with and without ``Expect``), by the
server (413, 404 path), by the gateway (404 model, 503 no replica), the model list."""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import re
import stat
import time
from pathlib import Path

import pytest

from coral_hpc.config import RetentionConfig
from coral_hpc.gateway.accesslog import (
    FIELDS,
    AccessLog,
    AccessLogError,
    file_for_day,
)
from coral_hpc.gateway.auth import KeyChecker, KeyEntry, hash_key, read_keys_file
from coral_hpc.gateway.http_server import HttpServer
from coral_hpc.gateway.proxy import Gateway, GatewaySettings
from coral_hpc.gateway.table import ReplicaRoute, RoutingTable

DAY = 86400.0


def _epoch(text: str) -> float:
    """``YYYY-MM-DD HH:MM:SS`` UTC → epoch seconds."""
    date, clock = text.split()
    return float(calendar.timegm((*map(int, date.split("-")), *map(int, clock.split(":")))))


def _record(log: AccessLog, epoch: float, key: str = "alice", status: int = 200) -> None:
    log.record(epoch, key, "astro", "POST", "/v1/completions", "m", status, False, 3, 5, False,
               0.25, "r1", "4242", "http://node:1", None)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def loose_umask():
    """Files and folders follow a permissive umask unless the code sets their mode itself."""
    old = os.umask(0o002)
    yield
    os.umask(old)


# ---------------------------------------------------------------------- the writer


def test_lines_go_to_their_utc_days_file_with_every_field_in_order(tmp_path, loose_umask):
    now = [_epoch("2026-05-01 23:59:59")]
    log = AccessLog(tmp_path / "state" / "access", keep_days=30, clock=lambda: now[0])
    log.open(start_thread=False)
    _record(log, _epoch("2026-05-01 23:59:58") + 0.1234)
    _record(log, _epoch("2026-05-02 00:00:01"), key="bob", status=503)
    assert log.flush() == 2
    first = _lines(file_for_day(log.folder, "2026-05-01"))
    second = _lines(file_for_day(log.folder, "2026-05-02"))
    assert [list(line) for line in first + second] == [list(FIELDS)] * 2
    assert first[0] == {
        "time": "2026-05-01T23:59:58.123Z", "key": "alice", "lab": "astro", "method": "POST",
        "path": "/v1/completions", "model": "m", "status": 200, "stream": False,
        "prompt_tokens": 3, "output_tokens": 5, "tokens_estimated": False, "latency_s": 0.25,
        "replica": "r1", "job_id": "4242", "replica_url": "http://node:1", "error": None}
    assert (second[0]["key"], second[0]["status"]) == ("bob", 503)
    # appended, not replaced, by a later flush (and by a gateway started later)
    _record(log, _epoch("2026-05-02 10:00:00"))
    log.close()
    again = AccessLog(log.folder, keep_days=30, clock=lambda: now[0])
    again.open(start_thread=False)
    _record(again, _epoch("2026-05-02 11:00:00"), key="carol")
    again.close()
    assert [x["key"] for x in _lines(file_for_day(log.folder, "2026-05-02"))] == [
        "bob", "alice", "carol"]


def test_folder_is_0700_and_files_0600_whatever_the_umask(tmp_path, loose_umask):
    folder = tmp_path / "state" / "access"
    log = AccessLog(folder, keep_days=30, clock=lambda: _epoch("2026-05-01 12:00:00"))
    log.open(start_thread=False)
    _record(log, _epoch("2026-05-01 12:00:00"))
    log.close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    path = file_for_day(folder, "2026-05-01")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # a file someone loosened is made private again when the gateway writes to it
    path.chmod(0o644)
    log = AccessLog(folder, keep_days=30, clock=lambda: _epoch("2026-05-01 12:00:00"))
    log.open(start_thread=False)
    _record(log, _epoch("2026-05-01 12:30:00"))
    log.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_folder_others_may_write_is_refused_naming_the_fix(tmp_path):
    folder = tmp_path / "access"
    folder.mkdir()
    folder.chmod(0o777)
    where = re.escape(str(folder))
    with pytest.raises(AccessLogError, match=rf"access-log folder {where} has mode 777.*chmod 700"):
        AccessLog(folder, keep_days=30).open(start_thread=False)


def test_days_older_than_retention_are_pruned_at_start_and_on_a_new_day(tmp_path):
    folder = tmp_path / "access"
    folder.mkdir(mode=0o700)
    for day in ("2026-04-27", "2026-04-28", "2026-04-29", "2026-04-30"):
        file_for_day(folder, day).write_text("{}\n")
    (folder / "notes.txt").write_text("not ours")          # never touched
    now = [_epoch("2026-05-01 06:00:00")]
    # keep 2 days: a day's file goes once its last second is more than 2 days old
    log = AccessLog(folder, keep_days=2, clock=lambda: now[0])
    log.open(start_thread=False)
    assert sorted(p.name for p in folder.iterdir()) == [
        "access-2026-04-29.jsonl", "access-2026-04-30.jsonl", "notes.txt"]
    _record(log, now[0])
    log.flush()
    now[0] = _epoch("2026-05-02 00:00:05")                 # a new day: its file prunes
    _record(log, now[0])
    log.flush()
    assert sorted(p.name for p in folder.iterdir()) == [
        "access-2026-04-30.jsonl", "access-2026-05-01.jsonl", "access-2026-05-02.jsonl",
        "notes.txt"]
    # a quiet gateway prunes too: hourly, without a request
    now[0] = _epoch("2026-05-04 01:00:00")
    log.flush()
    assert sorted(p.name for p in folder.iterdir()) == [
        "access-2026-05-02.jsonl", "notes.txt"]
    log.close()


def test_retention_setting_has_a_default_and_is_validated():
    assert RetentionConfig().access_log_days == 90
    assert RetentionConfig(access_log_days=7).access_log_days == 7
    with pytest.raises(ValueError):
        RetentionConfig(access_log_days=0)


def test_a_writer_far_behind_drops_lines_and_counts_them(tmp_path):
    log = AccessLog(tmp_path / "access", keep_days=30, max_pending=3)
    log.open(start_thread=False)
    for _ in range(5):
        _record(log, _epoch("2026-05-01 12:00:00"))
    assert log.dropped == 2
    assert log.flush() == 3
    log.close()


def test_a_failed_write_drops_its_lines_and_the_writer_goes_on(tmp_path):
    folder = tmp_path / "access"
    log = AccessLog(folder, keep_days=30)
    log.open(start_thread=False)
    folder.rmdir()
    folder.write_text("a file where the folder was")     # the folder cannot be made again
    _record(log, _epoch("2026-05-01 12:00:00"))
    assert log.flush() == 0 and log.dropped == 1
    folder.unlink()                                        # fixed: writes go on
    _record(log, _epoch("2026-05-01 12:00:01"))
    assert log.flush() == 1 and log.dropped == 1
    log.close()
    assert len(_lines(file_for_day(folder, "2026-05-01"))) == 1


def test_the_writer_thread_writes_without_being_asked(tmp_path):
    log = AccessLog(tmp_path / "access", keep_days=30, flush_interval_s=0.05)
    log.open()
    try:
        _record(log, time.time())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not list(log.folder.glob("access-*.jsonl")):
            time.sleep(0.02)
        (path,) = log.folder.glob("access-*.jsonl")
        assert _lines(path)[0]["key"] == "alice"
    finally:
        log.close()


# ---------------------------------------------------------------------- keys carry a lab


def test_a_key_may_name_its_lab(tmp_path):
    from coral_hpc.gateway.auth import add_key

    path = tmp_path / "keys"
    add_key(path, "alice", lab="astro")
    add_key(path, "bob")
    entries = read_keys_file(path)
    assert [(e.name, e.lab) for e in entries] == [("alice", "astro"), ("bob", None)]
    checker = KeyChecker(entries)
    assert checker.lab_of("alice") == "astro" and checker.lab_of("bob") is None


def test_keys_add_takes_a_lab_and_list_shows_it(tmp_path):
    from click.testing import CliRunner

    from coral_hpc.cli import cli

    path = str(tmp_path / "keys")
    runner = CliRunner()
    assert runner.invoke(cli, ["keys", "add", path, "alice", "--lab", "astro"]).exit_code == 0
    assert runner.invoke(cli, ["keys", "add", path, "bob"]).exit_code == 0
    bad = runner.invoke(cli, ["keys", "add", path, "carol", "--lab", "two words"])
    assert bad.exit_code != 0 and "is not a lab" in bad.output
    listed = runner.invoke(cli, ["keys", "list", path, "--json"])
    assert [(row["name"], row["lab"]) for row in json.loads(listed.output)] == [
        ("alice", "astro"), ("bob", None)]


# ---------------------------------------------------------------------- the gateway's hook

SECRET_PROMPT = "the-secret-prompt-text-7c1e"


def _gateway(tmp_path: Path) -> tuple[Gateway, str]:
    key = "coral-test-key-alice"
    keys = KeyChecker([KeyEntry("alice", hash_key(key), "", "astro")])
    gw = Gateway(GatewaySettings(models=("m", "empty"), max_body_bytes=2048,
                                 access_log_dir=tmp_path / "access"), keys=keys)
    gw.router.apply(RoutingTable(1, {"m": (ReplicaRoute("a", "http://h:1", 1.0),),
                                     "empty": ()}))
    gw.state.learn_models(gw.router.models)
    return gw, key


async def _send(port: int, raw: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return int(answer.split()[1])


def _post(path: str, body: bytes, key: str | None = None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}{extra}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def _get(path: str, key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode()


def _serve(gw: Gateway, requests: list[bytes]) -> list[int]:
    async def main():
        gw.access_log.open(start_thread=False)
        server = HttpServer(gw.server_settings())
        port = await server.start("127.0.0.1", 0)
        try:
            return [await _send(port, r) for r in requests]
        finally:
            await server.close()
            gw.access_log.close()

    return asyncio.run(main())


def _logged(gw: Gateway) -> list[dict]:
    return [line for path in sorted(gw.access_log.folder.glob("access-*.jsonl"))
            for line in _lines(path)]


def test_refused_and_unroutable_requests_are_logged_without_their_prompt(tmp_path):
    gw, key = _gateway(tmp_path)
    prompt = json.dumps({"model": "m", "prompt": SECRET_PROMPT}).encode()
    statuses = _serve(gw, [
        _post("/v1/completions", prompt),                                  # no key
        _post("/v1/completions", prompt, "coral-wrong",
              "Expect: 100-continue\r\n"),                                 # refused on the head
        _post("/v1/completions", json.dumps(
            {"model": "nope", "prompt": SECRET_PROMPT}).encode(), key),    # unknown model
        _post("/v1/completions", json.dumps(
            {"model": "empty", "prompt": SECRET_PROMPT}).encode(), key),   # no replica
        _post("/v1/completions", json.dumps(
            {"model": "m", "prompt": SECRET_PROMPT * 100}).encode(), key), # over the size
        _post("/v1/chat/completions", b"{not json " + SECRET_PROMPT.encode(), key),
        _get("/v1/models", key),
    ])
    assert statuses == [401, 401, 404, 503, 413, 400, 200]
    lines = _logged(gw)
    assert [(x["method"], x["path"], x["status"], x["key"], x["lab"], x["model"])
            for x in lines] == [
        ("POST", "/v1/completions", 401, None, None, None),
        ("POST", "/v1/completions", 401, None, None, None),
        ("POST", "/v1/completions", 404, "alice", "astro", "nope"),
        ("POST", "/v1/completions", 503, "alice", "astro", "empty"),
        ("POST", "/v1/completions", 413, "alice", "astro", None),
        ("POST", "/v1/chat/completions", 400, "alice", "astro", None),
        ("GET", "/v1/models", 200, "alice", "astro", None),
    ]
    for line in lines:
        assert list(line) == list(FIELDS)
        assert line["replica"] is None and line["prompt_tokens"] is None
        assert isinstance(line["latency_s"], float) and 0 <= line["latency_s"] < 5
    text = "".join(p.read_text() for p in gw.access_log.folder.iterdir())
    assert SECRET_PROMPT not in text and key not in text


def test_health_and_authorized_metrics_polls_are_not_logged(tmp_path):
    gw, key = _gateway(tmp_path)
    assert _serve(gw, [_get("/health"), _get("/metrics", key),
                       _get("/internal/demand", key)]) == [200, 200, 200]
    assert _logged(gw) == []


def test_a_refusal_on_any_route_is_logged(tmp_path):
    """Beyond /v1/ only refusals are logged (a 401 on /metrics is someone trying keys)."""
    from coral_hpc.gateway.http_server import Request

    gw, _ = _gateway(tmp_path)
    gw.access_log.open(start_thread=False)
    for path, status in (("/internal/routing", 401), ("/internal/routing", 200),
                         ("/health", 200)):
        gw._answered(Request("GET", path, {}, "10.0.0.9", None, time.monotonic()), status)
    gw.access_log.close()
    assert [(x["path"], x["status"], x["key"]) for x in _logged(gw)] == [
        ("/internal/routing", 401, None)]


def test_without_keys_requests_are_logged_as_anonymous(tmp_path):
    gw = Gateway(GatewaySettings(models=("m",), access_log_dir=tmp_path / "access"))
    gw.router.apply(RoutingTable(1, {"m": ()}))
    assert _serve(gw, [_post("/v1/completions", b'{"model": "m", "prompt": "x"}')]) == [503]
    (line,) = _logged(gw)
    assert (line["key"], line["lab"], line["status"], line["model"]) == (
        "anonymous", None, 503, "m")


def test_no_access_log_without_a_folder(tmp_path):
    gw = Gateway(GatewaySettings(models=("m",)))
    assert gw.access_log is None and gw.server_settings().on_answered is None


# ---------------------------------------------------------------------- job ids reach the gateway


def test_the_daemons_table_names_each_replicas_job_for_the_gateway(tmp_path):
    from coral_hpc.daemon.routing import TablePublisher, ready_routes
    from coral_hpc.gateway.routing import Router
    from coral_hpc.gateway.table import RoutingTableError, read_routing_table
    from coral_hpc.reconcile import ReconcileSettings, replica_status
    from tests.unit.reconcile_facts import facts, rec

    items = facts(rec("a"))
    statuses = {f.record.id: replica_status(f, 100.0, ReconcileSettings()) for f in items}
    path = tmp_path / "t.json"
    TablePublisher(path).publish(ready_routes(["m"], items, statuses))
    assert json.loads(path.read_text())["models"]["m"]["replicas"][0]["job_id"] == "job-a"
    router = Router()
    router.apply(read_routing_table(path))
    assert router.replicas("m")[0].job_id == "job-a"
    # a table written before job ids (or by hand) has none, and a bad one is refused
    data = json.loads(path.read_text())
    del data["models"]["m"]["replicas"][0]["job_id"]
    data["version"] = 2
    path.write_text(json.dumps(data))
    assert read_routing_table(path).models["m"][0].job_id is None
    data["models"]["m"]["replicas"][0]["job_id"] = 42
    path.write_text(json.dumps(data))
    with pytest.raises(RoutingTableError, match=r"job_id: expected a non-empty string"):
        read_routing_table(path)
