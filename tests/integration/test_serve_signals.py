"""``serve`` as a process of its own on the real local cluster (sim engine, rule-based planner of
tests/support/serve_harness.py): SIGHUP reloads models.yaml (a model added is planned,
started and routed; an invalid file is reported and the old one kept); a gateway that dies is
started again and the info file names its new address; SIGTERM leaves replicas running."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from tests.conftest import wait_until
from tests.support.serve_harness import (
    ARCH,
    MODEL,
    ON_A100,
    ServeProcess,
    complete,
    events,
    one_model_yaml,
    ready,
    slot,
    tagged_jobs,
)

pytestmark = pytest.mark.slurm

SECOND = "qwen3-8b-b"


def answered(deployment, model: str):
    """A completion for ``model`` through the gateway the info file names, or None."""
    info = read_info(info_path(deployment))
    if not info or not info.get("gateway"):
        return None
    status, body = complete(info["gateway"], model)
    return body if status == 200 else None


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (any thread of it may have forked them)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def gateway_pid(daemon_pid: int) -> int | None:
    for child in children(daemon_pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gateway" in argv:
            return child
    return None


def test_sighup_reloads_models_yaml(tmp_path, env, cleanup):
    config = one_model_yaml(tmp_path)
    deployment = load_deployment(config)
    cleanup(deployment)
    original = config.read_text()
    serve = ServeProcess.planned(tmp_path, config,
                                  [ON_A100, slot(SECOND, ARCH, "a100", "a100")], env)
    try:
        wait_until(lambda: ready(deployment), 90, f"a READY {MODEL} replica")
        wait_until(lambda: answered(deployment, MODEL), 30, f"a {MODEL} completion")
        info = read_info(info_path(deployment))
        status, _ = complete(info["gateway"], SECOND)
        assert status == 404, "a model that is not configured must be unknown to the gateway"

        # add a second model and reload
        added = original.replace(
            "models:\n",
            f"models:\n  - name: {SECOND}\n    source: Qwen/Qwen3-8B\n    architecture: {ARCH}\n"
            "    mix: {input_tokens: 256, output_tokens: 64}\n    demand: {requests_per_s: 1}\n"
            "    slo: {ttft_s: 2.0, tpot_s: 0.1}\n", 1)
        config.write_text(added)
        serve.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: events(deployment, "reload"), 20, "a reload event")
        wait_until(lambda: [r for r in ready(deployment) if r["model"] == SECOND], 90,
                   f"a READY {SECOND} replica after SIGHUP")
        answer = wait_until(lambda: answered(deployment, SECOND), 30,
                            f"a {SECOND} completion through the restarted gateway")
        assert answer["choices"][0]["text"]

        # an invalid file is reported and the old configuration kept
        config.write_text(added.replace("replan_interval_s: 120", "replan_interval_s: -5"))
        serve.proc.send_signal(signal.SIGHUP)
        (error,) = wait_until(lambda: events(deployment, "reload_error"), 20,
                              "a reload_error event")
        assert "replan_interval_s" in error.message
        assert serve.proc.poll() is None
        assert answered(deployment, SECOND) and answered(deployment, MODEL)
        running = sorted(r["job_id"] for r in ready(deployment))
    finally:
        code = serve.stop()
    assert code == 0
    assert read_info(info_path(deployment)) is None
    # SIGTERM left both replicas running
    assert sorted(j.job_id for j in tagged_jobs(env, deployment)) == running


def test_a_gateway_that_dies_is_restarted_and_the_info_file_follows_it(tmp_path, env, cleanup):
    config = one_model_yaml(tmp_path)
    deployment = load_deployment(config)
    cleanup(deployment)
    serve = ServeProcess.planned(tmp_path, config, [ON_A100], env)
    try:
        wait_until(lambda: ready(deployment), 90, "a READY replica")
        wait_until(lambda: answered(deployment, MODEL), 30, "a completion through the gateway")
        before = read_info(info_path(deployment))["gateway"]
        first = wait_until(lambda: gateway_pid(serve.proc.pid), 10, "the gateway child process")
        os.kill(first, signal.SIGKILL)
        second = wait_until(lambda: (p := gateway_pid(serve.proc.pid)) != first and p, 30,
                            "a new gateway process")
        assert second != first
        wait_until(lambda: [e for e in events(deployment, "gateway") if "starting" in e.message],
                   10, "a gateway restart event")
        # port 0: the new gateway has its own port, and the info file must name it
        after = wait_until(lambda: (read_info(info_path(deployment)) or {}).get("gateway")
                           != before and read_info(info_path(deployment))["gateway"], 30,
                           f"the info file to name the restarted gateway (was {before})")
        status, _ = complete(before, MODEL)
        assert status == 0, "the old address still answers: the info file test proves nothing"
        answer = wait_until(lambda: answered(deployment, MODEL), 30,
                            f"a completion through the restarted gateway at {after}")
        assert answer["choices"][0]["text"]
    finally:
        assert serve.stop() == 0
