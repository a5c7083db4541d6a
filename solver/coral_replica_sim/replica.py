"""One replica of a serving template simulated in virtual time: the layout, its step latencies
and KV capacity from the performance model, the pipeline clock, and the event loop that drives
the continuous-batching scheduler (:mod:`coral_replica_sim.batching`) with them.

This is the project's one replica simulator. The sim engine (``coral_hpc.engine``) runs the
same scheduler, clock and step model against a wall clock; ``coral-hpc simulate`` and the paper
evaluation serve trace samples with :func:`serve`; and Stage 1 rates a template by the highest
Poisson rate at which it keeps its SLO here (:mod:`coral_solver.simcap`). Both may import this
package; it imports neither the planner nor ``coral_hpc`` (see the package docstring).

Pipeline timing, kept simple:

* one step of a batch takes ``stage_times[k]`` on stage ``k`` and visits the stages in order, so
  its **latency** is the *sum* of the stage times;
* a stage works on one batch at a time; with ``S`` virtual engines (vLLM runs one per stage) up to
  ``S`` batches are in flight, so the **throughput** is bounded by the *slowest* stage.
  :class:`PipelineClock` books each batch on each stage in turn to produce exactly that.
* the KV capacity is the smallest of the stages' capacities (each stage holds the KV of its own
  layers for every running sequence, so the tightest stage decides how many tokens fit).

:func:`serve` is what the replica would measure with an infinitely fast CPU and network: one
step loop per pipeline stage, a step booked on every stage in turn, its tokens delivered when
it leaves the last stage. A request may arrive with ``external`` prompt tokens whose KV a
prefill replica computed (the decode role: admitted with them in the cache, as vLLM's KV
connector loads them).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coral_replica_sim.batching import DEFAULT_BLOCK_SIZE, Batch, Scheduler
from coral_replica_sim.batching import Sequence as Seq
from coral_solver import catalog, perf, perf_pooling


@dataclass(frozen=True)
class Layout:
    """What the replica runs: architecture key, TP degree, and per stage its GPU type and layers."""

    arch: str
    tp: int
    gpu_types: tuple[str, ...]
    layers: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.gpu_types) != len(self.layers) or not self.gpu_types:
            raise ValueError(
                f"one GPU type per stage and one layer count per stage: got "
                f"{len(self.gpu_types)} GPU types and {len(self.layers)} layer counts"
            )

    @property
    def stages(self) -> int:
        return len(self.gpu_types)


def default_layer_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """vLLM's default split (``get_pp_indices``): equal shares, the remainder going one layer each
    to the stages before the last, from the second-to-last backwards."""
    if stages < 1 or num_layers < stages:
        raise ValueError(f"cannot split {num_layers} layers over {stages} stages")
    parts = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        parts[-i] += 1
    return tuple(parts)


class StepModel:
    """Per-stage step latency and KV capacity of a :class:`Layout`, from :mod:`coral_solver.perf`.

    Raises ValueError (from the catalog) when the architecture or a GPU type is unknown.
    """

    def __init__(self, layout: Layout, gpu_memory_utilization: float = 0.9):
        self.layout = layout
        self._util = gpu_memory_utilization
        self._arch = catalog.model_arch(layout.arch)
        self._gpus = tuple(catalog.gpu_spec(g) for g in layout.gpu_types)
        # each stage's step function, its coefficients looked up once, at the first step (a
        # simulation takes 10^5 steps; the sim engine's start-up must not wait for the
        # calibration and measured profiles); the same arithmetic as perf.step_latency_s
        self._steps: tuple[Callable[[float, float, float, float], float], ...] = ()
        # a BERT-style encoder's tokens attend to the whole prompt, not half of it, as the
        # planner's pooling capacity charges them (coral_solver.perf_pooling)
        self._self_share = 1.0 if perf_pooling.bidirectional(self._arch) else 0.5

    @property
    def hidden(self) -> int:
        """The architecture's hidden size (an embedding's dimensions)."""
        return int(self._arch.hidden)

    @property
    def num_layers(self) -> int:
        return int(self._arch.layers)

    def stage_times(
        self, decode_seqs: int, prefill_tokens: int, context_tokens: int,
        prefill_ctx: float | None = None,
    ) -> tuple[float, ...]:
        """Seconds each stage spends on one step of this batch; ``prefill_ctx`` as
        :func:`coral_solver.perf.step_latency_s` takes it (None: one chunk from its start)."""
        if not self._steps:
            self._steps = tuple(perf.step_function(self._arch, gpu, self.layout.tp, layers,
                                                   len(self._gpus))
                                for gpu, layers in zip(self._gpus, self.layout.layers))
        ctx = prefill_tokens / 2.0 if prefill_ctx is None else prefill_ctx
        return tuple(step(decode_seqs, prefill_tokens, context_tokens, ctx)
                     for step in self._steps)

    def batch_times(self, batch: Batch) -> tuple[float, ...]:
        """Seconds each stage spends on ``batch``, called before the step runs (the batch's
        sequences still hold their pre-step ``computed``).

        Prompt chunks attend per sequence, as attention kernels do: each chunk's tokens attend
        to its earlier tokens and half of itself, so the batch's ``prefill_ctx`` is
        Σ chunk·(computed + chunk/2) ÷ Σ chunk. Billing k chunks as one long chunk would charge
        them k times their attention (8,192 prompt tokens of gpt-oss-20b on 2xH100: 70.7 ms a
        step instead of 48.6 ms). KV read: decodes read their context and the new token, chunks
        the KV of their earlier chunks."""
        prefill = batch.prefill_tokens
        pairs = sum(chunk * (seq.computed + chunk * self._self_share)
                    for seq, chunk in batch.prefill)
        # the scheduler counted the context with this step's chunks (Batch.context_tokens):
        # taking them off spares a pass over every decode each step; a batch made without it
        # (context_tokens 0) is counted here
        context = batch.context_tokens - prefill if batch.context_tokens else sum(
            s.computed + 1 for s in batch.decode) + sum(s.computed for s, _ in batch.prefill)
        return self.stage_times(batch.decode_seqs, prefill, context,
                                prefill_ctx=pairs / prefill if prefill else 0.0)

    def kv_transfer_s(self, prompt_tokens: int) -> float:
        """Seconds to move one prompt's KV (all layers) from a prefill replica to this one, over
        the inter-node link the planner prices (:func:`coral_solver.perf.kv_transfer_s`)."""
        return perf.kv_transfer_s(self._arch, self._arch.layers, prompt_tokens)

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache the replica holds: the tightest stage's capacity."""
        return min(
            perf.kv_capacity_tokens(self._arch, gpu, self.layout.tp, layers, self._util)
            for gpu, layers in zip(self._gpus, self.layout.layers)
        )


class PipelineClock:
    """Books batches on pipeline stages: a stage serves one batch at a time, in arrival order."""

    def __init__(self, stages: int):
        self._free_at = [-math.inf] * stages

    def reserve(self, start: float, stage_times: Sequence[float]) -> float:
        """Book a batch that is ready at ``start``; return when it leaves the last stage."""
        t = start
        for k, duration in enumerate(stage_times):
            t = max(t, self._free_at[k]) + duration
            self._free_at[k] = t
        return t


@dataclass(frozen=True)
class EngineLimits:
    """The vLLM scheduler limits a replica was started with (the sim engine's = vLLM's defaults),
    and ``--sim-speed``: every step takes 1/speed of the modelled time."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = DEFAULT_BLOCK_SIZE
    gpu_memory_utilization: float = 0.9
    speed: float = 1.0


@dataclass(frozen=True)
class Request:
    """One request as the replica sees it: when it arrives, its lengths, KV it brings along."""

    at: float
    prompt_tokens: int
    max_tokens: int
    external: int = 0  #: prompt tokens already in the KV cache (from a prefill replica)


@dataclass(frozen=True)
class Outcome:
    """When the replica produced a request's first and last token, and how many (0: refused at
    arrival, because its prompt and output could never fit the KV cache — the sim engine's 400)."""

    first_s: float
    last_s: float
    tokens: int

    @property
    def refused(self) -> bool:
        return self.tokens == 0


#: watch(request index, first token s, last token s, tokens so far, finished) -> stop now?
Watch = Callable[[int, float, float, int, bool], bool]


def serve(layout: Layout, requests: list[Request],
          limits: EngineLimits = EngineLimits()) -> list[Outcome]:
    """Serve ``requests`` (sorted by arrival) on one replica of ``layout``; one outcome each, in
    order. A request the KV cache could never hold is answered at its arrival with no tokens."""
    first, last, produced, _ = serve_watched(layout, requests, limits, None)
    return [Outcome(first[i], last[i], produced[i]) for i in range(len(requests))]


_STEP_END, _ARRIVAL = 0, 1  # event kinds; at one instant they keep the order they were pushed


class _Engines:
    """The replica's virtual engines while it serves: the continuous-batching scheduler, the
    pipeline clock, the batch each engine is stepping, and the queue of events (arrivals and
    step ends) in virtual time."""

    def __init__(self, layout: Layout, requests: list[Request], limits: EngineLimits):
        self._model = StepModel(layout, limits.gpu_memory_utilization)
        self._limits = limits
        self.scheduler = Scheduler(
            kv_capacity_tokens=self._model.kv_capacity_tokens(), block_size=limits.block_size,
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens, num_engines=layout.stages)
        self._clock = PipelineClock(layout.stages)
        self._busy: list[Batch | None] = [None] * layout.stages
        self.events: list[tuple[float, int, int, int]] = []  # (time, order, kind, index)
        self._order = 0
        for i, request in enumerate(requests):
            self._push(request.at, _ARRIVAL, i)

    def _push(self, at: float, kind: int, index: int) -> None:
        """Queue an event; the running order breaks ties in time by push order."""
        self._order += 1
        heapq.heappush(self.events, (at, self._order, kind, index))

    def start_idle(self, now: float) -> None:
        """Give every idle engine its next batch (if the scheduler has one) and queue the time
        that batch leaves the last pipeline stage."""
        for e, batch in enumerate(self._busy):
            if batch is not None:
                continue
            batch = self.scheduler.schedule(e)
            if batch is None:
                continue
            self._busy[e] = batch
            times = self._model.batch_times(batch)
            if self._limits.speed != 1.0:
                times = tuple(t / self._limits.speed for t in times)
            self._push(self._clock.reserve(now, times), _STEP_END, e)

    def finish(self, engine: int) -> Batch:
        """Free ``engine`` at its step end; return the batch it stepped."""
        batch, self._busy[engine] = self._busy[engine], None
        # a step end is queued only for an engine that took a batch (start_idle)
        assert batch is not None
        return batch


def serve_watched(layout: Layout, requests: list[Request], limits: EngineLimits,
                  watch: Watch | None) -> tuple[dict[int, float], dict[int, float],
                                                dict[int, int], bool]:
    """:func:`serve`'s loop, telling ``watch`` of every request's first token, its finish (and
    of a refusal: 0 tokens, finished) and stopping as soon as ``watch`` says so (a capacity
    search stops once a rate's misses are past what its goal allows). Returns (first token s,
    last token s, tokens) by request index — only of requests that produced a token, or were
    refused, when stopped early — and whether it stopped early."""
    engines = _Engines(layout, requests, limits)
    index_of: dict[int, int] = {}  # id(seq) -> request index
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    produced: dict[int, int] = {}
    while engines.events:
        now, _, kind, index = heapq.heappop(engines.events)
        if kind == _ARRIVAL:
            request = requests[index]
            seq = Seq(str(index), request.prompt_tokens, request.max_tokens,
                      external=request.external)
            if not engines.scheduler.fits(seq.total_tokens):
                first[index] = last[index] = now
                produced[index] = 0
                if watch is not None and watch(index, now, now, 0, True):
                    return first, last, produced, True
                continue
            engines.scheduler.add(seq)
            index_of[id(seq)] = index
        else:
            for event in engines.scheduler.complete(engines.finish(index)):
                i = index_of[id(event.seq)]
                first.setdefault(i, now)
                last[i] = now
                produced[i] = event.index + 1
                if watch is not None and (event.index == 0 or event.finished) and watch(
                        i, first[i], now, event.index + 1, event.finished):
                    return first, last, produced, True
        engines.start_idle(now)
    return first, last, produced, False
