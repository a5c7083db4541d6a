"""Does a prompt stall the whole pipeline ring? Measured on the real engine with stages on cores
of their own (issue 13, items 1 and 4).

bench/paper_pp.py fitted the PP accounting of prompts to ``coral-hpc profile`` runs whose pipeline
stages were Slurm jobs on the one 2-core host, each free to use both cores: the stages were not
parallel hardware, so they could not show what a GPU pipeline does. Here one vLLM process group
serves PP 2 with ``VLLM_CPU_OMP_THREADS_BIND=0|1`` (one core per stage: two parallel "devices"), and
for comparison PP 1 on one core, PP 1 on both, and PP 2 with both stages on both cores (as the
profile runs had them). Each layout gets, from a closed loop of ``--streams`` streaming requests
(short prompts, long outputs, ``ignore_eos``):

* **phase A, decode only**: the median gap between a stream's tokens — one round of the pipeline;
* **phase B, prompts injected**: the same streams, plus one ``--prompt-tokens`` prompt
  (``max_tokens`` 1) every ``--prompt-every-s``. The streams' tokens per second drop; the time they
  lose per injected prompt is ``(gaps B - gaps A)`` summed over a stream, divided by the prompts
  injected meanwhile.

What the accountings predict for S stages, a prompt costing P on one stage (P_1core ~ S x P on
the whole model on one core): "a prompt stalls the ring" (every micro-batch waits behind the
prompt's micro-batch at every stage) — each stream loses S x P per prompt, as much as PP 1 on one
core loses (ratio 1); "each stage pays its own micro-batch's prompts" — P, half of it at S = 2
(ratio 0.5). The ratio ``lost per prompt, PP 2 pinned ÷ PP 1 on one core`` decides.

Runs vLLM directly (no Slurm job: the question is the engine's scheduling, not the launch path),
one layout at a time, on the engine venv of ``scripts/vllm-cpu-env`` and the generated tiny-llama
(``scripts/make-test-models``). It is a timing measurement on the shared host: take both locks,
in this order::

    flock /tmp/coral-slurm.lock flock /tmp/coral-bench.lock .venv/bin/python bench/pp_ring.py

Writes bench/results/pp_ring.{md,json} (merging layouts measured in earlier runs with
``--layouts``), with the load average before and after each layout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and its queue.py (bench/queue.py) would
# shadow the standard library's queue, which httpx's async backend imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import httpx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results"
VENV = Path(os.environ.get("CORAL_VLLM_VENV", "/var/cache/coral-hpc/vllm-cpu"))
MODEL = Path("/var/cache/coral-hpc/test-models/coral-tiny-llama")

#: name -> (pipeline stages, VLLM_CPU_OMP_THREADS_BIND, VLLM_PP_LAYER_PARTITION or None); no
#: name holds a comma: ``--layouts`` is comma-separated (the uneven split 3,1 is named 3+1)
LAYOUTS = {
    "pp1-1core": (1, "0", None),
    "pp2-pinned": (2, "0|1", None),
    "pp1-2cores": (1, "0-1", None),
    "pp2-shared": (2, "0-1|0-1", None),
    "pp2-pinned-3+1": (2, "0|1", "3,1"),
}


@dataclass
class Phase:
    """Token gaps of the streams over one phase."""

    seconds: float
    gaps_s: list[float] = field(default_factory=list)
    stream_tokens: int = 0
    prompts: int = 0
    prompt_ttft_s: list[float] = field(default_factory=list)
    #: per stream request that began and ended in this phase: (last - first chunk) / (tokens - 1)
    #: with the tokens from the final usage (a chunk may carry several tokens when the server
    #: falls behind, so chunk gaps alone undercount: at PP 1 their median was 0.01 ms)
    tpots_s: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        gaps = sorted(self.gaps_s)
        return {
            "requests": len(self.tpots_s),
            "tpot_mean_ms": 1e3 * statistics.fmean(self.tpots_s) if self.tpots_s else None,
            "tpot_median_ms": 1e3 * statistics.median(self.tpots_s) if self.tpots_s else None,
            "seconds": self.seconds,
            "stream_tokens": self.stream_tokens,
            "tokens_per_s": self.stream_tokens / self.seconds,
            "gap_median_ms": 1e3 * statistics.median(gaps) if gaps else None,
            "gap_mean_ms": 1e3 * statistics.fmean(gaps) if gaps else None,
            "gap_p90_ms": 1e3 * gaps[int(0.9 * (len(gaps) - 1))] if gaps else None,
            "prompts": self.prompts,
            "prompt_ttft_median_ms": (1e3 * statistics.median(self.prompt_ttft_s)
                                      if self.prompt_ttft_s else None),
        }


def loadavg() -> float:
    return os.getloadavg()[0]


def run_delay_s(pgid: int) -> float:
    """Seconds the engine's threads (every process of its session) have waited on a run queue
    (the second field of /proc/PID/task/TID/schedstat): the CPU contention its steps met."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return total / 1e9


def start_engine(pp: int, bind: str, split: str | None, port: int, log: Path
                 ) -> subprocess.Popen:
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=bind, VLLM_CPU_KVCACHE_SPACE="1")
    if split:
        env["VLLM_PP_LAYER_PARTITION"] = split
    argv = [str(VENV / "bin/vllm"), "serve", str(MODEL), "--served-model-name", "tiny",
            "--port", str(port), "--host", "127.0.0.1", "--max-model-len", "512",
            "--dtype", "bfloat16", "--pipeline-parallel-size", str(pp)]
    # no --disable-log-requests: vLLM 0.32 rejects it (requests are not logged by default)
    with log.open("w") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop_engine(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    async with httpx.AsyncClient() as client:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"engine exited with {proc.returncode}")
            try:
                if (await client.get(url + "/health", timeout=2)).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1)
    raise RuntimeError(f"engine not healthy within {timeout} s")


def token_ids(n: int, salt: int) -> list[int]:
    """n prompt token ids of the 512-token vocabulary, different per request (no prefix cache)."""
    return [10 + (salt * 7919 + i * 31) % 480 for i in range(n)]


async def stream_loop(client: httpx.AsyncClient, url: str, stop_at: float, phase_of,
                      salt: list[int], args) -> None:
    """One closed-loop client: streams a request, records its token gaps, starts the next."""
    while time.monotonic() < stop_at:
        salt[0] += 1
        body = {"model": "tiny", "prompt": token_ids(args.stream_prompt, salt[0]),
                "max_tokens": args.stream_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0}
        last = first = None
        tokens = 0
        async with client.stream("POST", url + "/v1/completions", json=body,
                                 timeout=120) as resp:
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
                if not chunk.get("choices"):
                    continue
                now = time.monotonic()
                first = now if first is None else first
                phase = phase_of(now)
                if last is not None and phase is not None and phase_of(last) is phase:
                    phase.gaps_s.append(now - last)
                    phase.stream_tokens += 1
                last = now
                if now >= stop_at:
                    break
        if first is not None and tokens > 1 and phase_of(first) is not None \
                and phase_of(first) is phase_of(last):
            phase_of(first).tpots_s.append((last - first) / (tokens - 1))


async def prompt_loop(client: httpx.AsyncClient, url: str, phase: Phase, start: float,
                      args) -> None:
    """Injects one long prompt (one output token) every ``prompt_every_s`` during phase B."""
    k = 0
    tasks = []

    async def one(salt: int) -> None:
        t0 = time.monotonic()
        body = {"model": "tiny", "prompt": token_ids(args.prompt_tokens, 10**6 + salt),
                "max_tokens": 1, "temperature": 0}
        resp = await client.post(url + "/v1/completions", json=body, timeout=120)
        resp.raise_for_status()
        phase.prompt_ttft_s.append(time.monotonic() - t0)

    while True:
        at = start + k * args.prompt_every_s
        if at >= start + phase.seconds:
            break
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        phase.prompts += 1
        tasks.append(asyncio.create_task(one(k)))
        k += 1
    await asyncio.gather(*tasks)


async def measure(url: str, args, pgid: int | None = None) -> dict:
    warm = 5.0
    t0 = time.monotonic()
    a = Phase(args.phase_s)
    b = Phase(args.phase_s)
    a_start, b_start = t0 + warm, t0 + warm + args.phase_s
    end = b_start + args.phase_s

    def phase_of(t: float) -> Phase | None:
        if a_start <= t < b_start:
            return a
        if b_start <= t < end:
            return b
        return None

    # no keep-alive: a pooled connection the server has just closed fails a request (ReadError)
    limits = httpx.Limits(max_connections=args.streams + 64, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits) as client:
        salt = [0]
        streams = [asyncio.create_task(stream_loop(client, url, end, phase_of, salt, args))
                   for _ in range(args.streams)]
        await asyncio.sleep(max(0.0, a_start - time.monotonic()))
        delay_a0 = run_delay_s(pgid) if pgid else None
        await asyncio.sleep(max(0.0, b_start - time.monotonic()))
        delay_a1 = run_delay_s(pgid) if pgid else None
        await prompt_loop(client, url, b, b_start, args)
        await asyncio.gather(*streams)
    sa, sb = a.summary(), b.summary()
    # Time each stream lost per injected prompt: the tokens it would have made at phase A's
    # pace in phase B's time, minus those it made, times A's gap.
    lost = None
    if sa["tpot_mean_ms"] and sb["tpot_mean_ms"] and b.prompts:
        # a stream's token rate is 1 / TPOT: the share of phase B's time it lost to the prompts
        lost = 1e3 * (1.0 - sa["tpot_mean_ms"] / sb["tpot_mean_ms"]) * args.phase_s / b.prompts
    elif sa["tokens_per_s"] and b.prompts:
        per_stream_a = sa["tokens_per_s"] / args.streams
        per_stream_b = sb["tokens_per_s"] / args.streams
        lost_s_per_s = 1.0 - per_stream_b / per_stream_a  # share of wall time a stream lost
        lost = 1e3 * lost_s_per_s * args.phase_s / b.prompts
    if delay_a0 is not None and delay_a1 is not None and a.stream_tokens:
        # engine steps in phase A ~ tokens per stream (every stream gets one token a round)
        steps = a.stream_tokens / args.streams
        sa["run_queue_wait_ms_per_round"] = 1e3 * (delay_a1 - delay_a0) / steps
    return {"decode_only": sa, "with_prompts": sb, "lost_ms_per_prompt": lost}


def run_layout(name: str, args, log_dir: Path) -> dict:
    pp, bind, split = LAYOUTS[name]
    port = args.port
    load_before = loadavg()
    proc = start_engine(pp, bind, split, port, log_dir / f"{name}.log")
    try:
        url = f"http://127.0.0.1:{port}"
        ready_s = asyncio.run(wait_ready(url, proc, args.start_timeout_s))
        result = asyncio.run(measure(url, args, proc.pid))
    finally:
        stop_engine(proc)
    result.update(layout=name, pp=pp, omp_bind=bind, split=split or "even",
                  ready_s=round(ready_s, 1), load_before=round(load_before, 2),
                  load_after=round(loadavg(), 2))
    print(json.dumps(result), flush=True)
    return result


def _shows_steps(r: dict) -> bool:
    """Whether a layout's streams measured the engine's steps: tokens not delivered in bursts
    (median TPOT of phase A at least 1 ms) and not sped up by the prompts phase B adds."""
    a, b = r["decode_only"], r["with_prompts"]
    return (a.get("tpot_median_ms") or 0.0) >= 1.0 and b["tokens_per_s"] <= a["tokens_per_s"]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def write(results: dict[str, dict], args) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("streams", "stream_prompt", "stream_tokens",
                                           "prompt_tokens", "prompt_every_s", "phase_s")}
    (RESULTS / "pp_ring.json").write_text(json.dumps({"settings": meta, "layouts": results},
                                                     indent=2) + "\n")
    lines = [
        "# Does a prompt stall the pipeline ring? (bench/pp_ring.py)", "",
        "vLLM 0.32.0's CPU build, coral-tiny-llama (4 layers; PP 2 splits 2,2), one process "
        "group per layout; `VLLM_CPU_OMP_THREADS_BIND` places the stages. "
        f"{args.streams} closed-loop streams ({args.stream_prompt}-token prompts, "
        f"{args.stream_tokens} tokens each, ignore_eos); phase B adds one "
        f"{args.prompt_tokens}-token prompt (1 output token) every {args.prompt_every_s} s. "
        f"{args.phase_s:.0f} s per phase. "
        "The host is shared (load average before/after each layout).", "",
        "| layout | stages | split | OMP bind | TPOT mean ms (A) | TPOT mean ms (B) "
        "| requests A/B | prompt TTFT p50 ms | lost per prompt ms "
        "| run-queue wait ms per round (A) | load before/after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in LAYOUTS:
        r = results.get(name)
        if r is None:
            continue
        a, b = r["decode_only"], r["with_prompts"]
        lost = r["lost_ms_per_prompt"]
        bind = r["omp_bind"].replace("|", "\\|")  # a bare | would end the table cell
        lines.append(
            f"| {name} | {r['pp']} | {r.get('split', 'even')} | `{bind}` | "
            f"{_ms(a['tpot_mean_ms'])} | {_ms(b['tpot_mean_ms'])} | "
            f"{a['requests']}/{b['requests']} | "
            f"{b['prompt_ttft_median_ms']:.0f} | {lost:.1f} | "
            f"{a.get('run_queue_wait_ms_per_round', float('nan')):.1f} | "
            f"{r['load_before']}/{r['load_after']} |" if lost is not None else
            f"| {name} | {r['pp']} | {r.get('split', 'even')} | `{bind}` "
            "| — | — | — | — | — | — |")
    one, pinned = results.get("pp1-1core"), results.get("pp2-pinned")
    unusable = [f"{r['layout']}: median TPOT {r['decode_only']['tpot_median_ms']:.2f} ms in A, "
                f"stream tok/s A {r['decode_only']['tokens_per_s']:.0f} → B "
                f"{r['with_prompts']['tokens_per_s']:.0f}"
                for r in (one, pinned) if r and not _shows_steps(r)]
    if unusable:
        lines += ["", "**No verdict: the streams do not show the engine's steps here** — their "
                  "tokens arrive in bursts (a median TPOT under 1 ms, first to last chunk) or "
                  "they went faster with prompts injected, so neither their token gaps nor their "
                  "rates measure what a prompt costs them (" + "; ".join(unusable) + ")."]
    elif one and pinned and one["lost_ms_per_prompt"] and pinned["lost_ms_per_prompt"]:
        ratio = pinned["lost_ms_per_prompt"] / one["lost_ms_per_prompt"]
        verdict = ("closer to the ring stall (1.0)" if abs(ratio - 1.0) < abs(ratio - 0.5)
                   else "closer to own-micro-batch accounting (0.5)")
        lines += ["", f"**Lost per prompt, PP 2 pinned ÷ PP 1 on one core: {ratio:.2f}** — "
                  f"the ring stall predicts 1.0, each stage paying its own micro-batch's "
                  f"prompts 0.5: {verdict}."]
    (RESULTS / "pp_ring.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layouts", default=",".join(LAYOUTS),
                   help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--stream-prompt", type=int, default=16)
    p.add_argument("--stream-tokens", type=int, default=200)
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--prompt-every-s", type=float, default=1.0)
    p.add_argument("--phase-s", type=float, default=25.0)
    p.add_argument("--port", type=int, default=18931)
    p.add_argument("--start-timeout-s", type=float, default=240.0)
    args = p.parse_args(argv)
    names = [n.strip() for n in args.layouts.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        print(f"--layouts: unknown {unknown}; valid: {', '.join(LAYOUTS)}", file=sys.stderr)
        return 2
    if not (VENV / "bin/vllm").exists() or not MODEL.is_dir():
        print(f"needs the engine venv {VENV} (scripts/vllm-cpu-env) and {MODEL} "
              "(scripts/make-test-models)", file=sys.stderr)
        return 2
    old = RESULTS / "pp_ring.json"
    results = json.loads(old.read_text())["layouts"] if old.exists() else {}
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "pp_ring_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        results[name] = run_layout(name, args, log_dir)
        write(results, args)
    print((RESULTS / "pp_ring.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
