"""The gateway's own routes: ``/health``, the model list, ``/metrics`` and ``/internal/*``.

Model list (``GET /v1/models``) and one model (``GET /v1/models/{id}``, the openai SDK's
``client.models.retrieve(id)``; the id percent-decoded, so ``org/name`` ids work): OpenAI's
``model`` objects (``id``, ``object``, ``created``, ``owned_by``) for every configured model and
every model in the routing table, plus three fields of coral-hpc's own that clients may ignore:

* ``ready``: a request for it would be routed now (a replica serving both phases, or a prefill
  replica, is in the table and not taken out after a failure); false means it would get a 503
  with Retry-After (no READY replica yet, or scaled to zero);
* ``ready_replicas``: replicas of it in the table and answering, every role counted;
* ``replicas``: replicas of it in the table.

Both need a valid API key when keys are configured (401 otherwise, before anything about models
is said); an unknown id is a 404 in OpenAI's error shape (``invalid_request_error``, code
``model_not_found``, ``param`` ``model``).

``/metrics`` and ``/internal/*`` take a client key or the daemon's internal key (which opens
nothing else), from every address, loopback too: a login node's loopback is shared by everyone
logged in. ``/health`` is open: it says the gateway answers and nothing about models, keys or
replicas. Without a keys file (``gateway.open_on_loopback``, which the start allows on loopback
only) every route is open.
"""

from __future__ import annotations

import hmac
import json
from typing import Any
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coral_hpc.gateway.answers import error_response, json_response
from coral_hpc.gateway.auth import hash_key
from coral_hpc.gateway.http_server import Request, Response
from coral_hpc.gateway.metering import DemandMeter, GatewayMetrics
from coral_hpc.gateway.routing import Router
from coral_hpc.gateway.state import GatewayState

#: ``GET /v1/models/{id}``: one model (the rest of the path, percent-decoded, is its id)
MODELS_PREFIX = "/v1/models/"


class AdminRoutes:
    """Handlers of the routes that are not forwarded to a replica (module docstring)."""

    def __init__(self, state: GatewayState, router: Router, meter: DemandMeter,
                 metrics: GatewayMetrics) -> None:
        self.state = state
        self.router = router
        self.meter = meter
        self.metrics = metrics

    def _authorized_internal(self, request: Request) -> bool:
        """Metrics and internal JSON: a client key, or the daemon's internal key, from any
        address (loopback too: on a login node everyone logged in shares it). Without a keys
        file (``open_on_loopback``, the only way the start allows that) they are open."""
        if self.state.keys is None:
            return True
        authorization = request.headers.get("authorization")
        if self.state.internal_digest is not None and authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer" and token.strip() and hmac.compare_digest(
                    hash_key(token.strip()), self.state.internal_digest):
                return True
        return self.state.keys.name_for(authorization) is not None

    async def handle_health(self, request: Request) -> Response:
        """Open to all: the gateway answers, and its routing table's version."""
        return json_response({"status": "ok", "table_version": self.router.version})

    def _model_object(self, model: str) -> dict[str, Any]:
        """OpenAI's ``model`` object plus this gateway's readiness (see the module docstring)."""
        states = self.router.replicas(model)
        healthy = [s for s in states if s.healthy]
        return {"id": model, "object": "model", "created": 0, "owned_by": "coral-hpc",
                "ready": any(s.role in ("both", "prefill") for s in healthy),
                "ready_replicas": len(healthy), "replicas": len(states)}

    def _client_key_missing(self, request: Request) -> Response | None:
        if self.state.keys is None:
            return None
        request.key = self.state.keys.name_for(request.headers.get("authorization"))
        if request.key is None:
            return error_response(401, "missing or invalid API key", "authentication_error")
        return None

    async def handle_models(self, request: Request) -> Response:
        """``GET /v1/models``: every model the request's key may use."""
        refused = self._client_key_missing(request)
        if refused is not None:
            return refused
        return json_response({"object": "list",
                              "data": [self._model_object(m) for m in sorted(self.state.known)
                                       if self._may_use(request, m)]})

    def _may_use(self, request: Request, model: str) -> bool:
        """Whether the request's key may use ``model`` (every model without a keys file)."""
        keys = self.state.keys
        return keys is None or request.key is None or keys.allows(request.key, model)

    async def handle_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``: one model, or 404 in OpenAI's error shape."""
        refused = self._client_key_missing(request)
        if refused is not None:
            return refused
        model = unquote(request.path[len(MODELS_PREFIX):])
        if model not in self.state.known:
            self.metrics.client_errors.labels("404").inc()
            # OpenAI's own answer for an unknown model, field for field
            body = {"error": {"message": f"The model {model!r} does not exist; GET /v1/models "
                                         "lists them", "type": "invalid_request_error",
                              "param": "model", "code": "model_not_found"}}
            return Response(status=404, body=json.dumps(body).encode())
        if not self._may_use(request, model):
            return error_response(403, f"API key {request.key!r} may not use model {model!r}",
                                  "permission_error")
        return json_response(self._model_object(model))

    async def handle_metrics(self, request: Request) -> Response:
        """Prometheus text of the gateway's metrics."""
        if not self._authorized_internal(request):
            return error_response(401, "missing or invalid API key", "authentication_error")
        return Response(body=generate_latest(self.metrics.registry),
                        content_type=CONTENT_TYPE_LATEST)

    async def handle_demand(self, request: Request) -> Response:
        """The demand meter's windows per model and key (the daemon's input)."""
        if not self._authorized_internal(request):
            return error_response(401, "missing or invalid API key", "authentication_error")
        snapshot = self.meter.snapshot(self.router.ready_count, tuple(sorted(self.state.known)))
        snapshot["table_version"] = self.router.version
        return json_response(snapshot)

    async def handle_routing(self, request: Request) -> Response:
        """Every known model's replicas as the gateway sees them now."""
        if not self._authorized_internal(request):
            return error_response(401, "missing or invalid API key", "authentication_error")
        return json_response({
            "version": self.router.version,
            "models": {m: [s.describe() for s in self.router.replicas(m)]
                       for m in sorted(self.state.known)},
        })
