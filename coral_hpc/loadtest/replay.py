"""Open-loop replay of a workload against an OpenAI-compatible endpoint, measuring TTFT and TPOT.

Independent of the rest of coral_hpc: it speaks HTTP to a base URL (the gateway, or one engine)
and nothing else, so the e2e SLO test, ``bench/slo.py`` and the real-engine serve test share it.

Measurement, per request (definitions as vLLM's benchmarks use them):

* every request is a streaming ``POST /v1/chat/completions`` (or ``/v1/completions``) with
  ``stream_options.include_usage`` and ``ignore_eos`` (so a real vLLM also generates exactly
  ``max_tokens``); the prompt is ``prompt_tokens`` four-character words (``"tok "``), which the sim
  engine counts exactly and BPE tokenizers count about one token each;
* **open loop**: request ``i`` is sent at ``start + arrival.at`` whatever happened to the others,
  and its clock starts at that *scheduled* time, so a slow client or server cannot hide queueing
  (no coordinated omission). How late each send really left is kept (``send_lag_s``);
* **TTFT** = first chunk carrying output text − scheduled arrival;
  **TPOT** = (last output chunk − first output chunk) / (completion tokens − 1), the completion
  tokens being the usage chunk's count; a one-token answer has no TPOT and meets any TPOT SLO;
* an **error** is a non-200 answer, a stream that ends without ``[DONE]`` or with an error event,
  a usage count different from ``max_tokens``, a timeout, or a connection failure. Errors count
  against the SLO fraction.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp

from coral_hpc.loadtest.workload import Arrival, Mix, Workload, workload

#: Longest a single request may take before it counts as an error (seconds).
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Slo:
    """A model's latency objectives (seconds)."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class RequestResult:
    """What one request measured."""

    at: float  #: scheduled arrival, seconds after the replay start
    prompt_tokens: int  #: asked (the engine's own count is ``usage_prompt_tokens``)
    max_tokens: int
    send_lag_s: float  #: how late the request actually left its scheduled time
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    usage_prompt_tokens: int | None = None
    missed: str | None = None  #: "ttft"/"tpot" when given up once the SLO was certainly missed

    def within(self, slo: Slo) -> bool:
        """Answered in full, TTFT ≤ SLO and (when defined) TPOT ≤ SLO."""
        if self.missed is not None:
            return False
        if self.error is not None or self.ttft_s is None or self.ttft_s > slo.ttft_s:
            return False
        return self.tpot_s is None or self.tpot_s <= slo.tpot_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class ReplaySummary:
    """Per-model result of a replay."""

    model: str
    slo: Slo
    source: str  #: where the arrivals came from (trace rows or Poisson)
    rate_rps: float  #: offered load
    duration_s: float  #: arrival window
    results: tuple[RequestResult, ...] = field(repr=False)

    @property
    def requests(self) -> int:
        return len(self.results)

    @property
    def errors(self) -> int:
        return sum(r.error is not None for r in self.results)

    @property
    def abandoned(self) -> int:
        """Requests given up once their SLO was certainly missed."""
        return sum(r.missed is not None for r in self.results)

    @property
    def within_slo(self) -> int:
        return sum(r.within(self.slo) for r in self.results)

    @property
    def fraction_within_slo(self) -> float:
        """Fraction of requests meeting both TTFT and TPOT SLOs (errors count as misses)."""
        return self.within_slo / self.requests if self.results else 0.0

    def _values(self, name: str) -> list[float]:
        return [getattr(r, name) for r in self.results
                if r.error is None and getattr(r, name) is not None]

    def quantiles(self, name: str) -> dict[str, float | None]:
        """p50/p90/p99 of ``ttft_s``, ``tpot_s`` or ``e2e_s`` over successful requests."""
        values = self._values(name)
        return {f"p{q}": percentile(values, q) for q in (50, 90, 99)}

    @property
    def max_send_lag_s(self) -> float:
        return max((r.send_lag_s for r in self.results), default=0.0)

    def brief(self) -> str:
        """One line for logs and assertion messages."""
        t, p = self.quantiles("ttft_s"), self.quantiles("tpot_s")

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.0f}"

        first_error = next((r.error for r in self.results if r.error), None)
        return (f"{self.model}: {self.within_slo}/{self.requests} within SLO "
                f"({self.fraction_within_slo:.1%}) at {self.rate_rps:.2f} req/s; "
                f"TTFT p50/p90/p99 {ms(t['p50'])}/{ms(t['p90'])}/{ms(t['p99'])} ms "
                f"(SLO {ms(self.slo.ttft_s)}); "
                f"TPOT {ms(p['p50'])}/{ms(p['p90'])}/{ms(p['p99'])} ms "
                f"(SLO {ms(self.slo.tpot_s)}); errors {self.errors}, abandoned {self.abandoned}"
                + (f" (first: {first_error})" if first_error else "")
                + f"; max send lag {self.max_send_lag_s * 1000:.0f} ms; {self.source}")

    def to_dict(self, with_requests: bool = False) -> dict:
        """JSON-ready figures (per-request rows only when asked)."""
        out = {
            "model": self.model, "slo": asdict(self.slo), "source": self.source,
            "rate_rps": self.rate_rps, "duration_s": self.duration_s,
            "requests": self.requests, "errors": self.errors, "abandoned": self.abandoned,
            "within_slo": self.within_slo,
            "fraction_within_slo": self.fraction_within_slo,
            "ttft_s": self.quantiles("ttft_s"), "tpot_s": self.quantiles("tpot_s"),
            "e2e_s": self.quantiles("e2e_s"), "max_send_lag_s": self.max_send_lag_s,
        }
        if with_requests:
            out["results"] = [asdict(r) for r in self.results]
        return out


def _prompt_text(tokens: int) -> str:
    """Chat content the sim engine counts as ``tokens`` prompt tokens: it counts
    ``len("user: " + content + "\\n") // 4``."""
    return ("tok " * tokens)[: max(0, 4 * tokens - 7)]


def _body(model: str, prompt_tokens: int, max_tokens: int, chat: bool) -> dict:
    body: dict = {"model": model, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True}, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": _prompt_text(prompt_tokens)}]
    else:
        body["prompt"] = ("tok " * prompt_tokens)[: max(1, 4 * prompt_tokens)]
    return body


def _text_of(chunk: dict, chat: bool) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if chat:
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


async def _one(session: aiohttp.ClientSession, url: str, headers: dict, model: str,
               arrival: Arrival, chat: bool, t0: float, give_up: Slo | None) -> RequestResult:
    """Send one request at its scheduled time and time its stream (see the module doc).

    With ``give_up`` the request is abandoned as soon as it has certainly missed that SLO: no
    first token by arrival + TTFT, or (first token + TPOT × (max_tokens − 1)) passed before the
    last token. Its outcome is then known (a miss) without waiting for the rest of the stream.
    """
    loop = asyncio.get_running_loop()
    scheduled = t0 + arrival.at
    lag = await _sleep_until(loop, scheduled)
    base: dict[str, Any] = {"at": arrival.at, "prompt_tokens": arrival.prompt_tokens,
            "max_tokens": arrival.max_tokens, "send_lag_s": lag}
    stream = _Stream()
    status = None

    def deadline() -> float:
        if give_up is None:
            return math.inf
        if stream.first is None:
            return scheduled + give_up.ttft_s
        return stream.first + give_up.tpot_s * max(arrival.max_tokens - 1, 1)

    try:
        async with session.post(url, json=_body(model, arrival.prompt_tokens, arrival.max_tokens,
                                                chat), headers=headers) as resp:
            status = resp.status
            if status != 200:
                text = (await resp.text())[:200]
                return RequestResult(**base, status=status, error=f"HTTP {status}: {text}")
            error = await _read_events(resp, loop, stream, deadline, chat)
            if error == _GAVE_UP:
                first = stream.first
                return RequestResult(**base, status=status, missed=_missed(first),
                                     ttft_s=None if first is None else first - scheduled)
            if error is not None:
                return RequestResult(**base, status=status, error=error)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        return RequestResult(**base, status=status, error=f"{type(exc).__name__}: {exc}"[:200])
    end = loop.time()
    first, last, usage = stream.first, stream.last, stream.usage
    if not stream.done:
        return RequestResult(**base, status=status, error="stream ended without [DONE]")
    if usage is None or first is None or last is None:
        return RequestResult(**base, status=status, error="no usage chunk or no output text")
    return _finished(base, status, usage, first - scheduled, last - first, end - scheduled,
                     arrival.max_tokens)


#: what :func:`_read_events` returns when the request's deadline passed
_GAVE_UP = "gave up"


@dataclass
class _Stream:
    """What one request's event stream has shown so far (loop times)."""

    first: float | None = None
    last: float | None = None
    usage: dict | None = None
    done: bool = False


async def _read_events(resp: aiohttp.ClientResponse, loop: asyncio.AbstractEventLoop,
                       stream: _Stream, deadline: Callable[[], float], chat: bool) -> str | None:
    """Read server-sent events into ``stream`` until ``[DONE]`` or the stream's end (None),
    :data:`_GAVE_UP` once ``deadline()`` passes, or the stream's error message."""
    while True:
        left = deadline() - loop.time()
        try:
            raw = await asyncio.wait_for(resp.content.readline(),
                                         None if math.isinf(left) else max(left, 0.0))
        except asyncio.TimeoutError:
            return _GAVE_UP
        if not raw:
            return None
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            stream.done = True
            return None
        chunk = json.loads(data)
        if "error" in chunk:
            return f"stream error: {str(chunk['error'])[:200]}"
        if _text_of(chunk, chat):
            now = loop.time()
            stream.first = now if stream.first is None else stream.first
            stream.last = now
        if chunk.get("usage"):
            stream.usage = chunk["usage"]


async def _sleep_until(loop: asyncio.AbstractEventLoop, scheduled: float) -> float:
    """Wait for the loop time ``scheduled``; return how late it is then (s, >= 0)."""
    delay = scheduled - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    return max(0.0, loop.time() - scheduled)


def _finished(base: dict[str, Any], status: int | None, usage: dict, ttft_s: float,
              first_to_last_s: float, e2e_s: float, max_tokens: int) -> RequestResult:
    """The result of a stream that ended with [DONE]: an error if it gave other than
    ``max_tokens`` tokens."""
    tokens = int(usage.get("completion_tokens", 0))
    result = RequestResult(
        **base, status=status, ttft_s=ttft_s,
        tpot_s=first_to_last_s / (tokens - 1) if tokens > 1 else None, e2e_s=e2e_s,
        completion_tokens=tokens, usage_prompt_tokens=usage.get("prompt_tokens"),
    )
    if tokens != max_tokens:
        return replace(result, error=f"{tokens} tokens, asked {max_tokens}")
    return result


def _missed(first: float | None) -> str:
    return "ttft" if first is None else "tpot"


@dataclass(frozen=True)
class ReplayJob:
    """One model's share of a replay: its workload and SLO."""

    model: str
    workload: Workload
    slo: Slo


async def replay_jobs(base_url: str, api_key: str | None, jobs: Sequence[ReplayJob],
                      chat: bool = True, timeout_s: float = REQUEST_TIMEOUT_S,
                      give_up_on_miss: bool = False) -> dict[str, ReplaySummary]:
    """Replay every job's arrivals at once, open loop, against ``base_url``; one summary per model.

    All models share one start instant, as their traffic would share the gateway.
    ``give_up_on_miss`` abandons each request once it has certainly missed its SLO (see
    :func:`_one`): the counts stay exact, but abandoned requests stop loading the engine, so the
    requests after them fare *better* than without it. Use it only where a failing result is
    the point (overload), never to pass a check.
    """
    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # every task is scheduled before the first send
        t0 = asyncio.get_running_loop().time() + 0.2
        tasks = {
            job.model: [asyncio.create_task(_one(session, url, headers, job.model, a, chat, t0,
                                                 job.slo if give_up_on_miss else None))
                        for a in job.workload.arrivals]
            for job in jobs
        }
        out = {}
        for job in jobs:
            results = await asyncio.gather(*tasks[job.model])
            out[job.model] = ReplaySummary(job.model, job.slo, job.workload.source,
                                           job.workload.rate_rps, job.workload.duration_s,
                                           tuple(results))
    return out


def replay_against(base_url: str, api_key: str | None, model: str, mix: Mix, rate_rps: float,
                   duration_s: float, slo: Slo, *, start: int = 0,
                   max_model_len: int | None = None, chat: bool = True) -> ReplaySummary:
    """Replay a slice of the Azure conversation trace (Poisson without it) fitted to ``mix`` at
    ``rate_rps`` for ``duration_s`` seconds against ``base_url``; block until every request has
    finished. ``start`` picks the trace row the slice begins at (the Poisson seed otherwise)."""
    load = workload(mix, rate_rps, duration_s, start=start, max_model_len=max_model_len)
    return asyncio.run(replay_jobs(base_url, api_key, [ReplayJob(model, load, slo)], chat))[model]
