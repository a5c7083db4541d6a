"""Waiting on an event, not the clock (tests/conftest.py says why)."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(
    predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.2
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` and the last
    value seen when ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")
