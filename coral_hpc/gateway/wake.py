"""Wake on request: what the gateway does with a request for a model scaled to zero that has no
READY replica.

1. It signals the daemon: a file named after the model in ``<state_dir>/<deployment>/wake/``
   (the state folder is the service account's alone, mode 0700, like the routing table and the
   keys beside it: only that account can ask for a wake). The daemon looks every half second,
   plans for that model at once and removes the file. Many requests during one wake write the
   file at most once every :data:`RESIGNAL_S`: they share the wake.
2. ``hold`` (the model's ``wake``, or the client's ``Coral-Wake: hold`` header): the request
   waits, re-reading the routing table, until a replica of the model is READY — then it is
   served as any other — or until ``wake_timeout`` passes (503 with Retry-After).
   ``reject`` (or ``Coral-Wake: reject``): 503 at once, ``Retry-After`` the seconds until the
   daemon expects the first replica READY (Slurm's expected start plus the measured start-up
   time, :class:`~coral_hpc.gateway.table.WakeInfo`).
3. A model no partition can ever run is answered 503 at once, saying so, whatever the mode.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Histogram

from coral_hpc.atomic import write_atomic
from coral_hpc.config import Deployment, scale_to_zero
from coral_hpc.gateway.metering import LATENCY_BUCKETS
from coral_hpc.gateway.table import WakeInfo

#: the folder (in a deployment's state folder) the gateway asks the daemon for wakes through
WAKE_DIR_NAME = "wake"
#: a model's wake file is written again after this many seconds while it stays cold (e.g. a
#: daemon restarted meanwhile); requests in between share the wake already asked for
RESIGNAL_S = 5.0
#: how often a held request looks for a READY replica (the gateway's table poll is 0.5 s)
HOLD_POLL_S = 0.25
#: A held stream gets an SSE comment line this often (and one at once, with the 200 head):
#: well inside the 60 s a reverse proxy waits for a byte by default (nginx
#: ``proxy_read_timeout``), so no proxy between client and gateway closes a held stream.
COMMENT_S = 15.0
#: the client header choosing hold or reject for one request
WAKE_HEADER = "coral-wake"
#: Retry-After bounds: at least a second, at most an hour (no client waits longer)
MIN_RETRY_S, MAX_RETRY_S = 1, 3600


def wake_dir(state_path: Path) -> Path:
    """The wake folder of the deployment whose state folder is ``state_path``."""
    return state_path / WAKE_DIR_NAME


@dataclass(frozen=True)
class WakePolicy:
    """One model's wake settings as the gateway applies them."""

    mode: str            #: "hold" or "reject"
    timeout_s: float     #: longest hold


class WakeSignal:
    """Writes wake requests for the daemon; at most one per model per :data:`RESIGNAL_S`."""

    def __init__(self, folder: Path | None, clock: Callable[[], float] = time.monotonic):
        self.folder = folder
        self.clock = clock
        self._sent: dict[str, float] = {}
        self.signals = 0  #: files written (a wake shared by many requests writes one)

    def ask(self, model: str) -> bool:
        """Ask the daemon to wake ``model``; False when asked less than RESIGNAL_S ago."""
        if self.folder is None:
            return False
        now = self.clock()
        last = self._sent.get(model)
        if last is not None and now - last < RESIGNAL_S:
            return False
        self._sent[model] = now
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.folder / model, f"{time.time():.3f}\n")
        self.signals += 1
        return True


def retry_after_s(info: WakeInfo | None, default_s: int, now: float | None = None) -> int:
    """Seconds a client should wait before asking again: until ``ready_by`` when the daemon
    knows it, else the measured start-up time, else ``default_s``; within 1 s .. 1 h."""
    now = time.time() if now is None else now
    if info is None:
        seconds: float = default_s
    elif info.ready_by is not None:
        seconds = info.ready_by - now
    else:
        seconds = info.startup_s or default_s
    return int(min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil(seconds))))


def chosen_mode(policy: WakePolicy, headers: Any) -> str:
    """The request's ``Coral-Wake`` header when it says hold or reject, else the model's mode."""
    asked = (headers.get(WAKE_HEADER) or "").strip().lower()
    return asked if asked in ("hold", "reject") else policy.mode


async def hold(find: Callable[[], Any], timeout_s: float,
               gone: Callable[[], bool] = lambda: False,
               tick: Callable[[], Awaitable[None]] | None = None,
               tick_s: float = COMMENT_S) -> Any:
    """Call ``find`` every :data:`HOLD_POLL_S` until it returns something (a READY replica) or
    ``timeout_s`` passes or ``gone`` says the wake can never succeed; what it found, or None.
    ``tick`` (a held stream's comment line) is awaited at once and every ``tick_s``."""
    began = time.monotonic()
    deadline = began + timeout_s
    next_tick = began
    while True:
        found = find()
        if found is not None or gone():
            return found
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            return None
        if tick is not None and now >= next_tick:
            await tick()
            next_tick = now + tick_s
        await asyncio.sleep(min(HOLD_POLL_S, left))


def pending_wakes(folder: Path) -> dict[str, float]:
    """The daemon's side: model → when its wake was asked for (the file's content, else its
    modification time), for every wake file in ``folder``."""
    out: dict[str, float] = {}
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("."):
            continue  # a temporary file of an atomic write in progress
        path = folder / name
        try:
            text = path.read_text(encoding="utf-8").strip()
            at = float(text) if text else path.stat().st_mtime
        except (OSError, ValueError):
            continue
        out[name] = at
    return out


def clear_wake(folder: Path, model: str) -> None:
    """Remove ``model``'s wake file once the daemon has acted on it."""
    (folder / model).unlink(missing_ok=True)


class WakeMetrics:
    """The gateway's wake counters (in its own registry): wakes asked for, requests held and
    refused, and how long held requests waited."""

    def __init__(self, registry: Any) -> None:
        self.signals = Counter("coral_gateway_wakes", "Wakes the gateway asked the daemon for "
                               "(one per cold model, shared by the requests meanwhile)",
                               ["model"], registry=registry)
        self.held = Counter("coral_gateway_wake_held", "Requests held while their model woke",
                            ["model"], registry=registry)
        self.refused = Counter("coral_gateway_wake_refused", "Requests for a cold or waking "
                               "model answered 503 (reject mode, hold timed out, or impossible)",
                               ["model", "why"], registry=registry)
        self.wait = Histogram("coral_gateway_wake_wait_seconds",
                              "How long held requests waited for a READY replica", ["model"],
                              buckets=LATENCY_BUCKETS + (600, 1800, 3600), registry=registry)


class Waker:
    """The request path's part of scale to zero (see the module doc). ``policies`` names the
    models scaled to zero; ``info`` is the routing table's wake section, replaced on reload."""

    def __init__(self, policies: dict[str, WakePolicy], signal: WakeSignal,
                 metrics: WakeMetrics, default_retry_s: int) -> None:
        self.policies = policies
        self.signal = signal
        self.metrics = metrics
        self.default_retry_s = default_retry_s
        self.info: dict[str, WakeInfo] = {}

    def scaled(self, model: str) -> bool:
        """True when ``model`` is scaled to zero (its requests wake it)."""
        return model in self.policies

    def holds(self, model: str, headers: Any) -> bool:
        """True when a request for ``model`` with ``headers`` would be held (not refused at
        once): what tells a stream to send its head before the hold."""
        info = self.info.get(model)
        return (not (info is not None and info.impossible)
                and chosen_mode(self.policies[model], headers) == "hold")

    async def replica_for(self, model: str, headers: Any, choose: Callable[[], Any],
                          catch_up: Callable[[], None],
                          tick: Callable[[], Awaitable[None]] | None = None,
                          ) -> tuple[Any, tuple[str, str, int] | None]:
        """A READY replica of ``model`` after a wake, or why not: (None, (why, message,
        retry_after_s)). ``choose`` picks a READY replica, ``catch_up`` re-reads the table,
        ``tick`` keeps a held stream alive."""
        policy = self.policies[model]
        info = self.info.get(model)
        if info is not None and info.impossible:
            # no wake asked: it would fail again (a reload of models.yaml tries afresh)
            self.metrics.refused.labels(model, "impossible").inc()
            return None, ("impossible", f"model {model!r} cannot be woken: {info.impossible}", 0)
        if self.signal.ask(model):
            self.metrics.signals.labels(model).inc()
        if chosen_mode(policy, headers) == "reject":
            self.metrics.refused.labels(model, "reject").inc()
            retry = retry_after_s(info, self.default_retry_s)
            state = info.state if info is not None else "cold"
            return None, ("reject", f"model {model!r} is {state}: it is waking now; retry in "
                                    f"about {retry} s", retry)
        self.metrics.held.labels(model).inc()
        began = time.monotonic()

        def find() -> Any:
            catch_up()
            return choose()

        def gone() -> bool:
            found = self.info.get(model)
            return found is not None and bool(found.impossible)

        replica = await hold(find, policy.timeout_s, gone, tick)
        self.metrics.wait.labels(model).observe(time.monotonic() - began)
        if replica is not None:
            return replica, None
        info = self.info.get(model)
        if info is not None and info.impossible:
            self.metrics.refused.labels(model, "impossible").inc()
            return None, ("impossible", f"model {model!r} cannot be woken: {info.impossible}", 0)
        self.metrics.refused.labels(model, "timeout").inc()
        retry = retry_after_s(info, self.default_retry_s)
        return None, ("timeout", f"model {model!r} did not wake within {policy.timeout_s:.0f} s; "
                                 f"retry in about {retry} s", retry)


def wake_policies(deployment: Deployment) -> dict[str, WakePolicy]:
    """The models of ``deployment`` scaled to zero and their wake settings."""
    out = {}
    for model in deployment.models:
        settings = scale_to_zero(model, deployment.policy)
        if settings.enabled:
            out[model.name] = WakePolicy(settings.wake, settings.wake_timeout_s)
    return out
