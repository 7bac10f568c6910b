"""The controller's HTTP endpoint: `/metrics` for Prometheus, `/healthz` and `/readyz` for the kubelet."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not worth a line
        pass


def parse_address(address: str) -> tuple[str, int]:
    """`:8080`, `0.0.0.0:8080` or `[::]:8080` to (host, port); the port must be a number."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--http-address {address!r}: expected HOST:PORT such as :8080 or 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def make_app(
    registry: CollectorRegistry, healthy: Callable[[], bool], ready: Callable[[], bool]
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok = healthy() if path == "/healthz" else ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"not ready\n"]
        if path == "/metrics":
            body: Iterable[bytes] = metrics(environ, start_response)
            return body
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    return app


class HttpServer:
    """A small threaded server; `port` is the bound port (useful with port 0 in tests)."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
    ) -> None:
        host, port = parse_address(address)
        self._server: WSGIServer = make_server(
            host, port, make_app(registry, healthy, ready), handler_class=_QuietHandler
        )
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="controller-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
