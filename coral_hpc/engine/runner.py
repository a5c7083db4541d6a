"""The sim engine's clockwork: runs the scheduler's steps in (scaled) real time on asyncio.

One task per virtual engine (one per pipeline stage, as vLLM does under pipeline parallelism)
loops: ask :class:`~coral_replica_sim.batching.Scheduler` for a batch, book it on the pipeline's
stages (:class:`~coral_replica_sim.replica.PipelineClock`) for the times the performance model
gives, divided by ``speed``, sleep until it leaves the last stage, then hand each produced token to
the request that waits for it.

Timer lag: an event loop wakes a little late (about a millisecond). While an engine stays busy its
next step starts when the previous one *should* have ended, not when the loop woke, so over a
stream the mean time per token equals the model's exactly; lag beyond ``CATCH_UP_S`` (a starved
CPU) is not made up, so a stall never turns into a burst of tokens.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from coral_replica_sim.batching import Batch, Scheduler, Sequence, TokenEvent
from coral_replica_sim.replica import PipelineClock

#: Largest timer lag (seconds) made up by starting the next step in the past.
CATCH_UP_S = 0.02

#: a batch (before its step runs) -> seconds per pipeline stage, e.g. StepModel.batch_times
StageTimes = Callable[[Batch], Seq[float]]


@dataclass(eq=False)
class RequestHandle:
    """A submitted request as its HTTP handler sees it: tokens arrive on ``events``; ``None``
    there means the request was aborted (client gone, or drain timed out)."""

    seq: Sequence
    arrival: float
    events: asyncio.Queue[TokenEvent | None] = field(default_factory=asyncio.Queue)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None


class Observer(Protocol):
    """Receives engine events, e.g. to count them in metrics."""

    def on_admitted(self, handle: RequestHandle, now: float) -> None: ...

    def on_token(self, handle: RequestHandle, event: TokenEvent, now: float) -> None: ...


class SimEngine:
    """Drives a :class:`Scheduler` with step times from ``stage_times`` (see module doc)."""

    def __init__(
        self,
        scheduler: Scheduler,
        stage_times: StageTimes,
        speed: float = 1.0,
        observer: Observer | None = None,
    ):
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.scheduler = scheduler
        self._stage_times = stage_times
        self._speed = speed
        self._observer = observer
        self._clock: PipelineClock | None = None
        self._handles: dict[Sequence, RequestHandle] = {}
        self._loading: dict[Sequence, asyncio.TimerHandle] = {}  # waiting for remote KV
        self._wake: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._next_id = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start one step loop per virtual engine (call inside the running event loop)."""
        engines = self.scheduler.num_engines
        self._wake = [asyncio.Event() for _ in range(engines)]
        self._tasks = [
            asyncio.create_task(self._run(e), name=f"sim-engine-{e}") for e in range(engines)
        ]
        self._clock = None  # created lazily: the stage count comes from the first step

    async def stop(self) -> None:
        """Abort whatever is left and stop the step loops."""
        self.abort_all()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # ------------------------------------------------------------------ requests
    def submit(self, prompt_tokens: int, max_tokens: int, external_tokens: int = 0,
               transfer_s: float = 0.0) -> RequestHandle:
        """Queue a request. Raises ValueError when it could never fit the KV cache.

        ``external_tokens`` of the prompt arrive as KV from a prefill replica, which takes
        ``transfer_s`` (modelled seconds, divided by the speed) before the request can queue,
        as vLLM holds a request until its connector has loaded the remote KV."""
        self._next_id += 1
        seq = Sequence(str(self._next_id), prompt_tokens, max_tokens, external=external_tokens)
        if not self.scheduler.fits(seq.total_tokens):
            self.scheduler.add(seq)  # raises with the scheduler's reason
        loop = asyncio.get_running_loop()
        handle = RequestHandle(seq=seq, arrival=loop.time())
        self._handles[seq] = handle
        self._idle.clear()
        if transfer_s > 0:
            self._loading[seq] = loop.call_later(transfer_s / self._speed, self._enqueue, seq)
        else:
            self._enqueue(seq)
        return handle

    def _enqueue(self, seq: Sequence) -> None:
        self._loading.pop(seq, None)
        self.scheduler.add(seq)
        self._wake_all()

    def abort(self, handle: RequestHandle) -> None:
        """Drop a request (its client went away); frees its KV blocks. No-op once finished."""
        timer = self._loading.pop(handle.seq, None)
        if timer is not None:  # still loading its KV: it never reached the scheduler
            timer.cancel()
            handle.seq.finished = True
            self._handles.pop(handle.seq, None)
            handle.events.put_nowait(None)
            self._after_release()
            return
        if self.scheduler.abort(handle.seq):
            self._handles.pop(handle.seq, None)
            handle.events.put_nowait(None)
            self._after_release()

    def abort_all(self) -> None:
        """Abort every unfinished request."""
        for handle in list(self._handles.values()):
            self.abort(handle)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is waiting or running; False if ``timeout`` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # ------------------------------------------------------------------ internals
    def _wake_all(self) -> None:
        for event in self._wake:
            event.set()

    def _after_release(self) -> None:
        if self.scheduler.num_unfinished == 0 and not self._loading:
            self._idle.set()
        self._wake_all()  # freed KV blocks may let another engine admit

    async def _run(self, engine: int) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake[engine]
        prev_end = -math.inf
        while True:
            wake.clear()
            batch = self.scheduler.schedule(engine)
            if batch is None:
                await wake.wait()
                prev_end = -math.inf  # it was idle: the next step starts when it is formed
                continue
            times = [
                t / self._speed
                for t in self._stage_times(batch)
            ]
            if self._clock is None:
                self._clock = PipelineClock(len(times))
            now = loop.time()
            if self._observer is not None:
                for seq in batch.admitted:
                    if seq in self._handles:
                        self._observer.on_admitted(self._handles[seq], now)
            start = prev_end if now - prev_end <= CATCH_UP_S else now
            end = self._clock.reserve(start, times)
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            prev_end = end
            events = self.scheduler.complete(batch)
            now = loop.time()
            released = False
            for event in events:
                handle = self._handles.get(event.seq)
                if handle is None:
                    continue
                if handle.first_token_at is None:
                    handle.first_token_at = now
                if self._observer is not None:
                    self._observer.on_token(handle, event, now)
                handle.last_token_at = now
                if event.finished:
                    handle.finished_at = now
                    del self._handles[event.seq]
                    released = True
                handle.events.put_nowait(event)
            if released or self.scheduler.num_waiting:
                self._after_release()  # freed or preempted blocks may let another engine admit
