"""The sim engine's continuous-batching scheduler: pure bookkeeping, no clock, no asyncio.

Policy (a simplified vLLM V1 scheduler, first come first served):

* **KV cache.** Capacity is counted in blocks of ``block_size`` tokens, like vLLM's paged cache.
  A request *reserves* the blocks for its whole sequence (prompt + ``max_tokens``) when it is
  admitted and frees them when it finishes or is aborted. vLLM allocates blocks as the sequence
  grows and preempts when it runs out; reserving up front never preempts, so a request's latency
  only depends on what was admitted before it. The KV usage the sim reports is these reservations.
* **Waiting queue.** Requests are admitted strictly in arrival order; when the head does not fit
  (KV blocks or ``max_num_seqs``) nobody behind it is admitted (no overtaking).
* **Steps.** Each step has a budget of ``max_num_batched_tokens`` tokens: every running sequence
  past its prefill decodes one token, the rest of the budget goes to prompt chunks (chunked
  prefill), first to sequences already prefilling, then to newly admitted ones. The step that
  finishes a prompt also samples that sequence's first output token, as in vLLM.
* **Virtual engines.** With ``num_engines`` > 1 (one per pipeline stage, like vLLM's virtual
  engines under pipeline parallelism) each admitted sequence belongs to the engine that admitted
  it; the waiting queue and the KV blocks are shared, and an engine admits no more than its fair
  share (1/S of the unfinished requests) so a burst is spread over the engines. Each engine has at
  most one batch in flight, so a sequence is never in two batches at once.

The async driver (:mod:`coral_hpc.engine.runner`) asks :meth:`Scheduler.schedule` for a batch,
sleeps for the step time the performance model gives, then calls :meth:`Scheduler.complete`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: vLLM's default paged-attention block size (tokens per KV block).
DEFAULT_BLOCK_SIZE = 16


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks needed to hold ``tokens`` tokens."""
    return -(-tokens // block_size)


@dataclass(eq=False)
class Sequence:
    """One request inside the scheduler. Compared by identity."""

    seq_id: str
    prompt_tokens: int
    max_tokens: int
    prefilled: int = 0
    generated: int = 0
    blocks: int = 0
    engine: int | None = None
    finished: bool = False

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be ≥ 1, got {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {self.max_tokens}")

    @property
    def total_tokens(self) -> int:
        """Tokens the whole sequence will hold in the KV cache at its end."""
        return self.prompt_tokens + self.max_tokens

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prompt_tokens


@dataclass(frozen=True)
class Batch:
    """What one engine step processes."""

    engine: int
    decode: tuple[Sequence, ...]
    #: (sequence, prompt tokens processed this step)
    prefill: tuple[tuple[Sequence, int], ...]

    @property
    def decode_seqs(self) -> int:
        return len(self.decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk for _, chunk in self.prefill)

    @property
    def context_tokens(self) -> int:
        """Tokens attention reads this step: every scheduled sequence's context after the step."""
        decode_ctx = sum(s.prefilled + s.generated + 1 for s in self.decode)
        prefill_ctx = sum(s.prefilled + chunk for s, chunk in self.prefill)
        return decode_ctx + prefill_ctx


@dataclass(frozen=True)
class TokenEvent:
    """A sequence produced output token number ``index`` (0-based) in a step."""

    seq: Sequence
    index: int
    finished: bool


@dataclass
class Scheduler:
    """Continuous batching with a KV-capacity limit and a FIFO waiting queue (see module doc)."""

    kv_capacity_tokens: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_engines: int = 1
    _waiting: deque[Sequence] = field(default_factory=deque, init=False, repr=False)
    _running: dict[int, list[Sequence]] = field(default_factory=dict, init=False, repr=False)
    _used_blocks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be ≥ 1")
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(
                f"KV capacity {self.kv_capacity_tokens} tokens is less than one block "
                f"({self.block_size} tokens)"
            )
        if self.max_num_seqs < 1 or self.num_engines < 1:
            raise ValueError("max_num_seqs and num_engines must be ≥ 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be ≥ "
                f"max_num_seqs ({self.max_num_seqs}), as in vLLM"
            )
        self._running = {e: [] for e in range(self.num_engines)}

    # ------------------------------------------------------------------ state
    @property
    def total_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def used_blocks(self) -> int:
        return self._used_blocks

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks reserved, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self._used_blocks / self.total_blocks

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return sum(len(seqs) for seqs in self._running.values())

    @property
    def num_unfinished(self) -> int:
        return self.num_waiting + self.num_running

    def max_sequence_tokens(self) -> int:
        """The longest sequence (prompt + output) the KV cache can ever hold."""
        return self.total_blocks * self.block_size

    def fits(self, total_tokens: int) -> bool:
        """Whether a sequence of ``total_tokens`` can ever be admitted (else it would wait forever)."""
        return blocks_for(total_tokens, self.block_size) <= self.total_blocks

    # ------------------------------------------------------------------ requests
    def add(self, seq: Sequence) -> None:
        """Queue a new request. Raises ValueError when it could never fit the KV cache."""
        if not self.fits(seq.total_tokens):
            raise ValueError(
                f"a sequence of {seq.total_tokens} tokens exceeds the KV cache "
                f"({self.max_sequence_tokens()} tokens)"
            )
        self._waiting.append(seq)

    def abort(self, seq: Sequence) -> bool:
        """Drop a request wherever it is and free its blocks. False when it was already done."""
        if seq.finished:
            return False
        seq.finished = True
        if seq.engine is None:
            try:
                self._waiting.remove(seq)
            except ValueError:
                return False
            return True
        self._release(seq)
        return True

    def _release(self, seq: Sequence) -> None:
        assert seq.engine is not None
        self._running[seq.engine].remove(seq)
        self._used_blocks -= seq.blocks
        seq.blocks = 0

    # ------------------------------------------------------------------ steps
    def schedule(self, engine: int = 0) -> Batch | None:
        """Form the next batch of virtual engine ``engine``; None when it has nothing to do."""
        running = self._running[engine]
        budget = self.max_num_batched_tokens
        decode: list[Sequence] = []
        prefill: list[tuple[Sequence, int]] = []
        for seq in running:
            if budget == 0:
                break
            if not seq.in_prefill:
                decode.append(seq)
                budget -= 1
        for seq in running:
            if budget == 0:
                break
            if seq.in_prefill:
                chunk = min(seq.prompt_tokens - seq.prefilled, budget)
                prefill.append((seq, chunk))
                budget -= chunk
        # Fair share: an engine admits up to its 1/S of all unfinished requests, so a burst is
        # split across the virtual engines and every pipeline stage stays busy.
        share = -(-self.num_unfinished // self.num_engines)
        while (
            budget > 0
            and self._waiting
            and self.num_running < self.max_num_seqs
            and len(running) < share
        ):
            head = self._waiting[0]
            need = blocks_for(head.total_tokens, self.block_size)
            if self._used_blocks + need > self.total_blocks:
                break  # FCFS: nobody overtakes the head
            self._waiting.popleft()
            head.engine, head.blocks = engine, need
            self._used_blocks += need
            running.append(head)
            chunk = min(head.prompt_tokens, budget)
            prefill.append((head, chunk))
            budget -= chunk
        if not decode and not prefill:
            return None
        return Batch(engine=engine, decode=tuple(decode), prefill=tuple(prefill))

    def complete(self, batch: Batch) -> list[TokenEvent]:
        """Apply a finished step: advance prefills, emit one token per sampled sequence, free the
        finished ones. Sequences aborted while the step ran are skipped."""
        events: list[TokenEvent] = []
        sampled: list[Sequence] = [s for s in batch.decode if not s.finished]
        for seq, chunk in batch.prefill:
            if seq.finished:
                continue
            seq.prefilled += chunk
            if not seq.in_prefill:
                sampled.append(seq)
        for seq in sampled:
            seq.generated += 1
            done = seq.generated >= seq.max_tokens
            events.append(TokenEvent(seq=seq, index=seq.generated - 1, finished=done))
            if done:
                seq.finished = True
                self._release(seq)
        return events
