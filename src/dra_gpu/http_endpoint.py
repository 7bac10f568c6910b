"""The HTTP endpoint of the node agent and the controller: Prometheus `/metrics` and health checks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, str]]
"""A health check: whether it passes, and the line to answer with."""


def parse_address(address: str) -> tuple[str, int]:
    """`:8080`, `0.0.0.0:8080` or `[::]:8080` to (host, port); the port must be a number (0: any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--http-address {address!r}: expected HOST:PORT such as :8080 or 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def bool_check(check: Callable[[], bool], failing: str = "not ready") -> Check:
    """A check from a plain predicate: `ok` when it holds, `failing` when it does not."""
    return lambda: (True, "ok") if check() else (False, failing)


class HttpServer:
    """Serves `/metrics` from `registry` and each path of `checks` (200 or 503); `port` is the bound port."""

    def __init__(
        self, address: str, registry: CollectorRegistry, checks: Mapping[str, Check], name: str = "http"
    ) -> None:
        paths = dict(checks)
        hint = ", ".join(["/metrics", *paths]).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in paths:
                    ok, why = paths[path]()
                    self._reply(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found: try " + hint + b"\n", "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # probes every few seconds
                log.debug("http request", extra={"request": format % args})

        self._server = ThreadingHTTPServer(parse_address(address), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
