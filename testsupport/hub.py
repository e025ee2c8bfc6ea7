"""A local stand-in for the Hugging Face hub's file endpoints, for tests (no network).

It answers what huggingface_hub asks for a model repository: HEAD and GET of /{owner}/{name}/resolve/{rev}/{file}
with the X-Repo-Commit and ETag headers, byte ranges (safetensors headers are read with Range requests), and the
errors the hub gives (401 GatedRepo, 404 RepoNotFound / EntryNotFound), told apart by its X-Error-Code header.
Point huggingface_hub at it with HF_ENDPOINT.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def safetensors_header_file(tensors: dict[str, tuple[str, list[int]]]) -> tuple[bytes, int]:
    """A safetensors file holding only its header (the hub serves no tensor data here) and its tensor bytes."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "F8_E4M3": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob, offset


class HubStandIn:
    """repos: {"owner/name": {"file": bytes}}; gated: repo ids that answer 401; slow: repo ids that stall."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = (), slow: tuple[str, ...] = (),
                 stall_seconds: float = 5.0):
        self.repos, self.gated, self.slow, self.stall = repos, gated, slow, stall_seconds
        self.requests: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                stand_in._answer(self, body=False)

            def do_GET(self):
                stand_in._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append(f"{handler.command} {handler.path}")
        match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", handler.path.split("?")[0])
        if not match:
            return self._error(handler, 404, "RepoNotFound", "Repository not found")
        repo, _, filename = match.groups()
        if repo in self.slow:
            time.sleep(self.stall)
        if repo in self.gated:
            return self._error(handler, 401, "GatedRepo", f"Access to model {repo} is restricted.")
        if repo not in self.repos:
            return self._error(handler, 404, "RepoNotFound", "Repository not found")
        data = self.repos[repo].get(filename)
        if data is None:
            return self._error(handler, 404, "EntryNotFound", f"{filename} does not exist on main")
        status, part = 200, data
        ranged = re.match(r"bytes=(\d+)-(\d*)", handler.headers.get("Range", ""))
        if ranged:
            start = int(ranged.group(1))
            end = min(int(ranged.group(2)) if ranged.group(2) else len(data) - 1, len(data) - 1)
            status, part = 206, data[start:end + 1]
        handler.send_response(status)
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        handler.send_header("Content-Length", str(len(part)))
        if ranged:
            handler.send_header("Content-Range", f"bytes {start}-{start + len(part) - 1}/{len(data)}")
        handler.end_headers()
        if body:
            handler.wfile.write(part)

    @staticmethod
    def _error(handler: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        blob = json.dumps({"error": message}).encode()
        handler.send_response(status)
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(blob)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(blob)
