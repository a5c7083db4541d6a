"""Disaggregated serving in the sim engine: vLLM's per-request KV-connector protocol.

With ``--kv-transfer-config`` a vLLM server takes either part of a request, decided by the
request's ``kv_transfer_params`` (vLLM's toy proxy and coral-hpc's gateway send them):

- ``{"do_remote_decode": true, ...}`` (sent with ``max_tokens: 1``): prefill here and keep the KV
  for a decode replica; the non-streaming answer carries the ``kv_transfer_params`` that replica
  needs (``do_remote_prefill``, this engine's id, host, port and the prompt's blocks);
- ``{"do_remote_prefill": true, ...}`` (what a prefill answer returned): load the prompt's KV
  from the prefill replica — after the transfer time the planner prices for it — and continue
  from it, computing only the last prompt token (as vLLM does for its logits).

What was loaded is counted in ``vllm:external_prefix_cache_{queries,hits}_total`` like vLLM's
connector metrics. The sim moves no data: a hit is a request whose params name the sim's own
handoff for a prompt of the same length; anything else is a miss and is prefilled locally.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coral_replica_sim.batching import blocks_for

#: the sim's own field in its handoff: the prompt length the KV is for (a decode side that gets
#: another prompt, e.g. a retried request with a changed prompt, misses and recomputes)
PROMPT_TOKENS_KEY = "remote_prompt_tokens"


@dataclass
class KvTransfer:
    """The KV-connector side of one sim server (see the module docstring)."""

    config: dict[str, Any]
    tp: int
    block_size: int
    transfer_s: Callable[[int], float]  #: prompt tokens → modelled seconds to load their KV
    host: str = "127.0.0.1"
    port: int = 0
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def role(self) -> str:
        """vLLM's kv_role: kv_producer (prefill only), kv_consumer (decode only), kv_both."""
        return str(self.config.get("kv_role", "kv_both"))

    def is_prefill(self, params: dict[str, Any] | None) -> bool:
        """Whether the request asks this server to prefill for a remote decode."""
        return bool(params and params.get("do_remote_decode")) and self.role != "kv_consumer"

    def lookup(self, params: dict[str, Any] | None, prompt_tokens: int) -> tuple[int, float]:
        """(prompt tokens whose KV comes from the prefill replica, modelled load seconds)."""
        if not params or not params.get("do_remote_prefill") or self.role == "kv_producer":
            return 0, 0.0
        if params.get(PROMPT_TOKENS_KEY) != prompt_tokens or prompt_tokens < 2:
            return 0, 0.0  # not the KV of this prompt: prefill it here
        return prompt_tokens - 1, float(self.transfer_s(prompt_tokens))

    def handoff(self, prompt_tokens: int) -> dict[str, Any]:
        """The ``kv_transfer_params`` a prefill answer hands to the decode replica."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(blocks_for(prompt_tokens, self.block_size))),
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_tp_size": self.tp,
            PROMPT_TOKENS_KEY: prompt_tokens,
        }
