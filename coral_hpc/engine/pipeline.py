"""Step latencies and KV capacity of a replica's layout, from the performance model.

A replica is ``S`` pipeline stages, one TP degree for all of them (vLLM requires it); stage ``k``
runs ``layers[k]`` layers on GPUs of type ``gpu_types[k]`` (types may differ: heterogeneous
pipelines). Everything here asks :mod:`coral_solver.perf` — the same model the planner uses — so the
sim's latencies are exactly what the plan promised, and load tests check those promises.

Pipeline timing, kept simple:

* one step of a batch takes ``stage_times[k]`` on stage ``k`` and visits the stages in order, so
  its **latency** is the *sum* of the stage times;
* a stage works on one batch at a time; with ``S`` virtual engines (vLLM runs one per stage) up to
  ``S`` batches are in flight, so the **throughput** is bounded by the *slowest* stage.
  :class:`PipelineClock` books each batch on each stage in turn to produce exactly that.
* the KV capacity is the smallest of the stages' capacities (each stage holds the KV of its own
  layers for every running sequence, so the tightest stage decides how many tokens fit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from coral_hpc.engine.batching import Batch
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
        return tuple(
            perf.step_latency_s(
                self._arch,
                gpu,
                self.layout.tp,
                layers,
                decode_seqs,
                prefill_tokens,
                context_tokens,
                n_stages=len(self._gpus),
                prefill_ctx=prefill_ctx,
            )
            for gpu, layers in zip(self._gpus, self.layout.layers)
        )

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
        context = sum(s.computed + 1 for s in batch.decode) + sum(
            s.computed for s, _ in batch.prefill)
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
