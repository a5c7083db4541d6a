"""The sim engine as a real process on a real port, driven over HTTP (the official ``openai``
client where it fits): API format, usage counts, auth, metrics, KV queueing, latency against the
performance model, SIGTERM drain, bind failures."""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coral_hpc.engine.runner import CATCH_UP_S
from coral_solver import catalog, perf

_LISTEN_RE = re.compile(r"on http://[^:]+:(\d+)")


class SimServer:
    """A running ``python -m coral_hpc.engine.sim`` process."""

    def __init__(self, proc: subprocess.Popen, port: int, started_s: float, log: list[str]):
        self.proc, self.port, self.started_s, self.log = proc, port, started_s, log
        self.url = f"http://127.0.0.1:{port}"

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0)

    def aclient(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, parsed by prometheus_client, keyed by name{labels}."""
        text = httpx.get(self.url + "/metrics").text
        return _samples(text)

    def stderr_rest(self, timeout: float = 5.0) -> str:
        """The rest of stderr once the process has ended."""
        _, err = self.proc.communicate(timeout=timeout)
        return "".join(self.log) + (err or "")


def _samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _value(samples: dict[str, float], name: str) -> float:
    """The one sample called ``name`` (any labels)."""
    hits = [v for k, v in samples.items() if k.split("{")[0] == name]
    assert len(hits) == 1, f"{name}: {hits}"
    return hits[0]


@contextmanager
def sim(
    *args: str, env: dict[str, str] | None = None, module: str = "coral_hpc.engine.sim"
) -> Iterator[SimServer]:
    """Start the sim on a free port (``--port 0``); stop it (SIGTERM, then kill) at the end."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    log: list[str] = []
    try:
        port = _wait_listening(proc, log, timeout=10)
        while httpx.get(f"http://127.0.0.1:{port}/health").status_code != 200:
            time.sleep(0.01)
        yield SimServer(proc, port, time.monotonic() - t0, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_listening(proc: subprocess.Popen, log: list[str], timeout: float) -> int:
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(max(0.0, deadline - time.monotonic())):
            continue
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        if match := _LISTEN_RE.search(line):
            return int(match.group(1))
    raise AssertionError(f"sim did not report its port; rc={proc.poll()} stderr={''.join(log)!r}")


FAST = ("--sim-speed", "50")
LLAMA8_A100 = ("llama-3.1-8b", "--sim-gpu-types", "a100")


# ---------------------------------------------------------------------- start, identity
def test_starts_under_a_second_and_says_it_is_the_sim():
    """Start-up is timed from Popen to the first 200 on /health. The best of three starts is
    compared, so a busy CI machine's stalls are not charged to the sim (its own cost is about
    0.5 s of CPU: Python, aiohttp, the profiles)."""
    starts = []
    for _ in range(3):
        with sim(*LLAMA8_A100, module="coral_hpc.engine") as s:
            starts.append(s.started_s)
            r = httpx.get(s.url + "/v1/models")
            assert r.headers["X-Coral-Engine"] == "sim"
            assert [m["id"] for m in r.json()["data"]] == ["llama-3.1-8b"]
            assert r.json()["data"][0]["owned_by"] == "coral-sim"
            assert "SIMULATED" in s.log[-1]
    assert min(starts) < 1.0, f"start-up took {starts} s"


# ---------------------------------------------------------------------- OpenAI format, usage
def test_completions_stream_and_usage_through_the_openai_client():
    prompt = "Tell me about Slurm heterogeneous jobs, please." * 3
    expected_prompt = len(prompt) // 4
    with sim(*LLAMA8_A100, "--served-model-name", "m8", *FAST) as s:
        client = s.client()
        chunks = list(
            client.completions.create(
                model="m8", prompt=prompt, max_tokens=7, stream=True,
                stream_options={"include_usage": True},
            )
        )  # fmt: skip
        text_chunks = [c for c in chunks if c.choices]
        assert len(text_chunks) == 7
        assert all(c.system_fingerprint.startswith("coral-sim") for c in chunks)
        assert [c.choices[0].finish_reason for c in text_chunks] == [None] * 6 + ["length"]
        usage = chunks[-1].usage
        assert not chunks[-1].choices
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
            expected_prompt,
            7,
            expected_prompt + 7,
        )
        streamed = "".join(c.choices[0].text for c in text_chunks)

        full = client.completions.create(model="m8", prompt=prompt, max_tokens=7)
        assert full.choices[0].text == streamed  # same prompt, same filler
        assert len(full.choices[0].text.split()) == 7
        assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (expected_prompt, 7)

        ids = client.completions.create(model="m8", prompt=[1, 2, 3, 4, 5], max_tokens=2)
        assert ids.usage.prompt_tokens == 5  # token ids count exactly

        ignore = client.completions.create(
            model="m8", prompt="x", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert ignore.usage.completion_tokens == 4


def test_chat_stream_and_usage_through_the_openai_client():
    messages = [{"role": "system", "content": "short"}, {"role": "user", "content": "hi " * 40}]
    expected_prompt = len("system: short\nuser: " + "hi " * 40 + "\n") // 4
    with sim(*LLAMA8_A100, *FAST) as s:
        client = s.client()
        chunks = list(
            client.chat.completions.create(
                model="llama-3.1-8b", messages=messages, max_tokens=5, stream=True,
                stream_options={"include_usage": True},
            )
        )  # fmt: skip
        assert chunks[0].choices[0].delta.role == "assistant"
        content = [c for c in chunks[1:] if c.choices and c.choices[0].delta.content]
        assert len(content) == 5
        assert content[-1].choices[0].finish_reason == "length"
        assert chunks[-1].usage.prompt_tokens == expected_prompt
        assert chunks[-1].usage.completion_tokens == 5

        full = client.chat.completions.create(
            model="llama-3.1-8b", messages=messages, max_completion_tokens=6
        )
        assert full.choices[0].message.role == "assistant"
        assert len(full.choices[0].message.content.split()) == 6
        assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (expected_prompt, 6)
        assert full.system_fingerprint.startswith("coral-sim")


def test_raw_sse_framing_is_vllms():
    with sim(*LLAMA8_A100, *FAST) as s:
        body = {"prompt": "abcd", "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        raw = httpx.post(s.url + "/v1/completions", json=body).text
        events = raw.split("\n\n")
        assert events[-1] == "" and events[-2] == "data: [DONE]"
        assert all(e.startswith("data: {") for e in events[:-2])
        assert len(events[:-2]) == 4  # three tokens + the usage chunk


def test_bad_requests_answer_like_vllm():
    with sim(*LLAMA8_A100, "--max-model-len", "64", *FAST) as s:
        client = s.client()
        with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
            client.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=2, n=2)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.completions.create(model="other", prompt="x", max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 64"):
            client.completions.create(model="llama-3.1-8b", prompt="x" * 200, max_tokens=50)
        assert httpx.post(s.url + "/v1/completions", content=b"{nope").status_code == 400


# ---------------------------------------------------------------------- auth
def test_api_key_from_environment_guards_v1_only():
    with sim(*LLAMA8_A100, *FAST, env={"VLLM_API_KEY": "s3cret"}) as s:
        body = {"prompt": "hi", "max_tokens": 1}
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 401
        wrong = httpx.post(s.url + "/v1/completions", json=body,
                           headers={"Authorization": "Bearer nope"})  # fmt: skip
        assert wrong.status_code == 401 and wrong.json() == {"error": "Unauthorized"}
        assert httpx.get(s.url + "/v1/models").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            s.client("nope").models.list()
        ok = s.client("s3cret").completions.create(model="llama-3.1-8b", prompt="hi", max_tokens=1)
        assert ok.usage.completion_tokens == 1
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/metrics").status_code == 200
        assert "s3cret" not in " ".join(s.proc.args)  # never in argv


# ---------------------------------------------------------------------- metrics
VLLM_NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
    "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:request_success_total", "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
)  # fmt: skip


def test_metrics_parse_and_count_what_was_served():
    with sim(*LLAMA8_A100, *FAST) as s:
        client = s.client()
        usages = [
            client.completions.create(model="llama-3.1-8b", prompt="p" * (40 * i), max_tokens=i + 2).usage
            for i in range(1, 4)
        ]  # fmt: skip
        m = s.metrics()
        for name in VLLM_NAMES:
            _value(m, name)  # present, exactly once
        assert _value(m, "vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
        assert _value(m, "vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
        assert _value(m, "vllm:request_success_total") == 3
        assert _value(m, "vllm:time_to_first_token_seconds_count") == 3
        # one inter-token gap per token after the first
        assert _value(m, "vllm:inter_token_latency_seconds_count") == sum(
            u.completion_tokens - 1 for u in usages
        )
        assert _value(m, "vllm:num_requests_running") == 0
        assert _value(m, "vllm:kv_cache_usage_perc") == 0
        assert m["coral_sim_info{arch=llama-3.1-8b,gpu_types=a100,layers=32,speed=50.0,tp=1}"] == 1


def test_a_client_that_goes_away_frees_its_place():
    with sim(*LLAMA8_A100, *FAST) as s:
        for stream in (True, False):
            with pytest.raises(httpx.ReadTimeout) if not stream else _nothing():
                body = {"prompt": "x", "max_tokens": 100_000, "stream": stream}
                with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=0.5) as r:
                    for i, _ in enumerate(r.iter_lines()):
                        if i == 10:
                            break  # hang up mid-stream
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = s.metrics()
            if _value(m, "vllm:num_requests_running") == 0:
                break
            time.sleep(0.02)
        assert _value(m, "vllm:num_requests_running") == 0
        assert _value(m, "vllm:kv_cache_usage_perc") == 0
        assert _value(m, "vllm:request_success_total") == 0  # aborted, not finished


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# ---------------------------------------------------------------------- KV limit
def test_requests_beyond_kv_capacity_wait_in_the_queue():
    # gpu-memory-utilization 0.46 leaves a100 (40 GB) a small cache after Llama-3.1-8B's weights.
    arch, gpu = catalog.model_arch("llama-3.1-8b"), catalog.gpu_spec("a100")
    capacity = perf.kv_capacity_tokens(arch, gpu, 1, arch.layers, 0.46)
    blocks = capacity // 16
    assert 40 < blocks < 400, "pick a utilisation that gives a small cache"
    prompt, out = 16 * 20, 32  # a prompt fills 20 blocks; the whole sequence needs 22
    fit = blocks // 20  # at most this many prompts are in the cache at once
    n = 2 * fit + 1

    async def main(s: SimServer) -> tuple[int, float, list]:
        client = s.aclient()
        seen_waiting, peak_usage = 0, 0.0
        tasks = [
            asyncio.create_task(
                client.completions.create(model="llama-3.1-8b", prompt=[7] * prompt, max_tokens=out)
            )
            for _ in range(n)
        ]  # fmt: skip
        async with httpx.AsyncClient() as http:
            while not all(t.done() for t in tasks):
                m = _samples((await http.get(s.url + "/metrics")).text)
                seen_waiting = max(seen_waiting, int(_value(m, "vllm:num_requests_waiting")))
                peak_usage = max(peak_usage, _value(m, "vllm:kv_cache_usage_perc"))
                assert _value(m, "vllm:num_requests_running") <= fit
                await asyncio.sleep(0.01)
        return seen_waiting, peak_usage, [t.result().usage for t in tasks]

    with sim(*LLAMA8_A100, "--gpu-memory-utilization", "0.46", "--sim-speed", "2") as s:
        m = s.metrics()
        assert m[f"vllm:cache_config_info{{block_size=16,num_gpu_blocks={blocks}}}"] == 1
        seen_waiting, peak_usage, usages = asyncio.run(main(s))
        end = s.metrics()
    assert seen_waiting > 0
    assert fit * 20 / blocks <= peak_usage <= 1.0  # the cache was filled, never overfilled
    assert all((u.prompt_tokens, u.completion_tokens) == (prompt, out) for u in usages)
    assert _value(end, "vllm:num_requests_waiting") == 0
    assert _value(end, "vllm:request_success_total") == n
    _value(end, "vllm:num_preemptions_total")  # exported (how many depends on arrival timing)


# ---------------------------------------------------------------------- latency vs perf model
def _measured_tpot(s: SimServer, prompt: int, n: int) -> float:
    stamps = []
    for chunk in s.client().completions.create(
        model=s.model, prompt=[3] * prompt, max_tokens=n, stream=True
    ):
        if chunk.choices:
            stamps.append(time.perf_counter())
    assert len(stamps) == n
    return (stamps[-1] - stamps[0]) / (n - 1)


def _predicted_tpot(
    arch_name: str, stages: list[tuple[str, int]], tp: int, prompt: int, n: int
) -> float:
    """Mean seconds between tokens of a lone request: the sum over stages of perf's step time of
    one decoding sequence; the step that makes output token i+1 reads prompt + i tokens of KV."""
    arch = catalog.model_arch(arch_name)
    total = 0.0
    for i in range(1, n):
        total += sum(
            perf.step_latency_s(arch, catalog.gpu_spec(g), tp, layers, 1, 0, prompt + i)
            for g, layers in stages
        )
    return total / (n - 1)


#: (arch, tp, [(gpu, layers)]) — a fast pair, a slower GPU, a bigger model, a heterogeneous pipeline
LAYOUTS = [
    ("llama-3.1-8b", 1, [("a100", 32)]),
    ("llama-3.1-8b", 1, [("v100-32g", 32)]),
    ("llama-3.1-70b", 4, [("a100-80g", 80)]),
    ("llama-3.1-70b", 4, [("a100-80g", 50), ("a100", 30)]),
]


def test_time_per_output_token_follows_the_performance_model():
    """Tolerance, derived: the sim sleeps for the modelled step, and while a stream is busy each
    step starts when the previous one should have ended (the runner's catch-up), so a wake-up
    lag shorter than ``CATCH_UP_S`` delays one token without moving the next. The mean gap
    between the first and last token then differs from the model's by at most the difference of
    those two tokens' lags over the number of gaps: |measured - perf| <= CATCH_UP_S / (n - 1),
    0.4 ms here (3.5 % of the fastest layout). A model-vs-sim bug (wrong layers, a stage left
    out, TP ignored, context off) moves it by far more."""
    prompt, n = 200, 50
    slack = CATCH_UP_S / (n - 1)
    measured, predicted = [], []
    for arch, tp, stages in LAYOUTS:
        gpus = ",".join(g for g, _ in stages)
        layers = ",".join(str(n_) for _, n_ in stages)
        args = (arch, "-tp", str(tp), "-pp", str(len(stages)), "--sim-gpu-types", gpus,
                "--sim-layers", layers)  # fmt: skip
        with sim(*args) as s:
            s.model = arch
            measured.append(_measured_tpot(s, prompt, n))
        predicted.append(_predicted_tpot(arch, stages, tp, prompt, n))
    for (arch, _, stages), m, p in zip(LAYOUTS, measured, predicted):
        assert abs(m - p) <= slack, f"{arch} on {stages}: measured {m:.5f}s, perf {p:.5f}s"
    # what the planner relies on: a slower GPU or a bigger model gives a longer TPOT, by the
    # ratio perf predicts (within the bounds above)
    assert predicted[1] > predicted[0] and predicted[2] > predicted[0]
    for m, p in zip(measured[1:], predicted[1:]):
        low = (p - slack) / (predicted[0] + slack)
        high = (p + slack) / (predicted[0] - slack)
        assert low <= m / measured[0] <= high


# ---------------------------------------------------------------------- shutdown
def test_sigterm_drains_in_flight_requests_then_exits_0():
    async def main(s: SimServer):
        client = s.aclient()

        async def one():
            stream = await client.completions.create(
                model="llama-3.1-8b", prompt="go", max_tokens=80, stream=True
            )
            return [c async for c in stream]

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        async with httpx.AsyncClient() as http:
            while _value(_samples((await http.get(s.url + "/metrics")).text),
                         "vllm:generation_tokens_total") < 3:  # fmt: skip
                await asyncio.sleep(0.01)
            s.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            refused = await http.post(
                s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}
            )
            health = await http.get(s.url + "/health")
        return refused.status_code, health.status_code, await asyncio.gather(*tasks)

    # 80 steps of ~8 ms at speed 1: the streams are still running when SIGTERM arrives
    with sim(*LLAMA8_A100) as s:
        refused, health, streams = asyncio.run(main(s))
        rc = s.proc.wait(10)
        err = s.stderr_rest()
    assert (refused, health) == (503, 503)
    for chunks in streams:
        assert len(chunks) == 80 and chunks[-1].choices[0].finish_reason == "length"
    assert rc == 0, err
    assert "draining: 3 request(s) in flight" in err


def test_drain_timeout_aborts_what_is_left_and_still_exits_0():
    async def main(s: SimServer):
        stream = await s.aclient().completions.create(
            model="llama-3.1-8b", prompt="go", max_tokens=5000, stream=True
        )
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 2:
                s.proc.send_signal(signal.SIGTERM)
        return chunks

    with sim(*LLAMA8_A100, "--sim-drain-timeout", "0.5") as s:
        t0 = time.monotonic()
        chunks = asyncio.run(main(s))
        rc = s.proc.wait(10)
        took = time.monotonic() - t0
    assert rc == 0
    assert chunks[-1].choices[0].finish_reason == "abort" and len(chunks) < 5000
    assert took < 5, f"drain of 0.5 s took {took:.1f}s"


# ---------------------------------------------------------------------- start-up failures
def test_port_in_use_exits_98_with_a_clear_message():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "coral_hpc.engine.sim", *LLAMA8_A100,
             "--host", "127.0.0.1", "--port", str(port)],
            check=False, capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    assert out.returncode == 98
    assert f"cannot bind 127.0.0.1:{port}" in out.stderr and "in use" in out.stderr


def test_a_layout_that_cannot_hold_the_model_exits_1_like_vllm():
    out = subprocess.run(
        [sys.executable, "-m", "coral_hpc.engine.sim", "llama-3.1-70b", "--sim-gpu-types", "v100",
         "--port", "0"],
        check=False, capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert out.returncode == 1
    assert "No available memory for the cache blocks" in out.stderr
