"""The gateway's own answers: errors in OpenAI's shape and JSON bodies, built the same way by
every route."""

from __future__ import annotations

import json
from typing import Any

from coral_hpc.gateway.http_server import Response


def error_response(status: int, message: str, kind: str,
                   headers: dict[str, str] | None = None) -> Response:
    """An error as OpenAI's API words it: ``{"error": {message, type, param, code}}``."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return Response(status=status, body=json.dumps(body).encode(), headers=headers)


def json_response(obj: Any) -> Response:
    """A 200 answer carrying ``obj`` as JSON."""
    return Response(body=json.dumps(obj).encode())
