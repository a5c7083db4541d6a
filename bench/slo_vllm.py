"""SLO check on the REAL engine: ``coral-hpc serve examples/vllm-cpu.yaml`` (vLLM's CPU build on
the local cluster), then open-loop Poisson load through the gateway at the demand the plan was
made for (from measured profiles), and at a multiple of it; the fraction of requests within each
model's TTFT and TPOT SLOs. Unlike bench/slo.py (the sim engine, whose latencies are the
planner's own model), nothing here is self-consistent by construction.

    flock /tmp/coral-slurm.lock .venv/bin/python bench/slo_vllm.py \
        [--seconds 30] [--multipliers 1,3]

Writes bench/results/slo_vllm.{json,md}. Run on the 2-core dev machine with other work beside it:
every node of the local cluster is the same two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from coral_hpc.config import load_deployment
from coral_hpc.daemon.process import info_path, read_info
from coral_hpc.profile.measure import prompt_ids
from coral_hpc.store import open_store

CLI = [sys.executable, "-c", "from coral_hpc.cli import main; main()"]


async def one_request(client: httpx.AsyncClient, url: str, model: str, n_in: int, n_out: int,
                      salt: int) -> tuple[float, float] | None:
    body = {"model": model, "prompt": prompt_ids(n_in, salt), "max_tokens": n_out,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                return None
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    last = time.perf_counter()
                    first = first or last
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError:
        return None
    if first is None or tokens < 1:
        return None
    return first - start, (last - first) / max(tokens - 1, 1)


async def load(url: str, model: str, rate: float, seconds: float, n_in: int, n_out: int,
               rng: random.Random) -> list[tuple[float, float] | None]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=512)) as c:
        tasks, t = [], 0.0
        began = time.perf_counter()
        while t < seconds:
            t += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, began + t - time.perf_counter()))
            tasks.append(asyncio.create_task(one_request(c, url, model, n_in, n_out,
                                                         len(tasks))))
        return await asyncio.gather(*tasks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "examples" / "vllm-cpu.yaml"))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--multipliers", default="1,3")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="coral-slo-vllm-"))
    text = Path(args.config).read_text()
    text = re.sub(r"(?m)^deployment: .*$", f"deployment: slovllm{secrets.token_hex(2)}", text)
    text = re.sub(r"(?m)^state_dir: .*$", f"state_dir: {tmp / 'shared'}", text)
    text = re.sub(r"(?m)^db_path: .*$", f"db_path: {tmp / 'coral.db'}", text)
    text = re.sub(r"(?m)^profiles_dir: .*$",
                  f"profiles_dir: {REPO / 'examples' / 'vllm-cpu.profiles'}", text)
    config = tmp / "models.yaml"
    config.write_text(text)
    deployment = load_deployment(config)
    serve = subprocess.Popen([*CLI, "serve", str(config), "--listen", "127.0.0.1:0"], cwd=REPO,
                             stdout=open(tmp / "serve.log", "wb"),  # noqa: SIM115 - lives with serve
                             stderr=subprocess.STDOUT)
    results: dict = {"config": args.config, "seconds": args.seconds, "models": {}}
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            out = subprocess.run([*CLI, "status", str(config), "--json"], capture_output=True,
                                 text=True, check=False, cwd=REPO)
            if out.returncode == 0:
                data = json.loads(out.stdout)
                if all(m["ready_replicas"] >= 1 for m in data["models"]):
                    break
            time.sleep(3)
        else:
            raise SystemExit("not every model READY within 900 s")
        store = open_store(deployment.db_path, readonly=True)
        plan = store.latest_plan()
        store.close()
        url = f"http://{read_info(info_path(deployment))['gateway']}"
        rng = random.Random(7)
        for multiplier in [float(m) for m in args.multipliers.split(",")]:
            for model in deployment.models:
                rate = plan.demand[model.name] * multiplier
                got = asyncio.run(load(url, model.name, rate, args.seconds,
                                       model.mix.input_tokens, model.mix.output_tokens, rng))
                ok = [g for g in got if g and g[0] <= model.slo.ttft_s and g[1] <= model.slo.tpot_s]
                row = {"rate": rate, "requests": len(got), "failed": sum(g is None for g in got),
                       "within_slo": len(ok) / len(got) if got else 0.0}
                results["models"].setdefault(model.name, {})[f"{multiplier:g}x"] = row
                print(model.name, f"{multiplier:g}x", row, flush=True)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        subprocess.run([*CLI, "down", str(config), "--grace", "30"], check=False, cwd=REPO)
    out_dir = REPO / "bench" / "results"
    (out_dir / "slo_vllm.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["# SLO check on the real engine (vLLM CPU build, examples/vllm-cpu.yaml)", "",
             "| model | load | req/s | requests | failed | within TTFT and TPOT |",
             "|---|---|---|---|---|---|"]
    for name, rows in results["models"].items():
        for mult, row in rows.items():
            lines.append(f"| {name} | {mult} | {row['rate']:.2f} | {row['requests']} | "
                         f"{row['failed']} | {row['within_slo']:.1%} |")
    (out_dir / "slo_vllm.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
