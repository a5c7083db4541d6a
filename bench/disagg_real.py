#!/usr/bin/env python3
"""SLO attainment with and without prefill/decode disaggregation, on the REAL engine.

One deployment (examples/vllm-cpu.yaml's tiny-llama on the local cluster, vLLM's CPU build), run
twice by ``coral-hpc serve`` in one go: ``policy.disaggregation: off`` (the plan's aggregated
replica) and ``on`` (its prefill and decode replicas, KV through ExampleConnector under the
shared state_dir). Each time, once the gateway routes to every planned role, Poisson arrivals at
the plan's demand (the declared demand with the policy's headroom), token counts exponential
with the declared mix, are replayed open loop through the gateway (coral_hpc/loadtest/replay.py:
TTFT, TPOT, errors per request), then ``coral-hpc down``.

The mix's prompts (256 tokens on average) span several KV blocks, so the decode replica really
loads KV (ExampleConnector moves whole blocks of the prompt but its last token). The figures are
the real engine's on this 2-core host, beside everything else running here: they compare the two
ways of serving, they are not GPU figures.

Writes bench/results/disagg_real.json and .md. Runs Slurm jobs: take the shared lock.
Usage: flock /tmp/coral-slurm.lock .venv/bin/python bench/disagg_real.py --modes off  (then on)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.loadtest.replay import ReplayJob, Slo, replay_jobs
from coral_hpc.loadtest.workload import Mix, poisson_workload
from coral_hpc.slurm import make_client

CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]
MIX = Mix(input_tokens=256, output_tokens=32)
SLO = Slo(ttft_s=2.0, tpot_s=0.2)
DEMAND_RPS = 0.5  #: declared; the plan adds the policy's headroom
READY_TIMEOUT_S = 420


def _venv_and_models() -> tuple[str, str]:
    venv = subprocess.run([str(REPO / "scripts" / "vllm-cpu-env")], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    made = subprocess.run([f"{venv}/bin/python", str(REPO / "scripts" / "make-test-models")],
                          check=True, capture_output=True, text=True)
    models = made.stdout.strip().splitlines()[-1]
    return venv, models


def _config(folder: Path, mode: str, venv: str, models: str) -> Path:
    text = (REPO / "examples" / "vllm-cpu.yaml").read_text()
    for pattern, value in {
        r"(?m)^deployment: .*$": f"deployment: disaggbench{mode}{secrets.token_hex(2)}",
        r"(?m)^state_dir: .*$": f"state_dir: {folder / 'shared'}",
        r"(?m)^db_path: .*$": f"db_path: {folder / 'daemon' / 'coral.db'}",
        r"(?m)^  poll_interval_s: .*$": "  poll_interval_s: 1",
    }.items():
        text, count = re.subn(pattern, value, text)
        assert count == 1, pattern
    text = text.replace("/var/cache/coral-hpc/vllm-cpu", venv)
    text = text.replace("/var/cache/coral-hpc/test-models", models)
    text = text.replace("engine:\n  kind: vllm\n",
                        "engine:\n  kind: vllm\n  kv_connector: {name: ExampleConnector}\n", 1)
    text = text.replace("policy:\n", f"policy:\n  disaggregation: {mode}\n", 1)
    # one model of our own, whatever the example's models ask for
    text = text[:text.index("\nmodels:\n")] + f"""
models:
  - name: tiny-llama
    source: {models}/coral-tiny-llama
    architecture: coral-tiny-llama
    max_model_len: 512
    mix: {{input_tokens: {MIX.input_tokens}, output_tokens: {MIX.output_tokens}}}
    demand: {{requests_per_s: {DEMAND_RPS}}}
    slo: {{ttft_s: {SLO.ttft_s}, tpot_s: {SLO.tpot_s}}}
"""
    path = folder / "models.yaml"
    path.write_text(text)
    return path


def _status(env: dict, config: Path) -> dict:
    out = subprocess.run([*CLI, "status", str(config), "--json"], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise SystemExit(f"timed out waiting for {what}")


def run_mode(mode: str, window_s: float, venv: str, models: str) -> dict:
    """Serve, replay at the planned demand through the gateway, take down; the figures."""
    folder = Path(tempfile.mkdtemp(prefix=f"disagg-{mode}-"))
    config = _config(folder, mode, venv, models)
    deployment = load_deployment(config)
    env = {**os.environ}
    want = {"both"} if mode == "off" else {"prefill", "decode"}
    log = open(folder / "serve.log", "ab")  # noqa: SIM115 - closed below
    serve = subprocess.Popen([*CLI, "serve", str(config), "--listen", "127.0.0.1:0",
                              "--cache-dir", str(folder / "templates")],
                             cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    began = time.monotonic()
    try:
        def ready():
            if not Path(deployment.db_path).exists():
                return None
            data = _status(env, config)
            roles = {r["role"] for r in data.get("replicas", []) if r["state"] == "READY"}
            return data if roles >= want else None

        data = _wait(ready, READY_TIMEOUT_S, f"READY {sorted(want)} replicas")
        ready_s = time.monotonic() - began
        gateway = "http://" + read_info(info_path(deployment))["gateway"]

        def routed():
            routes = httpx.get(gateway + "/internal/routing", timeout=10).json()["models"]
            return {r["role"] for r in routes.get("tiny-llama", []) if r["healthy"]} >= want

        _wait(routed, 60, "the gateway routing every role")
        demand = next(m["demand"] for m in data["models"] if m["name"] == "tiny-llama")
        load = poisson_workload(MIX, demand, window_s, seed=7, max_model_len=512)
        summary = asyncio.run(replay_jobs(gateway, None, [ReplayJob("tiny-llama", load, SLO)],
                                          chat=False))["tiny-llama"]
        metrics = httpx.get(gateway + "/metrics", timeout=30).text
        phases = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'^coral_gateway_phase_requests_total\{model="tiny-llama",phase="(\w+)"\} (\S+)$',
            metrics, re.MULTILINE)}
        hits = 0.0
        for replica in data["replicas"]:
            if replica["role"] == "decode" and replica["endpoint"]:
                text = httpx.get(replica["endpoint"] + "/metrics", timeout=30).text
                hits += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith("vllm:external_prefix_cache_hits_total"))
        return {
            "mode": mode, "replicas": [{k: r[k] for k in ("role", "template", "job_id")}
                                       for r in data["replicas"] if r["state"] == "READY"],
            "ready_after_s": round(ready_s, 1), "demand_rps": demand,
            "requests": summary.requests, "within_slo": summary.within_slo,
            "fraction_within_slo": summary.fraction_within_slo, "errors": summary.errors,
            "ttft_s": summary.quantiles("ttft_s"), "tpot_s": summary.quantiles("tpot_s"),
            "phase_requests": phases, "decode_external_kv_hit_tokens": hits,
            "brief": summary.brief(),
        }
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
        log.close()
        subprocess.run([*CLI, "down", str(config), "--grace", "30", "--json"], env=env,
                       cwd=REPO, capture_output=True, timeout=240, check=False)
        client = make_client("cli", env=env)
        left = [j.job_id for j in client.snapshot(deployment.deployment).jobs if j.end_kind is None]
        if left:
            client.cancel(left)


def write_md(path: Path, data: dict) -> None:
    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f}"

    lines = [
        "# SLO attainment with and without disaggregation (real engine, local cluster)",
        "",
        (f"`bench/disagg_real.py`, {data['when']}: tiny-llama (vLLM {data['vllm']} CPU build), "
         f"mix {MIX.input_tokens}/{MIX.output_tokens} tokens (exponential), SLO TTFT "
         f"{SLO.ttft_s:g} s / TPOT {SLO.tpot_s:g} s, Poisson arrivals at the plan's demand for "
         f"{data['window_s']:g} s, through the gateway. 2-core host shared with other work: the "
         "figures compare the two modes, they are not GPU figures."),
        "",
        ("| mode | replicas | demand req/s | requests | within SLO | errors | TTFT p50/p90/p99 ms "
         "| TPOT p50/p90/p99 ms | decode KV hits (tokens) |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        t, p = r["ttft_s"], r["tpot_s"]
        lines.append(
            f"| {r['mode']} | {', '.join(x['role'] for x in r['replicas'])} "
            f"| {r['demand_rps']:.2f} "
            f"| {r['requests']} | {r['fraction_within_slo']:.0%} | {r['errors']} "
            f"| {ms(t['p50'])}/{ms(t['p90'])}/{ms(t['p99'])} | {ms(p['p50'])}/{ms(p['p90'])}/"
            f"{ms(p['p99'])} | {r['decode_external_kv_hit_tokens']:g} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0, help="arrival window, seconds")
    parser.add_argument("--modes", default="off,on")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the .md from the last run's .json")
    args = parser.parse_args()
    if args.render_only:
        write_md(args.results / "disagg_real.md",
                 json.loads((args.results / "disagg_real.json").read_text()))
        return 0
    venv, models = _venv_and_models()
    version = subprocess.run([f"{venv}/bin/python", "-c",
                              "import importlib.metadata as m; print(m.version('vllm'))"],
                             capture_output=True, text=True, check=False).stdout.strip()
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / "disagg_real.json"
    for mode in args.modes.split(","):
        # one mode per run keeps each Slurm-locked run short; each run replaces its own entry
        result = run_mode(mode, args.window, venv, models)
        print(mode, result["brief"])
        old = json.loads(path.read_text()) if path.exists() else {"runs": []}
        runs = [r for r in old["runs"] if r["mode"] != mode] + [result]
        data = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "vllm": version,
                "window_s": args.window, "runs": sorted(runs, key=lambda r: r["mode"] != "off")}
        path.write_text(json.dumps(data, indent=1) + "\n")
        write_md(args.results / "disagg_real.md", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
