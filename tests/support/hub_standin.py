"""A stand-in for the Hugging Face Hub on loopback: the few endpoints ``snapshot_download`` uses,
serving model folders from local disk. No hub is reachable from these machines; with
``HF_ENDPOINT`` pointing here, ``coral-hpc stage`` runs its real job path — sbatch, the engine
environment, ``huggingface_hub.snapshot_download`` — against files this test controls.

What it proves: the staging job downloads every file of every model into ``HF_HOME`` on the
shared filesystem, once (a second run makes no file request), with the token from the token file
sent as the ``Authorization`` header. What it does not prove: anything about the real hub's
behaviour beyond these endpoints (redirects to a CDN, Xet storage, gated-repo answers).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class HubStandIn:
    """``repos``: repo id → folder whose files make up that model's one revision."""

    def __init__(self, repos: dict[str, Path], token: str | None = None) -> None:
        self.repos = repos
        self.token = token
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, authorization)
        self.commits = {repo: hashlib.sha1(repo.encode()).hexdigest() for repo in repos}
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubStandIn:  # noqa: PYI034
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def file_requests(self) -> list[str]:
        return [path for method, path, _ in self.requests
                if method == "GET" and "/resolve/" in path]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _route(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path, self.headers.get("Authorization")))
                wanted = f"Bearer {hub.token}"
                if hub.token is not None and self.headers.get("Authorization") != wanted:
                    return self._send(401, b'{"error": "token required"}', head)
                if path.startswith("/api/models/"):
                    return self._repo_info(path[len("/api/models/"):], head)
                for repo, folder in hub.repos.items():
                    prefix = f"/{repo}/resolve/"
                    if path.startswith(prefix):
                        _revision, _, name = path[len(prefix):].partition("/")
                        return self._file(repo, folder / name, head)
                return self._send(404, b'{"error": "not found"}', head)

            def _repo_info(self, rest: str, head: bool) -> None:
                # /api/models/<repo>/revision/<rev> (repo info) or /api/models/<repo>/tree/<rev>
                repo, kind = rest, "info"
                for marker in ("/revision/", "/tree/"):
                    if marker in rest:
                        repo, kind = rest.split(marker)[0], marker.strip("/")
                if repo not in hub.repos:
                    # as the hub answers for a repo that does not exist (or is private)
                    return self._send(401, b'{"error": "Repository Not Found"}', head,
                                      {"X-Error-Code": "RepoNotFound",
                                       "Content-Type": "application/json"})
                folder = hub.repos[repo]
                files = sorted(p for p in folder.rglob("*") if p.is_file())
                if kind == "tree":
                    data: object = [
                        {"type": "file", "path": f.relative_to(folder).as_posix(),
                         "size": f.stat().st_size,
                         "oid": hashlib.sha1(f.read_bytes()).hexdigest()}
                        for f in files
                    ]
                else:
                    data = {"id": repo, "modelId": repo, "sha": hub.commits[repo],
                            "siblings": [{"rfilename": f.relative_to(folder).as_posix()}
                                         for f in files]}
                self._send(200, json.dumps(data).encode(), head,
                           {"Content-Type": "application/json"})

            def _file(self, repo: str, file: Path, head: bool) -> None:
                if not file.is_file():
                    return self._send(404, b'{"error": "Entry not found"}', head)
                data = file.read_bytes()
                etag = hashlib.sha256(data).hexdigest()
                self._send(200, data, head, {"X-Repo-Commit": hub.commits[repo],
                                             "ETag": f'"{etag}"',
                                             "Content-Type": "application/octet-stream"})

            def _send(self, status: int, body: bytes, head: bool,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._route(head=False)

            def do_HEAD(self) -> None:
                self._route(head=True)

        return Handler
