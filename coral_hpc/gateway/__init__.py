"""The gateway: one OpenAI-compatible endpoint for every model, routing to READY replicas by the
daemon's routing table, metering demand per model and API key. Runs in its own process.

Public pieces: :mod:`~coral_hpc.gateway.table` (the routing-table file the daemon writes),
:class:`~coral_hpc.gateway.settings.GatewaySettings` (also importable from
:mod:`~coral_hpc.gateway.proxy`), :class:`~coral_hpc.gateway.proxy.Gateway` and
:func:`~coral_hpc.gateway.server.run_gateway`.

Units, each with one job, importing downwards only (an import contract in pyproject.toml):
:mod:`~coral_hpc.gateway.server` runs the process; :mod:`~coral_hpc.gateway.proxy` wires the
application; :mod:`~coral_hpc.gateway.request_path` (the OpenAI routes),
:mod:`~coral_hpc.gateway.admin` (health, models, metrics, internal) and
:mod:`~coral_hpc.gateway.reload` (table and key files) sit on :mod:`~coral_hpc.gateway.disagg`
(prefill → decode), which sits on :mod:`~coral_hpc.gateway.forward` (one request to one replica),
on :mod:`~coral_hpc.gateway.replicas` (pools and health), :mod:`~coral_hpc.gateway.tokens`
(counting and charging tokens) and :mod:`~coral_hpc.gateway.outcome` (the access log's line).
Below them: the HTTP server, the upstream client, routing, metering, keys and the access log.
Submodules are imported where used so ``import coral_hpc.gateway.table`` stays light.
"""
