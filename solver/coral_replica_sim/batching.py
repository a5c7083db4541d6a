"""The sim engine's continuous-batching scheduler: pure bookkeeping, no clock, no asyncio.

It is the replica simulator's (:mod:`coral_replica_sim`): the planner's capacity model simulates
replicas with it (:mod:`coral_replica_sim.replica`, :mod:`coral_solver.simcap`) and the sim
engine (``coral_hpc.engine``) runs the very same class.

Policy (vLLM's scheduler, simplified; first come first served):

* **KV cache.** Capacity is counted in blocks of ``block_size`` tokens, like vLLM's paged cache.
  Blocks are allocated as a sequence grows (the prompt chunk a step processes, then one token per
  decode step) and freed when it finishes or is aborted, so a running sequence holds its prompt
  plus the tokens generated so far — on average input + output/2, what ``coral_solver.perf``
  assumes.
  When a running sequence needs a block and none is free, the most recently admitted sequence of
  that engine is **preempted** (vLLM's recompute mode): its blocks are freed, it goes back to the
  front of the waiting queue, and when readmitted it prefills its prompt plus what it had generated
  before producing its next token. ``preemptions`` counts them (``vllm:num_preemptions_total``).
* **Waiting queue.** Requests are admitted strictly in arrival order when the blocks for their
  first prompt chunk are free; when the head does not fit (KV blocks or ``max_num_seqs``) nobody
  behind it is admitted (no overtaking). A request whose whole sequence (prompt + ``max_tokens``)
  could never fit the cache is refused at :meth:`Scheduler.add`.
* **Steps.** Each step has a budget of ``max_num_batched_tokens`` tokens: every running sequence
  past its prefill decodes one token, the rest of the budget goes to prompt chunks (chunked
  prefill), first to sequences already prefilling, then to newly admitted ones. The step that
  finishes a prompt also samples that sequence's first output token, as in vLLM.
* **Disaggregated decode.** A sequence whose prompt KV a prefill replica computed
  (``external`` tokens, loaded by the KV connector) is admitted with those tokens in the cache
  and computes only the rest (at least the last prompt token, as vLLM does for its logits).
* **Virtual engines.** With ``num_engines`` > 1 (one per pipeline stage, like vLLM's virtual
  engines under pipeline parallelism) each admitted sequence belongs to the engine that admitted
  it; the waiting queue and the KV blocks are shared, and an engine admits no more than its fair
  share (1/S of the unfinished requests) so a burst is spread over the engines. Each engine has at
  most one batch in flight, so a sequence is never in two batches at once, and an engine only
  preempts its own sequences.

The async driver (``coral_hpc.engine.runner``) asks :meth:`Scheduler.schedule` for a batch,
sleeps for the step time the performance model gives, then calls :meth:`Scheduler.complete`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

#: vLLM's default paged-attention block size (tokens per KV block).
DEFAULT_BLOCK_SIZE = 16


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks needed to hold ``tokens`` tokens."""
    return -(-tokens // block_size)


@dataclass(eq=False)
class Sequence:
    """One request inside the scheduler. Compared by identity.

    ``computed`` tokens have their KV in the cache; the sequence knows ``prompt_tokens +
    generated`` tokens, so each step it processes the difference (a prompt chunk, or the one token
    it just generated) and, once nothing is left, samples its next token.
    """

    seq_id: str
    prompt_tokens: int
    max_tokens: int
    #: prompt tokens whose KV a prefill replica computed (disaggregated decode): admitted with
    #: them already in the cache, as vLLM's KV connector loads them; lost on preemption
    external: int = 0
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    engine: int | None = None
    admitted: bool = False
    finished: bool = False

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be ≥ 1, got {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {self.max_tokens}")
        if not 0 <= self.external < self.prompt_tokens:
            # as vLLM, the last prompt token is always computed here: it yields the first logits
            raise ValueError(f"external tokens must be in 0..{self.prompt_tokens - 1}, "
                             f"got {self.external}")

    @property
    def total_tokens(self) -> int:
        """Tokens the whole sequence will hold in the KV cache at its end."""
        return self.prompt_tokens + self.max_tokens

    @property
    def pending(self) -> int:
        """Tokens known but not yet in the KV cache."""
        return self.prompt_tokens + self.generated - self.computed

    @property
    def decoding(self) -> bool:
        """Past its (re)prefill: only the token it just generated is left to process."""
        return self.generated >= 1 and self.pending == 1


class Batch(NamedTuple):
    """What one engine step processes. (A named tuple: one is made every step, and a frozen
    dataclass's construction costs several times a tuple's.)"""

    engine: int
    decode: tuple[Sequence, ...]
    #: (sequence, prompt tokens processed this step)
    prefill: tuple[tuple[Sequence, int], ...]
    #: sequences admitted for the first time by this step (their queueing ends here)
    admitted: tuple[Sequence, ...] = ()
    #: context tokens attention reads this step, fixed when the batch is formed
    context_tokens: int = 0

    @property
    def decode_seqs(self) -> int:
        return len(self.decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk for _, chunk in self.prefill)


@dataclass(slots=True)
class TokenEvent:
    """A sequence produced output token number ``index`` (0-based) in a step. (Not frozen: one
    is made for every token simulated, and a frozen dataclass's construction costs several
    times a plain one's; nobody changes it.)"""

    seq: Sequence
    index: int
    finished: bool


@dataclass
class Scheduler:
    """Continuous batching with a paged KV cache, preemption and a FIFO queue (see module doc)."""

    kv_capacity_tokens: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_engines: int = 1
    preemptions: int = field(default=0, init=False)
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
    def free_blocks(self) -> int:
        return self.total_blocks - self._used_blocks

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
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
        """Whether a sequence of ``total_tokens`` fits the cache alone (else it could never end)."""
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
        self._free(seq)
        seq.engine = None

    def _free(self, seq: Sequence) -> None:
        self._used_blocks -= seq.blocks
        seq.blocks = 0

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Allocate blocks so ``seq`` holds ``tokens`` tokens; False when too few are free."""
        need = blocks_for(tokens, self.block_size) - seq.blocks
        if need > self.free_blocks:
            return False
        if need > 0:
            seq.blocks += need
            self._used_blocks += need
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-mode preemption: drop its KV, send it back to the head of the queue."""
        self._release(seq)
        seq.computed = 0
        seq.external = 0  # its loaded KV is gone with its blocks: recompute it all
        self._waiting.appendleft(seq)
        self.preemptions += 1

    # ------------------------------------------------------------------ steps
    def schedule(self, engine: int = 0) -> Batch | None:
        """Form the next batch of virtual engine ``engine``; None when it has nothing to do."""
        running = self._running[engine]
        decode, prefill, budget = self._step_running(engine, running)
        admitted: list[Sequence] = []
        # fair share: an engine admits up to 1/S of the unfinished requests, so a burst is split
        # across the virtual engines and every pipeline stage stays busy
        share = -(-self.num_unfinished // self.num_engines)
        while (
            budget > 0
            and self._waiting
            and self.num_running < self.max_num_seqs
            and len(running) < share
        ):
            head = self._waiting[0]
            loaded = head.external  # KV from a prefill replica: in the cache on admission
            chunk = min(head.pending - loaded, budget)
            if not self._grow(head, loaded + chunk):
                break  # FCFS: nobody overtakes the head
            head.computed = loaded
            self._waiting.popleft()
            head.engine = engine
            running.append(head)
            if not head.admitted:
                head.admitted = True
                admitted.append(head)
            prefill.append((head, chunk))
            budget -= chunk
        if not decode and not prefill:
            return None
        context = sum(s.computed + 1 for s in decode) + sum(s.computed + c for s, c in prefill)
        return Batch(engine, tuple(decode), tuple(prefill), tuple(admitted), context)

    def _step_running(self, engine: int, running: list[Sequence]
                      ) -> tuple[list[Sequence], list[tuple[Sequence, int]], int]:
        """The running sequences' share of the next batch: decodes first (they hold the TPOT),
        then prompt chunks, each in admission order, within the token budget; returns the
        decodes, the chunks and the budget left. (Run once per step for every running sequence:
        ``pending`` and ``decoding`` are spelled out, a sequence whose blocks already hold its
        next tokens skips :meth:`_make_room`, which would change nothing for it, and the set of
        scheduled sequences is built only when a preemption needs it: each pass visits a
        sequence once, and one the decode pass took is still decoding, so the chunk pass skips
        it.)"""
        budget = self.max_num_batched_tokens
        block = self.block_size
        decode: list[Sequence] = []
        prefill: list[tuple[Sequence, int]] = []
        for want_decode in (True, False):
            for seq in list(running):
                if budget == 0:
                    break
                if seq.finished:
                    continue
                pending = seq.prompt_tokens + seq.generated - seq.computed
                if (seq.generated >= 1 and pending == 1) != want_decode:
                    continue
                if seq.engine != engine:
                    continue  # preempted by an earlier pass of this loop
                chunk = min(pending, budget)
                tokens = seq.computed + chunk
                if -(-tokens // block) > seq.blocks and not self._make_room(
                        running, seq, tokens,
                        {id(s) for s in decode} | {id(s) for s, _ in prefill}):
                    continue  # it was the one preempted
                if want_decode:
                    decode.append(seq)
                else:
                    prefill.append((seq, chunk))
                budget -= chunk
        return decode, prefill, budget

    def _make_room(
        self, running: list[Sequence], seq: Sequence, tokens: int, scheduled: set[int]
    ) -> bool:
        """Grow ``seq`` to ``tokens``, preempting this engine's latest unscheduled sequences as
        needed; False when ``seq`` itself had to be preempted."""
        while not self._grow(seq, tokens):
            victims = [s for s in running if id(s) not in scheduled and s is not seq]
            victim = victims[-1] if victims else seq
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def complete(self, batch: Batch) -> list[TokenEvent]:
        """Apply a finished step: advance the processed tokens, emit one token per sequence that
        caught up, free the finished ones. Sequences aborted while the step ran are skipped."""
        events: list[TokenEvent] = []
        work = [(s, 1) for s in batch.decode]
        work.extend(batch.prefill)
        for seq, chunk in work:
            if seq.finished:
                continue
            seq.computed += chunk
            if seq.prompt_tokens + seq.generated != seq.computed:
                continue  # more of the prompt to go (``pending``, spelled out: once a token)
            seq.generated += 1
            done = seq.generated >= seq.max_tokens
            events.append(TokenEvent(seq, seq.generated - 1, done))
            if done:
                seq.finished = True
                self._release(seq)
        return events
