"""Per-key request and token limits over the last minute (the key's ``rpm=`` and ``tpm=``).

A sliding window, not a token bucket: a key may send ``rpm`` requests in any 60 seconds, and no
new request once its answers in the last 60 seconds used ``tpm`` tokens (prompt and output, as
the usage the replicas report; a request's own tokens are known only when it is answered, so a
burst of long answers may end above ``tpm`` once, and the key then waits until they age out).
A refused request is not counted. One gateway process keeps the counts in memory: limits hold
per gateway, and start afresh when it restarts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

#: the window both limits count over: "per minute"
WINDOW_S = 60.0


class RateLimiter:
    """Admits a key's requests within its limits and books the tokens its answers used."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, deque[float]] = {}
        self._tokens: dict[str, deque[tuple[float, int]]] = {}
        self._token_sums: dict[str, int] = {}

    def _trim(self, key: str, now: float) -> None:
        start = now - WINDOW_S
        requests = self._requests.get(key)
        while requests and requests[0] <= start:
            requests.popleft()
        tokens = self._tokens.get(key)
        while tokens and tokens[0][0] <= start:
            self._token_sums[key] -= tokens.popleft()[1]

    def admit(self, key: str, rpm: int | None, tpm: int | None) -> tuple[str, float] | None:
        """None when a request of ``key`` may go now (it is counted); else which limit
        (``"rpm"`` or ``"tpm"``) holds it back and the seconds until the window lets it."""
        now = self._clock()
        self._trim(key, now)
        requests = self._requests.setdefault(key, deque())
        if rpm is not None and len(requests) >= rpm:
            return "rpm", requests[0] + WINDOW_S - now
        if tpm is not None and self._token_sums.get(key, 0) >= tpm:
            tokens = self._tokens[key]
            # the earliest time the sum can drop below the limit
            left, wait = self._token_sums[key], 0.0
            for at, count in tokens:
                left -= count
                wait = at + WINDOW_S - now
                if left < tpm:
                    break
            return "tpm", wait
        requests.append(now)
        return None

    def spent(self, key: str, tokens: int) -> None:
        """Book ``tokens`` (prompt and output) that an answer to ``key`` used."""
        if tokens <= 0:
            return
        self._tokens.setdefault(key, deque()).append((self._clock(), tokens))
        self._token_sums[key] = self._token_sums.get(key, 0) + tokens
