"""`/healthz` and `/metrics` over HTTP, for the DaemonSet's probes and Prometheus."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """`:8080`, `0.0.0.0:8080` or `127.0.0.1:0` (any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"HTTP address {address!r} is invalid: expected HOST:PORT or :PORT, e.g. :8080")
    return host.strip("[]"), int(port)


class HttpServer:
    def __init__(
        self, address: str, registry: CollectorRegistry, healthz: Callable[[], tuple[bool, str]]
    ) -> None:
        registry_, check = registry, healthz

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry_), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez", "/readyz"):
                    ok, why = check()
                    self._reply(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found: try /healthz or /metrics\n", "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http request", extra={"request": format % args})

        self._server = ThreadingHTTPServer(parse_address(address), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
