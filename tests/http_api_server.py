"""A local HTTP API server for tests of the real client (`dra_gpu.kube.client.KubeClient`).

No cluster runs here, so `ApiServer` answers like kube-apiserver does over HTTP/1.1: the REST paths of
`dra_gpu.kube.resources`, JSON `Status` bodies with code, reason and message for errors, and watches as a
chunked stream of one JSON event per line. Behind the HTTP layer it keeps its objects in `FakeKube`, so
conflicts, preconditions and the status subresource behave as the fake (and the real server) do. It
records each request, so a test can check the URLs, query parameters and bodies a client sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from dra_gpu.kube import ApiError, Gone
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.resources import RESOURCES

Obj = dict[str, Any]
BY_PLURAL = {r.plural: r for r in RESOURCES.values()}


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


def _first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


class Request:
    def __init__(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> None:
        self.method, self.path, self.query, self.body = method, path, query, body


class RawAnswer(Exception):
    """Answer 200 with these bytes as they are."""

    def __init__(self, body: bytes) -> None:
        self.body = body


class ApiServer:
    """A kube-apiserver look-alike on 127.0.0.1 in front of a FakeKube."""

    def __init__(self, port: int = 0) -> None:
        self.fake = FakeKube()
        self.requests: list[Request] = []
        self.watch_lines: list[bytes] | None = None
        """When set, the next watch streams these raw lines (each one chunk) instead of real events."""
        self.watch_status: tuple[int, str, str] | None = None
        """When set, the next watch is refused with this HTTP status (code, reason, message)."""
        self.watch_closed = threading.Event()
        self.raw_lists: dict[str, bytes] = {}
        """Kind -> the body a list of that kind answers, as given (e.g. JSON the fake cannot hold)."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.handle(self, "GET")

            def do_POST(self) -> None:
                server.handle(self, "POST")

            def do_PUT(self) -> None:
                server.handle(self, "PUT")

            def do_DELETE(self) -> None:
                server.handle(self, "DELETE")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- HTTP ---------------------------------------------------------------------------------

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        query = parse_qs(url.query)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        self.requests.append(Request(method, url.path, query, body))
        try:
            if query.get("watch") == ["true"]:
                self.watch(h, url.path, query)
                return
            code, answer = self.route(method, url.path, query, body)
        except ApiError as exc:
            self.send(h, exc.status, status_body(exc.status, exc.reason, exc.message))
            return
        except RawAnswer as raw:
            self.send(h, 200, raw.body)
            return
        self.send(h, code, json.dumps(answer).encode())

    @staticmethod
    def send(h: BaseHTTPRequestHandler, code: int, payload: bytes) -> None:
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    @staticmethod
    def parse(path: str) -> tuple[str, str | None, str | None, str | None]:
        """kind, namespace, name, subresource of a REST path."""
        parts = path.strip("/").split("/")
        parts = parts[2:] if parts[0] == "api" else parts[3:]  # drop /api/v1 or /apis/group/version
        namespace = None
        if parts[0] == "namespaces" and len(parts) > 2:
            namespace, parts = parts[1], parts[2:]
        kind = BY_PLURAL[parts[0]].kind
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        return kind, namespace, name, sub

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Obj]:
        if method == "GET" and path.rstrip("/") == "/version":  # as every API server answers, to anyone
            major, minor = self.fake.server_version()
            return 200, {"major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0"}
        kind, namespace, name, sub = self.parse(path)
        field = _first(query, "fieldSelector")
        label = _first(query, "labelSelector")
        if method == "GET" and name:
            return 200, self.fake.get(kind, name, namespace)
        if method == "GET" and kind in self.raw_lists:
            raise RawAnswer(self.raw_lists[kind])
        if method == "GET":
            items, rv = self.fake.list(kind, namespace, field, label)
            for item in items:  # a real list leaves kind and apiVersion off its items
                item.pop("kind", None)
                item.pop("apiVersion", None)
            return 200, {"kind": f"{kind}List", "metadata": {"resourceVersion": rv}, "items": items}
        if method == "POST":
            if namespace:
                body.setdefault("metadata", {})["namespace"] = namespace
            return 201, self.fake.create(kind, body)
        if method == "PUT" and sub == "status":
            return 200, self.fake.update_status(kind, body)
        if method == "PUT":
            return 200, self.fake.update(kind, body)
        if method == "DELETE" and name:
            pre = (body or {}).get("preconditions") or {}
            self.fake.delete(kind, name, namespace, pre.get("uid"), pre.get("resourceVersion"))
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        if method == "DELETE":
            self.fake.delete_collection(kind, namespace, field)
            return 200, {"kind": f"{kind}List", "items": []}
        raise ApiError(f"unexpected {method} {path}")

    def watch(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]]) -> None:
        if self.watch_status is not None:
            code, reason, message = self.watch_status
            self.watch_status = None
            self.send(h, code, status_body(code, reason, message))
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for line in self.watch_stream(path, query):
                h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            self.watch_closed.set()

    def watch_stream(self, path: str, query: dict[str, list[str]]) -> Iterator[bytes]:
        if self.watch_lines is not None:
            lines, self.watch_lines = self.watch_lines, None
            yield from lines
            return
        kind, namespace, _, _ = self.parse(path)
        try:
            events = self.fake.watch(
                kind,
                namespace,
                _first(query, "fieldSelector"),
                _first(query, "labelSelector"),
                _first(query, "resourceVersion"),
                timeout_s=float(query["timeoutSeconds"][0]),
            )
            for event in events:
                yield json.dumps(event).encode() + b"\n"
        except Gone as exc:
            status = json.loads(status_body(410, "Expired", exc.message))
            yield json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"
