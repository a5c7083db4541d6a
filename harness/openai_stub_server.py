"""A minimal OpenAI-shaped replica, run by tests as a real subprocess over real HTTP.

It answers like vLLM's OpenAI server — same JSON shapes, SSE with one token per chunk, an optional
final ``usage`` chunk, ``data: [DONE]`` — with deterministic content (a function of the request), so
an answer fetched through the gateway can be compared byte for byte with one fetched directly.
It also counts what it saw (``GET /stats``): /health probes, requests per path, requests
cancelled by the client going away, and the ``Authorization`` it was given, so tests check the
gateway's behaviour from the replica's side.

    python harness/openai_stub_server.py --name r1 --ready-file /tmp/r1.addr \
        [--token-delay 0.01] [--api-key-file key] [--no-usage]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
from pathlib import Path

from aiohttp import web

CREATED = 1_700_000_000


def _dump(obj: dict) -> bytes:
    # compact like pydantic's model_dump_json (what vLLM sends)
    return json.dumps(obj, separators=(",", ":")).encode()


class Stub:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name
        self.token_delay = args.token_delay
        self.health_delay = args.health_delay
        self.usage = not args.no_usage
        self.fail_status = args.fail_status
        self.break_after = args.break_after
        self.api_key = (Path(args.api_key_file).read_text().strip()
                        if args.api_key_file else None)
        self.stats = {"name": self.name, "pid": os.getpid(), "requests": 0, "by_path": {},
                      "cancelled": 0, "in_flight": 0, "streams_in_flight": 0,
                      "unauthorized": 0, "health": 0}

    def _authorized(self, request: web.Request) -> bool:
        if self.api_key is None:
            return True
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def health(self, request: web.Request) -> web.Response:
        self.stats["health"] += 1  # probes received (counted on arrival, answered or not)
        if self.health_delay:
            await asyncio.sleep(self.health_delay)   # a replica too busy to answer at once
        return web.Response(text="")

    async def stats_handler(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": "stub", "object": "model", "created": CREATED, "owned_by": "stub"}]})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            self.stats["unauthorized"] += 1
            return web.json_response({"error": {"message": "bad replica key"}}, status=401)
        raw = await request.read()
        body = json.loads(raw)
        path = request.path
        self.stats["requests"] += 1
        self.stats["by_path"][path] = self.stats["by_path"].get(path, 0) + 1
        self.stats["in_flight"] += 1
        try:
            if self.fail_status:
                # as real vLLM after a SIGTERM not sent by the daemon: /health still 200
                return web.json_response({"error": {"message": "cannot schedule new futures "
                                                    "after shutdown"}}, status=self.fail_status)
            if path == "/v1/embeddings":
                return self._embeddings(body, raw)
            if body.get("stream"):
                return await self._stream(request, body, raw)
            return await self._complete(body, raw)
        except asyncio.CancelledError:
            self.stats["cancelled"] += 1
            raise
        finally:
            self.stats["in_flight"] -= 1

    @staticmethod
    def _tokens(body: dict, raw: bytes) -> list[str]:
        n = int(body.get("max_tokens") or 16)
        seed = hashlib.sha256(raw).hexdigest()
        return [f" w{seed[i % 60:i % 60 + 4]}{i}" for i in range(n)]

    @staticmethod
    def _prompt_tokens(body: dict) -> int:
        text = json.dumps(body.get("messages") or body.get("prompt") or body.get("input") or "")
        return max(1, len(text) // 4)

    def _embeddings(self, body: dict, raw: bytes) -> web.Response:
        seed = hashlib.sha256(raw).digest()
        vector = [b / 255 for b in seed[:8]]
        answer = {"object": "list", "model": body["model"],
                  "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                  "usage": {"prompt_tokens": self._prompt_tokens(body),
                            "total_tokens": self._prompt_tokens(body)}}
        return web.Response(body=_dump(answer), content_type="application/json")

    async def _complete(self, body: dict, raw: bytes) -> web.Response:
        tokens = self._tokens(body, raw)
        if self.token_delay:
            await asyncio.sleep(self.token_delay * len(tokens))
        text = "".join(tokens)
        chat = "messages" in body
        ident = ("chatcmpl-" if chat else "cmpl-") + hashlib.sha1(raw).hexdigest()[:16]
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": "length"} if chat else
                  {"index": 0, "text": text, "finish_reason": "length"})
        answer = {"id": ident, "object": "chat.completion" if chat else "text_completion",
                  "created": CREATED, "model": body["model"], "choices": [choice],
                  "served_by": self.name}
        if self.usage:
            prompt = self._prompt_tokens(body)
            answer["usage"] = {"prompt_tokens": prompt, "completion_tokens": len(tokens),
                               "total_tokens": prompt + len(tokens)}
        return web.Response(body=_dump(answer), content_type="application/json")

    async def _stream(self, request: web.Request, body: dict, raw: bytes) -> web.StreamResponse:
        tokens = self._tokens(body, raw)
        chat = "messages" in body
        ident = ("chatcmpl-" if chat else "cmpl-") + hashlib.sha1(raw).hexdigest()[:16]
        kind = "chat.completion.chunk" if chat else "text_completion"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        self.stats["streams_in_flight"] += 1

        def chunk(content: str | None, finish: str | None, role: bool = False) -> bytes:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": content}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": content or "", "finish_reason": finish}
            return b"data: " + _dump({"id": ident, "object": kind, "created": CREATED,
                                      "model": body["model"], "choices": [choice]}) + b"\n\n"

        try:
            if chat:
                await response.write(chunk(None, None, role=True))
            for index, token in enumerate(tokens):
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
                if self.break_after and index == self.break_after:
                    assert request.transport is not None
                    request.transport.close()   # dead mid-answer: no [DONE], no clean end
                    return response
                last = index == len(tokens) - 1
                await response.write(chunk(token, "length" if last else None))
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                prompt = self._prompt_tokens(body)
                usage = {"prompt_tokens": prompt, "completion_tokens": len(tokens),
                         "total_tokens": prompt + len(tokens)}
                await response.write(b"data: " + _dump({"id": ident, "object": kind,
                                                        "created": CREATED, "model": body["model"],
                                                        "choices": [], "usage": usage}) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self.stats["cancelled"] += 1
        finally:
            self.stats["streams_in_flight"] -= 1
        return response


async def main(args: argparse.Namespace) -> None:
    stub = Stub(args)
    app = web.Application()
    app.router.add_get("/health", stub.health)
    app.router.add_get("/stats", stub.stats_handler)
    app.router.add_get("/v1/models", stub.models)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        app.router.add_post(path, stub.generate)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        Path(tmp).write_text(f"{args.host}:{port}\n")
        os.replace(tmp, args.ready_file)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per token")
    parser.add_argument("--health-delay", type=float, default=0.0,
                        help="seconds before /health answers")
    parser.add_argument("--api-key-file")
    parser.add_argument("--no-usage", action="store_true", help="omit usage from answers")
    parser.add_argument("--break-after", type=int, default=0,
                        help="close a stream's connection after this many tokens, as a replica "
                             "that dies mid-answer")
    parser.add_argument("--fail-status", type=int, default=0,
                        help="answer every generation request with this status (/health: 200)")
    asyncio.run(main(parser.parse_args()))
