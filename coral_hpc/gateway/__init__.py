"""The gateway: one OpenAI-compatible endpoint for every model, routing to READY replicas by the
daemon's routing table, metering demand per model and API key. Runs in its own process.

Public pieces: :mod:`~coral_hpc.gateway.table` (the routing-table file the daemon writes),
:class:`~coral_hpc.gateway.proxy.GatewaySettings` and :func:`~coral_hpc.gateway.server.run_gateway`.
Submodules are imported where used so ``import coral_hpc.gateway.table`` stays light.
"""
