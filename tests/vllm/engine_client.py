"""Small HTTP helpers for the real-engine tests: completions, chat, streaming, token ids."""

from __future__ import annotations

import json
from typing import Any

import httpx


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def completion(url: str, model: str, prompt: str, max_tokens: int = 16,
               api_key: str | None = None, **extra: Any) -> dict[str, Any]:
    """A temperature-0 completion with the generated token ids."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, **extra}
    response = httpx.post(f"{url}/v1/completions", json=body, headers=_auth(api_key),
                          timeout=300)
    response.raise_for_status()
    return response.json()


def token_ids(answer: dict[str, Any]) -> list[int]:
    choice = answer["choices"][0]
    assert choice.get("token_ids"), f"no token ids in {answer}"
    return list(choice["token_ids"])


def chat(url: str, model: str, content: str, api_key: str | None = None,
         max_tokens: int = 8) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth(api_key),
                      timeout=300)


def streamed_completion(url: str, model: str, prompt: str, max_tokens: int = 12,
                        api_key: str | None = None) -> list[dict[str, Any]]:
    """Every SSE chunk of a streamed completion (``[DONE]`` last, as the string)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    chunks: list[Any] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=_auth(api_key),
                      timeout=300) as response:
        response.raise_for_status()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                chunks.append(data if data == "[DONE]" else json.loads(data))
    return chunks
