"""Counting an answer's tokens: from its ``usage`` when the replica sent one, else estimated from
the text (about 4 characters per token). Pure functions; who is charged is
:class:`~coral_hpc.gateway.forward.TokenAccounting`'s job."""

from __future__ import annotations

import json
import math
from typing import Any

_DECODER = json.JSONDecoder()


def estimate_prompt_tokens(payload: dict[str, Any]) -> int:
    """About 4 characters per token, for answers that carry no ``usage``."""
    chars = 0
    for message in payload.get("messages") or ():
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    for name in ("prompt", "input"):
        value = payload.get(name)
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, list):
            chars += sum(len(v) for v in value if isinstance(v, str))
    return math.ceil(chars / 4)


def usage_counts(usage: Any) -> tuple[int, int] | None:
    """(prompt, generated) of an OpenAI ``usage`` object, or None when it is not one."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    generated = usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(generated, int):
        return None
    return prompt, generated


def count_whole_answer(payload: dict[str, Any], data: bytes) -> tuple[int, int, bool]:
    """The tokens of a whole (not streamed) answer ``data`` to ``payload``:
    (prompt, generated, estimated)."""
    # Fast path: parse only the usage object (answers can be large; usage is small).
    at = data.rfind(b'"usage":')
    if at >= 0:
        try:
            usage, _ = _DECODER.raw_decode(data[at + 8:].decode("utf-8", "replace").lstrip())
        except (ValueError, RecursionError):
            usage = None
        counts = usage_counts(usage)
        if counts is not None:
            return counts[0], counts[1], False
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):
        answer = None
    generated_chars = 0
    if isinstance(answer, dict):
        counts = usage_counts(answer.get("usage"))
        if counts is not None:
            return counts[0], counts[1], False
        generated_chars = _answer_chars(answer)
    return estimate_prompt_tokens(payload), math.ceil(generated_chars / 4), True


def _answer_chars(answer: dict[str, Any]) -> int:
    """Characters of text in an answer's choices (chat ``message.content`` or ``text``)."""
    chars = 0
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            if isinstance(text, str):
                chars += len(text)
    return chars
