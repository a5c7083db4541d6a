"""The access log's view of a request: what a handler notes beyond its status (model, replica,
tokens, a failure after the 200), and the server's hook that writes the line."""

from __future__ import annotations

import time

from coral_hpc.gateway.accesslog import AccessLog
from coral_hpc.gateway.http_server import Request
from coral_hpc.gateway.routing import ReplicaState
from coral_hpc.gateway.state import GatewayState

#: the key name of a request when the gateway has no keys file
ANONYMOUS = "anonymous"


class Outcome:
    """What the access log says of a proxied request beyond its status (``Request.note``)."""

    __slots__ = ("model", "stream", "replica", "prompt_tokens", "output_tokens", "estimated",
                 "error")

    def __init__(self, model: str, stream: bool) -> None:
        self.model = model
        self.stream = stream
        self.replica: ReplicaState | None = None     # the replica whose answer the client got
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.estimated: bool | None = None
        self.error: str | None = None                # what went wrong after the status was sent


def noted(request: Request, replica: ReplicaState, counts: tuple[int, int, bool] | None) -> None:
    """Tell the access log which replica answered ``request`` and with how many tokens."""
    note = request.note
    if isinstance(note, Outcome):
        note.replica = replica
        if counts is not None:
            note.prompt_tokens, note.output_tokens, note.estimated = counts


class AccessLogHook:
    """The access log's one hook (``ServerSettings.on_answered``): a line per request to the
    OpenAI routes (``/v1/…``), and per refused one (401) on any route. The metrics routes
    and ``/health``, polled every few seconds by the daemon and monitors, are not logged.
    Keys are read from ``state`` at each call: a reload is seen at once."""

    def __init__(self, access_log: AccessLog, state: GatewayState) -> None:
        self.access_log = access_log
        self.state = state

    def __call__(self, request: Request, status: int) -> None:
        path = request.path
        if not path.startswith("/v1/") and status != 401:
            return
        keys = self.state.keys
        key = request.key
        if key is None and keys is None:
            key = ANONYMOUS
        lab = keys.lab_of(key) if key is not None and keys is not None else None
        note = request.note
        latency = round(time.monotonic() - request.started, 4)
        if isinstance(note, Outcome):
            replica = note.replica
            self.access_log.record(
                time.time() - latency, key, lab, request.method, path, note.model, status,
                note.stream, note.prompt_tokens, note.output_tokens, note.estimated, latency,
                replica.id if replica else None, replica.job_id if replica else None,
                replica.url if replica else None, note.error)
        else:
            self.access_log.record(
                time.time() - latency, key, lab, request.method, path, None, status, None,
                None, None, None, latency, None, None, None, None)
