"""vLLM's OpenAI-compatible HTTP API over the sim engine (aiohttp).

Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (streaming and not),
``/health``, ``/metrics``, ``/version``; an embedding model (``--runner pooling``) answers
``/v1/embeddings`` in place of the two completion routes, as vLLM does. Response bodies, the SSE framing (``data: {json}\\n\\n``
per chunk, a usage chunk with empty ``choices`` when ``stream_options.include_usage``, then
``data: [DONE]\\n\\n``) and error bodies follow vLLM 0.11's OpenAI server.

Never mistaken for inference: every response carries ``X-Coral-Engine: sim``, every completion's
``system_fingerprint`` starts with ``coral-sim``, models are ``owned_by: coral-sim``.

Auth as in vLLM: when an API key is configured (``VLLM_API_KEY``), every ``/v1`` request needs
``Authorization: Bearer <key>`` (401 ``{"error": "Unauthorized"}`` otherwise); ``/health`` and
``/metrics`` stay open. While draining (after SIGTERM) ``/v1`` requests and ``/health`` answer 503.

Request rules: ``n`` (and ``best_of``) must be 1; ``echo`` and ``logprobs`` are not simulated
(400). Every request generates exactly ``max_tokens`` tokens (the sim has no EOS, so
``ignore_eos`` is always in effect and ``finish_reason`` is ``length``); ``max_tokens`` defaults to
``--sim-default-max-tokens``, capped by the context left. Token counts: :mod:`coral_hpc.engine.text`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from coral_hpc.engine.disagg import KvTransfer
from coral_hpc.engine.metrics import FINISHED_REASON, EngineMetrics
from coral_hpc.engine.runner import RequestHandle, SimEngine
from coral_hpc.engine.text import Filler, count_text_tokens, render_chat

ENGINE_HEADER = "X-Coral-Engine"
ENGINE_HEADER_VALUE = "sim"

#: Largest request body accepted (long prompts are long JSON strings).
MAX_BODY_BYTES = 16 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServedModel:
    """What the server presents: names, root model, context limit, fingerprint."""

    names: tuple[str, ...]
    root: str
    max_model_len: int
    default_max_tokens: int
    fingerprint: str


class ApiError(Exception):
    """An OpenAI-style error answer."""

    def __init__(
        self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}  # fmt: skip
        return web.json_response(body, status=self.status)


@dataclass(frozen=True)
class _Job:
    """One validated generation request."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    seed_text: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_params: dict[str, Any] | None = None  # vLLM's kv_transfer_params (disaggregation)


class SimAPI:
    """The aiohttp application of one sim server."""

    def __init__(
        self,
        engine: SimEngine,
        metrics: EngineMetrics,
        served: ServedModel,
        api_key: str | None,
        pooling: bool = False,
        dims: int = 8,
    ):
        self.engine = engine
        #: dimensions of the filler vectors /v1/embeddings answers (the model's hidden size)
        self.dims = dims
        #: an embedding model (vLLM's pooling runner): /v1/embeddings instead of completions
        self.pooling = pooling
        self.metrics = metrics
        self.served = served
        self._api_key = api_key
        self.draining = False
        #: the KV-connector side when started with --kv-transfer-config (set once bound)
        self.kv: KvTransfer | None = None
        self.active = 0  # /v1 requests being answered
        self._idle = asyncio.Event()
        self._idle.set()
        self._created = int(time.time())

    def app(self) -> web.Application:
        """Build the application with its routes and middlewares."""
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY_BYTES)
        app.on_response_prepare.append(_mark_sim)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        # vLLM registers only the routes its runner serves: the others answer 404
        if self.pooling:
            app.router.add_post("/v1/embeddings", self.embeddings)
        else:
            app.router.add_post("/v1/completions", self.completions)
            app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def wait_quiet(self, timeout: float) -> bool:
        """Wait until no /v1 request is being answered; False when ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # ------------------------------------------------------------------ middleware
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1"):
            return await handler(request)
        if self._api_key is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self._api_key}".encode()):
                return web.json_response({"error": "Unauthorized"}, status=401)
        if self.draining:
            return ApiError(503, "server is shutting down", "ServiceUnavailableError").response()
        self.active += 1
        self._idle.clear()
        try:
            return await handler(request)
        except ApiError as err:
            return err.response()
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    # ------------------------------------------------------------------ plain routes
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.draining else 200)

    async def metrics_text(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.served.fingerprint})

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self._created,
                "owned_by": "coral-sim",
                "root": self.served.root,
                "parent": None,
                "max_model_len": self.served.max_model_len,
            }
            for name in self.served.names
        ]
        return web.json_response({"object": "list", "data": data})

    # ------------------------------------------------------------------ generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        return await self._generate(request, self._parse(body, chat=False))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        return await self._generate(request, self._parse(body, chat=True))

    async def embeddings(self, request: web.Request) -> web.Response:
        """``POST /v1/embeddings``: each input is one prompt scheduled whole with the others
        in flight; answered when its forward pass ends (a one-step request of the scheduler,
        so its latency is the performance model's). The vectors are deterministic filler of
        ``hidden`` dimensions, never a real embedding."""
        body = await _json_body(request)
        model = body.get("model") or self.served.names[0]
        if model not in self.served.names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        inputs = _embedding_inputs(body.get("input"))
        for _, tokens in inputs:
            if tokens > self.served.max_model_len:
                raise ApiError(400, f"This model's maximum context length is "
                               f"{self.served.max_model_len} tokens. However, you requested "
                               f"{tokens} tokens in the input for embedding generation. Please "
                               "reduce the length of the input.", param="input")
        handles = []
        try:
            for _, tokens in inputs:
                try:
                    # one step: the prompt's forward pass; the token it "produces" is the answer
                    handles.append(self.engine.submit(tokens, 1, 0, 0.0))
                except ValueError as exc:
                    raise ApiError(400, str(exc)) from None
            for handle in handles:
                while True:
                    event = await handle.events.get()
                    if event is None:
                        raise ApiError(503, "request aborted", "ServiceUnavailableError")
                    if event.finished:
                        break
        finally:
            for handle in handles:
                self.engine.abort(handle)
        data = [{"index": i, "object": "embedding", "embedding": _filler_vector(text, self.dims)}
                for i, (text, _) in enumerate(inputs)]
        prompt = sum(tokens for _, tokens in inputs)
        return web.json_response({
            "id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()),
            "model": model, "data": data,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0},
        })

    def _parse(self, body: dict[str, Any], chat: bool) -> _Job:
        model = body.get("model") or self.served.names[0]
        if model not in self.served.names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        seed_text, prompt_tokens = _prompt(body, chat)
        _refuse_unsupported(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean", param="stream")
        options = body.get("stream_options")
        if options is not None and not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.",
                           param="stream_options")  # fmt: skip
        if options is not None and not isinstance(options, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        options = options or {}
        kv_params = body.get("kv_transfer_params")
        if kv_params is not None and not isinstance(kv_params, dict):
            raise ApiError(400, "'kv_transfer_params' must be an object",
                           param="kv_transfer_params")  # fmt: skip
        return _Job(
            chat=chat,
            model=model,
            prompt_tokens=prompt_tokens,
            max_tokens=self._max_tokens(body, chat, prompt_tokens),
            seed_text=seed_text,
            stream=stream,
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
            kv_params=kv_params,
        )

    def _max_tokens(self, body: dict[str, Any], chat: bool, prompt_tokens: int) -> int:
        """The tokens to generate, checked against the context length as vLLM checks them."""
        max_model_len = self.served.max_model_len
        if prompt_tokens >= max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
                "messages.",
                param="messages" if chat else "prompt",
            )
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = min(self.served.default_max_tokens, max_model_len - prompt_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens!r}.",
                           param="max_tokens")  # fmt: skip
        if prompt_tokens + max_tokens > max_model_len:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {max_model_len} tokens and your request has "
                f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens}).",
                param="max_tokens",
            )
        return max_tokens

    async def _generate(self, request: web.Request, job: _Job) -> web.StreamResponse:
        external, load_s = 0, 0.0
        if self.kv is not None:  # like vLLM, params are ignored without a KV connector
            external, load_s = self.kv.lookup(job.kv_params, job.prompt_tokens)
            self.metrics.on_external_lookup(job.prompt_tokens, external)
        try:
            handle = self.engine.submit(job.prompt_tokens, job.max_tokens, external, load_s)
        except ValueError as exc:  # longer than the KV cache: it could never run
            raise ApiError(400, str(exc)) from None
        try:
            if job.stream:
                return await self._stream(request, job, handle)
            return await self._complete(job, handle)
        finally:
            self.engine.abort(handle)  # no-op when it finished; frees the KV of a gone client

    async def _complete(self, job: _Job, handle: RequestHandle) -> web.Response:
        filler = Filler(job.seed_text)
        words: list[str] = []
        finish = FINISHED_REASON
        while True:
            event = await handle.events.get()
            if event is None:
                finish = "abort"
                break
            words.append(filler.next_token())
            if event.finished:
                break
        text = "".join(words)
        usage = _usage(job.prompt_tokens, len(words))
        rid, created = _request_id(job.chat), int(time.time())
        if job.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}  # fmt: skip
            obj = "text_completion"
        answer = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": job.model,
            "system_fingerprint": self.served.fingerprint,
            "choices": [choice],
            "usage": usage,
        }
        if self.kv is not None and self.kv.is_prefill(job.kv_params) and finish != "abort":
            answer["kv_transfer_params"] = self.kv.handoff(job.prompt_tokens)
        return web.json_response(answer)

    async def _stream(
        self, request: web.Request, job: _Job, handle: RequestHandle
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        filler = Filler(job.seed_text)
        rid, created = _request_id(job.chat), int(time.time())
        obj = "chat.completion.chunk" if job.chat else "text_completion"
        generated = 0

        def chunk(choice: dict[str, Any] | None, usage: dict[str, int] | None = None) -> bytes:
            payload: dict[str, Any] = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": job.model,
                "system_fingerprint": self.served.fingerprint,
                "choices": [] if choice is None else [choice],
            }
            if usage is not None or (job.continuous_usage and choice is not None):
                payload["usage"] = usage or _usage(job.prompt_tokens, generated)
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

        try:
            if job.chat:  # vLLM opens a chat stream with the role
                await response.write(chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}))  # fmt: skip
            while True:
                event = await handle.events.get()
                if event is None:
                    finish: str | None = "abort"
                    text = ""
                else:
                    generated += 1
                    text = filler.next_token()
                    finish = FINISHED_REASON if event.finished else None
                if job.chat:
                    choice = {"index": 0, "delta": {"content": text} if text else {},
                              "logprobs": None, "finish_reason": finish}  # fmt: skip
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                              "stop_reason": None}  # fmt: skip
                await response.write(chunk(choice))
                if finish is not None:
                    break
            if job.include_usage:
                await response.write(chunk(None, _usage(job.prompt_tokens, generated)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away mid-stream; _generate frees its KV blocks
        return response


# ---------------------------------------------------------------------- helpers


async def _mark_sim(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[ENGINE_HEADER] = ENGINE_HEADER_VALUE


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _prompt(body: dict[str, Any], chat: bool) -> tuple[str, int]:
    """The text that seeds the answer and the prompt's token count, from ``messages`` (chat)
    or ``prompt``."""
    if not chat:
        return _completion_prompt(body.get("prompt"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    try:
        seed_text = render_chat(messages)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, str(exc), param="messages") from None
    return seed_text, count_text_tokens(seed_text)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """400 for what the sim engine does not serve: several choices, echo, logprobs."""
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            raise ApiError(400, f"'{key}' must be 1: the sim engine serves one choice", param=key)
    if body.get("echo"):
        raise ApiError(400, "'echo' is not supported by the sim engine", param="echo")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise ApiError(400, "logprobs are not supported by the sim engine", param="logprobs")


def _completion_prompt(prompt: Any) -> tuple[str, int]:
    """(seed text, prompt tokens) of a completions ``prompt``: a string, a list of token ids, or a
    one-element list of either (batches of several prompts are not simulated)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_text_tokens(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return ",".join(map(str, prompt)), len(prompt)
    raise ApiError(
        400,
        "'prompt' must be a string, a list of token ids, or a one-element list of either "
        "(the sim engine serves one prompt per request)",
        param="prompt",
    )


def _embedding_inputs(value: Any) -> list[tuple[str, int]]:
    """(seed text, tokens) per input of ``/v1/embeddings``: a string, a list of strings, a
    list of token ids, or a list of such lists (OpenAI's ``input`` forms)."""
    def one(item: Any) -> tuple[str, int]:
        if isinstance(item, str) and item:
            return item, count_text_tokens(item)
        if (isinstance(item, list) and item
                and all(isinstance(t, int) and not isinstance(t, bool) for t in item)):
            return ",".join(map(str, item)), len(item)
        raise ApiError(400, "'input' must be a non-empty string, a list of token ids, or a "
                            "list of either", param="input")

    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        return [one(v) for v in value]
    return [one(value)]


def _filler_vector(text: str, dims: int) -> list[float]:
    """A deterministic unit vector of ``dims`` numbers derived from ``text`` (filler, as the
    sim's completion text is)."""
    import hashlib
    import math

    raw: list[float] = []
    counter = 0
    while len(raw) < dims:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        raw += [b / 127.5 - 1.0 for b in digest]
        counter += 1
    raw = raw[:dims]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
