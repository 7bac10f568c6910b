"""The HTTP endpoint of the node agent and the controller: Prometheus `/metrics` and health checks.

It stays answerable whatever its clients do. One thread accepts connections and reads their
requests without blocking on any of them; a request must arrive whole within `read_timeout_s` of
its connection, or the connection is closed (so idle or slow connections cost no thread, and at
most `max_connections` are open: past that the oldest unfinished one is dropped). `max_connections`
is also kept to a quarter of the process's open-file limit, so that a flood of connections never
takes the files that the kubelet's calls need: a flood costs the flooder its oldest connections.
Should accepting fail for want of files all the same, the listener rests for a while (doubling,
up to a second) instead of spinning, and such failures are logged at most once per ten seconds
with the count of those held back. The listen backlog is `backlog`. Health checks are answered by that thread at once, from what the checks know in
memory, never behind `/metrics`: a check must not block. `/metrics` is rendered by a bounded pool of
`workers` threads with a bounded queue; when the queue is full the request is answered 503 at once.
Rendering takes the interpreter's lock for as long as it runs (115 ms at 2,000 claims), so scrapes
share renders: an answer is always rendered after its request arrived, but a render starts only
once `1 / METRICS_DUTY` times the last render's duration has passed since it ended (waiting at most
`METRICS_MAX_WAIT_S`), and every request that arrived before it starts takes its body. Scrapers in
a loop then cost the agent at most 2 % of its time, however many there are; they wait instead. The
render time is a metric itself (`dra_gpu_metrics_render_seconds`).
Every answer closes its connection (`Connection: close`), and an answer a client does not take
within `write_timeout_s` is dropped.

`/metrics` names every tenant of the node (namespaces, claims, pods, GPUs), so where `authorize` is given it
is answered only to a request whose `Authorization` header that function allows (200), otherwise with its
401, 403 or 503; the function runs on the metrics workers, as it may ask the API server
(`dra_gpu.kube.reviews`). Health checks stay open to the kubelet's probes, which carry no token: they
say whether the process works, and name no tenant.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gzip
import logging
import queue
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from dra_gpu.logs import Throttle

log = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, str]]
"""A health check: whether it passes, and the line to answer with. It answers from memory, at once."""
Authorize = Callable[[str | None], tuple[int, str]]
"""Who may read /metrics: the request's `Authorization` header (None: none) to an HTTP status (200:
allowed) and the line to answer with otherwise."""

MAX_REQUEST_HEAD = 8192
TEXT = "text/plain; charset=utf-8"
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
FILES_PER_CONNECTION_BUDGET = 4
"""Connections may take at most 1/4 of the open-file limit; the rest is the process's own work."""
OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_REST_S = (0.05, 1.0)
"""How long the listener rests after accepting failed for want of resources: first, and at most."""

METRICS_DUTY = 0.02
"""The share of its time the process may spend rendering /metrics."""
METRICS_MAX_WAIT_S = 5.0
RENDER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def connection_limit(wanted: int) -> int:
    """`wanted`, kept to a quarter of the open-file limit (soft: what `accept` is refused beyond)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft // FILES_PER_CONNECTION_BUDGET))


def parse_address(address: str) -> tuple[str, int]:
    """`:8080`, `0.0.0.0:8080` or `[::]:8080` to (host, port); the port must be a number (0: any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--http-address {address!r}: expected HOST:PORT such as :8080 or 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def bool_check(check: Callable[[], bool], failing: str = "not ready") -> Check:
    """A check from a plain predicate: `ok` when it holds, `failing` when it does not."""
    return lambda: (True, "ok") if check() else (False, failing)


def _response(
    code: int, body: bytes, content_type: str, head_only: bool = False, encoding: str | None = None
) -> bytes:
    head = (
        f"HTTP/1.1 {code} {REASONS.get(code, '')}\r\n"
        f"Content-Type: {content_type}\r\n"
        + (f"Content-Encoding: {encoding}\r\n" if encoding else "")
        + ('WWW-Authenticate: Bearer realm="metrics"\r\n' if code == 401 else "")
        + f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body


def _header(head: bytes, wanted: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == wanted:
            return value.strip()
    return None


def _accepts_gzip(head: bytes) -> bool:
    return b"gzip" in (_header(head, b"accept-encoding") or b"").lower()


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    outgoing: bytes = b""
    open: bool = True


class HttpServer:
    """Serves `/metrics` from `registry` and each path of `checks` (200 or 503); `port` is the bound port."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        checks: Mapping[str, Check],
        name: str = "http",
        *,
        workers: int = 2,
        queue_size: int = 16,
        backlog: int = 1024,
        max_connections: int = 1024,
        read_timeout_s: float = 5.0,
        write_timeout_s: float = 10.0,
        authorize: Authorize | None = None,
    ) -> None:
        self._registry = registry
        self._authorize = authorize
        self._checks = dict(checks)
        self._hint = ", ".join(["/metrics", *self._checks]).encode()
        self._name = name
        self._read_timeout_s = read_timeout_s
        self._write_timeout_s = write_timeout_s
        self._max_connections = connection_limit(max_connections)
        self._accept_rest = 0.0
        """How long the listener rests after the last failed accept (0: it is listening)."""
        self._accepting_at: float | None = None
        """When the resting listener listens again; None: it is listening."""
        self._accept_failures = Throttle()
        self._connection_failures = Throttle()
        self._render_lock = threading.Lock()
        self._rendered: tuple[dict[bool, bytes], float, float] | None = None
        """The last /metrics answers (plain and gzip, each made when first asked), when their render
        started (time.monotonic) and how long it took."""
        self._render_seconds = Histogram(
            "dra_gpu_metrics_render_seconds",
            "Time to render one /metrics answer (scrapes share renders; see the HTTP endpoint).",
            buckets=RENDER_BUCKETS,
            registry=registry,
        )
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=backlog)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._reading: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        """Connections whose request is not complete yet, oldest first (their deadlines in order)."""
        self._writing: set[_Connection] = set()
        self._jobs: queue.Queue[tuple[_Connection, bool, bool, float, str | None] | None] = queue.Queue(
            maxsize=queue_size
        )
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._serve, name=name, daemon=True)
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-metrics-{i}", daemon=True)
            for i in range(workers)
        ]

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._loop.start()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        if self._loop.is_alive():
            self._loop.join(timeout=5)
        for _ in self._workers:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        for worker in self._workers:
            if worker.is_alive():
                worker.join(timeout=self._write_timeout_s + 1)
        for conn in [*self._reading, *self._writing]:
            self._close(conn)
        self._selector.close()
        for sock in (self._listener, self._wake_read, self._wake_write):
            sock.close()

    # -- the loop: accept, read requests, answer checks ----------------------------------------------
    def _serve(self) -> None:
        while not self._stopping.is_set():
            timeout = 1.0
            if self._reading:
                oldest = next(iter(self._reading))
                timeout = max(0.0, min(timeout, oldest.deadline - time.monotonic()))
            if self._accepting_at is not None:
                timeout = max(0.0, min(timeout, self._accepting_at - time.monotonic()))
            for key, events in self._selector.select(timeout):
                try:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_read.recv(4096)
                    elif events & selectors.EVENT_WRITE:
                        self._flush(key.data)
                    else:
                        self._read(key.data)
                except Exception:  # one connection's trouble never stops the endpoint
                    held = self._connection_failures.allow()
                    if held is not None:
                        log.exception(
                            "http connection failed", extra={"server": self._name, "held_back": held}
                        )
                    if isinstance(key.data, _Connection):
                        self._close(key.data)
            self._expire()
            if self._accepting_at is not None and time.monotonic() >= self._accepting_at:
                self._accepting_at = None
                self._selector.register(self._listener, selectors.EVENT_READ, "accept")

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, then the others' turn
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of files: the backlog keeps the connection meanwhile
                self._rest_listener(exc)
                return
            self._accept_rest = 0.0
            sock.setblocking(False)
            if len(self._reading) + len(self._writing) >= self._max_connections:
                if not self._reading:  # all full with answers a client is slow to take: refuse this one
                    sock.close()
                    continue
                self._close(next(iter(self._reading)))  # the oldest unfinished request makes room
            conn = _Connection(sock, time.monotonic() + self._read_timeout_s)
            self._reading[conn] = None
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _rest_listener(self, exc: OSError) -> None:
        """Stop accepting for a while: the listener stays readable, and retrying at once would spin."""
        if exc.errno in OUT_OF_FILES:
            first, most = ACCEPT_REST_S
            self._accept_rest = min(most, self._accept_rest * 2 or first)
        else:
            self._accept_rest = ACCEPT_REST_S[0]
        self._accepting_at = time.monotonic() + self._accept_rest
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._listener)
        held = self._accept_failures.allow()
        if held is not None:
            log.warning(
                "http accept failed; the listener rests before accepting again",
                extra={
                    "server": self._name,
                    "error": str(exc),
                    "rest_s": self._accept_rest,
                    "connections": len(self._reading) + len(self._writing),
                    "held_back": held,
                },
            )

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.received += data
        end = conn.received.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.received) > MAX_REQUEST_HEAD:
                self._answer(conn, _response(400, b"request head too large\n", TEXT))
            return
        self._reading.pop(conn, None)
        self._selector.unregister(conn.sock)
        self._dispatch(conn, bytes(conn.received[:end]))

    def _dispatch(self, conn: _Connection, head: bytes) -> None:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._answer(conn, _response(400, b"bad request\n", TEXT))
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            self._answer(conn, _response(405, b"only GET and HEAD\n", TEXT))
            return
        head_only = method == "HEAD"
        path = target.split("?", 1)[0]
        if path == "/metrics":
            try:
                authorization = _header(head, b"authorization")
                self._jobs.put_nowait(
                    (
                        conn,
                        head_only,
                        _accepts_gzip(head),
                        time.monotonic(),
                        None if authorization is None else authorization.decode("latin-1"),
                    )
                )
            except queue.Full:
                self._answer(
                    conn, _response(503, b"busy: too many /metrics requests at once\n", TEXT, head_only)
                )
            return
        check = self._checks.get(path)
        if check is None:
            self._answer(conn, _response(404, b"not found: try " + self._hint + b"\n", TEXT, head_only))
            return
        try:
            ok, why = check()
        except Exception as exc:
            ok, why = False, f"the check failed: {exc}"
        self._answer(conn, _response(200 if ok else 503, (why + "\n").encode(), TEXT, head_only))

    def _answer(self, conn: _Connection, data: bytes) -> None:
        """Send `data` and close, without blocking: what the socket does not take now is sent later."""
        self._reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.outgoing = data
        conn.deadline = time.monotonic() + self._write_timeout_s
        self._writing.add(conn)
        self._flush(conn, register=True)

    def _flush(self, conn: _Connection, register: bool = False) -> None:
        try:
            sent = conn.sock.send(conn.outgoing)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.outgoing = conn.outgoing[sent:]
        if not conn.outgoing:
            self._close(conn)
        elif register:
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._reading:
            oldest = next(iter(self._reading))
            if oldest.deadline > now:
                break
            self._close(oldest)
        for conn in [c for c in self._writing if c.deadline <= now]:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        self._reading.pop(conn, None)
        self._writing.discard(conn)
        if not conn.open:
            return
        conn.open = False
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # -- the workers: /metrics ------------------------------------------------------------------------
    def _metrics_answer(self, gzipped: bool, asked_at: float) -> bytes:
        """The whole answer to a /metrics GET asked at `asked_at` (time.monotonic): from a render that
        started since, made now if there is none, once the last one is far enough behind; one render
        at a time (the others wait for it, and take it)."""
        with self._render_lock:
            rendered = self._rendered
            if rendered is None or rendered[1] < asked_at:
                if rendered is not None:
                    _, started, took = rendered
                    wait = started + took + took / METRICS_DUTY - time.monotonic()
                    if wait > 0:
                        self._stopping.wait(min(wait, METRICS_MAX_WAIT_S))
                started = time.monotonic()
                body = generate_latest(self._registry)
                took = time.monotonic() - started
                self._render_seconds.observe(took)
                rendered = self._rendered = (
                    {False: _response(200, body, CONTENT_TYPE_LATEST)},
                    started,
                    took,
                )
            answers = rendered[0]
            if gzipped not in answers:
                plain = answers[False]
                body = plain[plain.index(b"\r\n\r\n") + 4 :]
                answers[True] = _response(200, gzip.compress(body, 1), CONTENT_TYPE_LATEST, encoding="gzip")
            return answers[gzipped]

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, head_only, gzipped, asked_at, authorization = job
            try:
                code, why = self._authorize(authorization) if self._authorize else (200, "")
                if code != 200:
                    data = _response(code, (why + "\n").encode(), TEXT, head_only)
                else:
                    data = self._metrics_answer(gzipped, asked_at)
                if head_only:
                    data = data[: data.index(b"\r\n\r\n") + 4]
            except Exception as exc:
                log.exception("rendering /metrics failed", extra={"server": self._name})
                data = _response(503, f"metrics unavailable: {exc}\n".encode(), TEXT, head_only)
            try:
                conn.sock.settimeout(self._write_timeout_s)
                conn.sock.sendall(data)
            except OSError:
                pass  # the client left or did not read in time
            finally:
                conn.open = False
                with contextlib.suppress(OSError):
                    conn.sock.close()
