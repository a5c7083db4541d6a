"""Counting an answer's tokens (from its ``usage`` when the replica sent one, else estimated from
the text, about 4 characters per token) and charging them: to the key's tokens-per-minute
budget, the Prometheus counters, the demand meter and, for a decode replica, its phase."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from coral_hpc.gateway.metering import DemandMeter, GatewayMetrics
from coral_hpc.gateway.ratelimit import RateLimiter
from coral_hpc.gateway.state import GatewayState

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


class TokenAccounting:
    """Charges every answer's tokens once, wherever they are counted. ``on_decoded(model,
    generated)`` hears a decode replica's output tokens (disaggregated serving's phase meter)."""

    def __init__(self, state: GatewayState, limiter: RateLimiter, metrics: GatewayMetrics,
                 meter: DemandMeter, on_decoded: Callable[[str, int], None]) -> None:
        self.state = state
        self.limiter = limiter
        self.metrics = metrics
        self.meter = meter
        self._on_decoded = on_decoded

    def add(self, model: str, key: str, prompt: int, generated: int, estimated: bool,
            role: str = "both") -> None:
        """Charge ``prompt`` + ``generated`` tokens of ``model`` to ``key``."""
        if self.state.keys is not None:
            self.limiter.spent(key, prompt + generated)
        if role == "decode":
            self._on_decoded(model, generated)
        children = self.metrics.children(model, key)
        children.prompt.inc(prompt)
        children.generated.inc(generated)
        self.meter.record_tokens(model, key, prompt, generated, estimated)
