"""serve()'s lifetime (coral_hpc.daemon.service) with a fake Slurm and a fake gateway process:
start-up announces the daemon, a stop request ends it, the way out cleans up and leaves the
replicas alone; and the gateway and metrics helpers on their own (issue 25)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon import service
from coral_hpc.daemon.metrics import DaemonMetrics
from coral_hpc.daemon.process import info_path
from coral_hpc.errors import PermanentError
from coral_hpc.plan.planner import SolverUnavailable
from coral_hpc.store import open_store
from harness.daemon_setup import SimModel, write_models_yaml
from tests.conftest import wait_until
from tests.fakes.slurm import FakeSlurm, recorded_snapshot


class FakeGateway:
    """A gateway process that is never started for real: its address, whether it runs."""

    def __init__(self, config_path=None, deployment=None, listen=None, adopt=None):
        self.deployment = deployment
        self.listen = listen
        self.address: str | None = None
        self.adoptable = adopt
        self.pid = 4242
        self.exit_code: int | None = None
        self.running = False
        self.fail: Exception | None = None

    @property
    def url(self) -> str | None:
        return f"http://{self.address}" if self.address else None

    def adopt(self):
        if self.adoptable:
            self.address, self.running = self.adoptable, True
        return self.adoptable

    def start(self):
        if self.fail is not None:
            raise self.fail
        self.address, self.running = "127.0.0.1:18000", True
        return self.address

    def alive(self):
        return self.running

    def stop(self):
        self.running = False


class Events:
    def __init__(self):
        self.added: list[tuple[str, str]] = []

    def add_event(self, _at, kind, message):
        self.added.append((kind, message))


def test_serve_announces_itself_stops_on_request_and_cleans_up(tmp_path, monkeypatch):
    config = write_models_yaml(tmp_path, "svc", time_limit="01:00:00", partitions=("a100",),
                               models=(SimModel("chat", (512, 128), 1),))
    deployment = load_deployment(config)
    gateways: list[FakeGateway] = []

    def gateway(*args, **kw):
        gateways.append(FakeGateway(*args, **kw))
        return gateways[-1]

    monkeypatch.setattr(service, "GatewayProcess", gateway)
    monkeypatch.setattr(service, "client_for_deployment",
                        lambda d, budgeted: FakeSlurm(recorded_snapshot(), time.time))

    def planner(request):
        raise SolverUnavailable("policy.solver pyomo:none: not installed")

    stop = threading.Event()
    thread = threading.Thread(target=service.serve, args=(config, planner),
                              kwargs={"metrics_listen": None, "stop": stop}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: info_path(deployment).exists(), 30, "the daemon file")
        info = json.loads(info_path(deployment).read_text())
        assert info["gateway"] == "127.0.0.1:18000" and info["metrics"] is None
        assert gateways[0].running
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert not info_path(deployment).exists()  # the way out removes the daemon file
    assert not gateways[0].running
    store = open_store(deployment.db_path)
    try:
        kinds = [e.kind for e in store.events(limit=50)]
    finally:
        store.close()
    assert "start" in kinds and "stop" in kinds


def test_start_gateway_adopts_a_running_one_and_says_so():
    events = Events()
    assert service.start_gateway(FakeGateway(adopt="127.0.0.1:9"), events) == "127.0.0.1:9"
    assert events.added == [("gateway", "adopted the running gateway (pid 4242) on 127.0.0.1:9")]
    fresh = Events()
    assert service.start_gateway(FakeGateway(), fresh) == "127.0.0.1:18000"
    assert fresh.added == []


def test_restart_gateway_backs_off_only_when_the_start_fails():
    events, gateway = Events(), FakeGateway()
    gateway.exit_code = 1
    assert service.restart_gateway(gateway, events) == 0.0 and gateway.running
    assert events.added == [("gateway", "gateway not running (exit code 1); starting it")]
    gateway.running, gateway.fail = False, PermanentError("port taken")
    before = time.monotonic()
    assert service.restart_gateway(gateway, events) >= before + 5.0
    assert events.added[-1] == ("gateway", "gateway restart failed: port taken")


def _open_deployment(tmp_path):
    """A deployment whose gateway has no keys file (open_on_loopback: true)."""
    return load_deployment(write_models_yaml(tmp_path, "svc", time_limit="01:00:00",
                                             partitions=("a100",),
                                             models=(SimModel("chat", (512, 128), 1),)))


@pytest.mark.parametrize("listen", [None, ""])
def test_no_metrics_listen_starts_no_metrics_server(listen, tmp_path):
    assert service.start_metrics(listen, DaemonMetrics(), _open_deployment(tmp_path)) == (
        None, None)


def test_metrics_server_reports_the_port_it_bound(tmp_path):
    server, address = service.start_metrics("127.0.0.1:0", DaemonMetrics(),
                                            _open_deployment(tmp_path))
    try:
        assert address == f"127.0.0.1:{server.server_port}" and server.server_port > 0
    finally:
        server.shutdown()


def test_a_demand_scrape_while_the_gateway_restarts_is_one_clear_error():
    """Between a gateway's death and its restart it has no address: the scrape says so instead
    of failing on ``None.rstrip`` inside urllib's URL building."""

    class Restarting:
        url = None

    with pytest.raises(ConnectionError, match="not listening"):
        service.gateway_demand(Restarting())  # type: ignore[arg-type]


def test_a_reload_the_gateway_would_refuse_keeps_the_file_in_use(tmp_path):
    """SIGHUP with a file that drops gateway.open_on_loopback (and has no keys file): the
    gateway would not start, so the daemon keeps the old file and says why."""

    class Daemon:
        store = Events()
        reloaded = None

        def reload(self, deployment):
            self.reloaded = deployment

    config = write_models_yaml(tmp_path, "svc", time_limit="01:00:00", partitions=("a100",),
                               models=(SimModel("chat", (512, 128), 1),))
    deployment = load_deployment(config)
    config.write_text(config.read_text().replace(", open_on_loopback: true", ""))
    daemon, gateway = Daemon(), FakeGateway(deployment=deployment)
    gateway.running = True
    assert service.reload(config, daemon, deployment, gateway) is deployment
    assert daemon.reloaded is None and gateway.running
    ((kind, message),) = daemon.store.added
    assert kind == "reload_error" and "gateway.api_keys_file is not set" in message
