"""Disaggregated requests: a prefill replica computes the prompt's KV, a decode replica answers.

For a model whose plan has prefill and decode replicas (routing-table ``role``), a request goes

1. to a **prefill** replica as vLLM's disaggregation proxy sends it: ``max_tokens: 1``, not
   streamed, with ``kv_transfer_params: {"do_remote_decode": true, ...}``; its answer's
   ``kv_transfer_params`` (if any: a shared-storage connector needs none) say where the KV is;
2. to a **decode** replica: the client's own request plus those ``kv_transfer_params``, sent
   through the gateway's ordinary forwarding, so the client gets one answer (streamed or not)
   and the usual failure rules hold: a failure before a byte reached the client is retried —
   here both phases again, on other replicas, since the KV may have gone with a dead decode
   replica; with no decode replica left, the whole request goes to an aggregated or a prefill
   replica (vLLM's ``kv_both`` engines serve whole requests too). A 5xx answer, from either
   phase, is tried on another replica too, as on the aggregated path: vLLM answers 500 to every
   new request while it drains after a SIGTERM the daemon did not send
   (:class:`~coral_hpc.gateway.forward.UpstreamServerError`). Such a replica is skipped for
   this request but not taken out of routing; when every replica answered 5xx the client gets
   the last answer. Once a stream has started, a failure ends it with an SSE error event.

A model with aggregated replicas as well (``policy.disaggregation: auto``) splits its traffic
between the two paths in proportion to their capacity: the aggregated replicas' weights against
min(prefill weights, decode weights), by smooth weighted round-robin like the replicas
themselves. Phases are metered apart (``coral_gateway_phase_*``): prefill replicas are sized on
prompt tokens, decode replicas on output tokens (ARCHITECTURE "Units").

This module forwards through :class:`~coral_hpc.gateway.forward.Forwarder` and picks replicas
from the :class:`~coral_hpc.gateway.routing.Router`; it knows nothing of the gateway above it.
"""

from __future__ import annotations

import copy
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from coral_hpc.gateway.answers import error_response
from coral_hpc.gateway.forward import Forwarder, UpstreamFailed, UpstreamServerError
from coral_hpc.gateway.http_server import Request, Response, StreamResponse
from coral_hpc.gateway.metering import GatewayMetrics
from coral_hpc.gateway.routing import ReplicaState, Router

if TYPE_CHECKING:
    from coral_hpc.gateway.metering import _Children

log = logging.getLogger("coral_hpc.gateway")

#: what a prefill request carries (vLLM's toy proxy / NixlConnector protocol)
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prefill_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The client's request as the prefill replica gets it: one token, not streamed, asking it
    to keep the KV for a remote decode."""
    out = copy.deepcopy(payload)
    out["kv_transfer_params"] = dict(PREFILL_PARAMS)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def decode_payload(payload: dict[str, Any], kv_transfer_params: object) -> dict[str, Any]:
    """The client's request as the decode replica gets it: unchanged, plus where the KV is."""
    out = dict(payload)
    if isinstance(kv_transfer_params, dict) and kv_transfer_params:
        out["kv_transfer_params"] = kv_transfer_params
    return out


def _capacity(router: Router, model: str, role: str) -> float:
    return sum(s.weight for s in router.replicas(model) if s.healthy and s.role == role)


class _PhaseFailed(Exception):
    """A phase could not be served on any replica; ``response`` is what the client gets."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


class PhaseMetrics:
    """Prometheus counters per phase of disaggregated serving (``coral_gateway_phase_*``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "coral_gateway_phase_requests", "Requests per phase of disaggregated serving.",
            ["model", "phase"], registry=registry)
        self.tokens = Counter(
            "coral_gateway_phase_tokens",
            "Tokens per phase: prompt tokens prefilled, output tokens decoded.",
            ["model", "phase"], registry=registry)
        self.failures = Counter(
            "coral_gateway_phase_failures", "Phase attempts that failed on a replica.",
            ["model", "phase"], registry=registry)

    def count_decoded(self, model: str, generated: int) -> None:
        """Output tokens a decode replica produced (called from the gateway's token charging,
        :class:`~coral_hpc.gateway.tokens.TokenAccounting`)."""
        self.tokens.labels(model, "decode").inc(generated)


class Disaggregation:
    """Path choice and the two-phase forwarding (see the module docstring)."""

    def __init__(self, router: Router, forwarder: Forwarder, metrics: GatewayMetrics,
                 phases: PhaseMetrics, max_retries: int) -> None:
        self.router = router
        self.forwarder = forwarder
        self.metrics = metrics
        self.phases = phases
        self.max_retries = max_retries               # other replicas tried, per phase
        self._credit: dict[str, list[float]] = {}  # model → [aggregated, disaggregated] SWRR

    def wants(self, model: str) -> bool:
        """Whether this request of ``model`` takes the disaggregated path: both phases have a
        healthy replica, and (when aggregated replicas exist too) it is the path's turn."""
        router = self.router
        split = min(_capacity(router, model, "prefill"), _capacity(router, model, "decode"))
        if split <= 0:
            return False
        both = _capacity(router, model, "both")
        if both <= 0:
            return True
        credit = self._credit.setdefault(model, [0.0, 0.0])
        credit[0] += both
        credit[1] += split
        pick = 1 if credit[1] >= credit[0] else 0
        credit[pick] -= both + split
        return pick == 1

    def only_prefill_left(self, model: str) -> bool:
        """No aggregated and no decode replica of ``model`` is healthy, but a prefill replica is:
        the request is served whole there (:meth:`serve` falls through to it), not refused."""
        router = self.router
        return (_capacity(router, model, "prefill") > 0 and _capacity(router, model, "both") <= 0
                and _capacity(router, model, "decode") <= 0)

    async def serve(self, request: Request, model: str, payload: dict[str, Any], key: str,
                    children: _Children, started: float, early: StreamResponse | None = None
                    ) -> Response | StreamResponse:
        """Answer one request through a prefill and then a decode replica (module docstring).
        ``early``: a held stream's answer whose head went out while the model woke; the
        decode replica's events go into it (any other answer is the caller's to end it with)."""
        stream = bool(payload.get("stream", False))
        request_id = f"coral-{uuid.uuid4().hex}"
        prefill_body = json.dumps(prefill_payload(payload)).encode()
        failed_prefill: list[ReplicaState] = []
        failed_decode: list[ReplicaState] = []
        last = "no replica"
        answered: Response | None = None  # the last 5xx a decode replica answered
        for _ in range(self.max_retries + 1):
            # the decode replica first: with none left, a prefill would be wasted work
            decode = self.router.choose(model, exclude=failed_decode, role="decode")
            if decode is None:
                break
            try:
                params = await self._prefill(request, model, prefill_body, request_id,
                                             failed_prefill)
            except _PhaseFailed as failed:
                return failed.response
            body = json.dumps(decode_payload(payload, params)).encode()
            try:
                response = await self.forwarder.attempt(request, decode, body, payload, key,
                                                        children, started, stream, early)
            except (UpstreamServerError, UpstreamFailed) as exc:
                # a draining replica is skipped but kept in; a failed one is out (attempt):
                # nothing reached the client, so both phases again
                last = str(exc)
                if isinstance(exc, UpstreamServerError):
                    answered = exc.response
                failed_decode.append(decode)
                self.phases.failures.labels(model, "decode").inc()
                self.metrics.retries.labels(model).inc()
                continue
            self.phases.requests.labels(model, "decode").inc()
            return response
        return await self._whole(request, model, payload, key, children, started,
                                 failed_prefill + failed_decode, last, answered, early)

    async def _whole(self, request: Request, model: str, payload: dict[str, Any], key: str,
                     children: _Children, started: float, failed: list[ReplicaState], last: str,
                     answered: Response | None = None, early: StreamResponse | None = None
                     ) -> Response | StreamResponse:
        """No decode replica could answer: the request as it came, to an aggregated replica or,
        failing that, a prefill replica (vLLM's kv_both engines serve whole requests too), so
        losing the decode side does not lose the request. ``answered``: the last 5xx answer
        so far, what the client gets when no replica does better."""
        body = json.dumps(payload).encode()
        stream = bool(payload.get("stream", False))
        for role in ("both", "prefill"):
            for _ in range(self.max_retries + 1):
                replica = self.router.choose(model, exclude=failed, role=role)
                if replica is None:
                    break
                try:
                    response = await self.forwarder.attempt(request, replica, body, payload, key,
                                                            children, started, stream, early)
                except (UpstreamServerError, UpstreamFailed) as exc:
                    last = str(exc)
                    if isinstance(exc, UpstreamServerError):
                        answered = exc.response
                    failed.append(replica)
                    continue
                self.phases.requests.labels(model, f"whole_on_{role}").inc()
                log.warning("%s: no decode replica answered; served whole on %s replica %s",
                            model, role, replica.id)
                return response
        if answered is not None:  # every replica tried answered 5xx: say what the last said
            return answered
        self.metrics.errors.labels(model, "upstream_failed").inc()
        return error_response(502, f"decode replica(s) of {model!r} failed: {last}",
                              "upstream_error")

    async def _prefill(self, request: Request, model: str, body: bytes, request_id: str,
                       failed: list[ReplicaState]) -> object:
        """Prefill on a replica (another one after a transport failure or a 5xx answer); the
        answer's ``kv_transfer_params``. A 4xx answer is the client's answer (its request is
        bad), and so is the last 5xx when every prefill replica tried answered one."""
        answered: Response | None = None
        while True:
            replica = self.router.choose(model, exclude=failed, role="prefill")
            if replica is None or len(failed) > self.max_retries:
                if answered is not None:
                    raise _PhaseFailed(answered)
                self.metrics.errors.labels(model, "upstream_failed").inc()
                raise _PhaseFailed(error_response(
                    502, f"{len(failed)} prefill replica(s) of {model!r} failed",
                    "upstream_error"))
            try:
                status, data = await self.forwarder.post_whole(
                    replica, request.path, body, extra_headers=f"X-Request-Id: {request_id}\r\n")
            except UpstreamFailed:  # taken out by post_whole
                failed.append(replica)
                self.phases.failures.labels(model, "prefill").inc()
                continue
            if status != 200:
                self.metrics.errors.labels(model, f"upstream_{status}").inc()
                if status >= 500:  # a draining replica (module docstring): try another one
                    answered = Response(status=status, body=data)
                    failed.append(replica)
                    self.phases.failures.labels(model, "prefill").inc()
                    continue
                raise _PhaseFailed(Response(status=status, body=data))
            return self._kv_params(model, data)

    def _kv_params(self, model: str, data: bytes) -> object:
        """A prefill answer's ``kv_transfer_params``; its prompt tokens are the phase's."""
        try:
            answer = json.loads(data)
        except ValueError:
            answer = {}
        self.phases.requests.labels(model, "prefill").inc()
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.phases.tokens.labels(model, "prefill").inc(usage["prompt_tokens"])
        return answer.get("kv_transfer_params") if isinstance(answer, dict) else None
