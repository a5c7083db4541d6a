"""The prompts measuring requests send: lists of token ids, so each has exactly the length asked
for whatever the tokenizer."""

from __future__ import annotations

#: token ids the prompts are made of: above the tokenizer's special tokens, below its vocabulary
_PROMPT_IDS = range(16, 480)


def prompt_ids(length: int, salt: int = 0) -> list[int]:
    """A deterministic prompt of exactly ``length`` token ids (``salt`` varies it, so prefix
    caching cannot serve one request from another's cache)."""
    ids = list(_PROMPT_IDS)
    return [ids[(i * 7 + salt * 13 + i // len(ids)) % len(ids)] for i in range(length)]
