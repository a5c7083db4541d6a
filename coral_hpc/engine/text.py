"""Token counting and filler text for the sim engine. Nothing here is a tokenizer or a model.

* **Prompt tokens** are approximated as ``max(1, len(text) // 4)``: about four characters per
  token, OpenAI's rule of thumb for English with BPE tokenizers. A completions prompt given as a
  list of token ids counts exactly (its length).
* **Chat prompts** are counted on a plain rendering of the messages, ``"<role>: <content>\\n"``
  per message (text parts of multi-part contents joined), standing in for a chat template.
* **Output** is deterministic filler: ``max_tokens`` words drawn from a tiny vocabulary by a
  random generator seeded with a hash of the prompt, each word one token. The same prompt always
  gets the same text; it carries no meaning and says so (``sim`` is the first word).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

#: Words the filler draws from. Each one is one output token.
_VOCAB = ("sim ", "token ", "filler ", "coral ", "text ", "not ", "inference ", "output ")

#: Characters per token of the prompt-length approximation.
CHARS_PER_TOKEN = 4


def count_text_tokens(text: str) -> int:
    """Approximate token count of ``text``: ``max(1, len(text) // 4)``."""
    return max(1, len(text) // CHARS_PER_TOKEN)


def render_chat(messages: list[dict[str, Any]]) -> str:
    """Flatten chat messages to the text whose length stands for the prompt.

    Raises TypeError naming the message that is not an object with a string ``role`` and a string
    or list-of-parts ``content``.
    """
    lines: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise TypeError(f"messages[{i}] must be an object with a string 'role'")
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise TypeError(f"messages[{i}].content[{j}] must be an object")
                if part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
            text = "".join(parts)
        else:
            raise TypeError(f"messages[{i}].content must be a string or a list of parts")
        lines.append(f"{message['role']}: {text}\n")
    return "".join(lines)


class Filler:
    """Deterministic output words for one prompt."""

    def __init__(self, seed_text: str):
        digest = hashlib.sha256(seed_text.encode("utf-8", "surrogatepass")).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))
        self._count = 0

    def next_token(self) -> str:
        """The next word; the first is always ``"sim "`` so no reader mistakes it for a model."""
        self._count += 1
        if self._count == 1:
            return _VOCAB[0]
        return self._rng.choice(_VOCAB)
