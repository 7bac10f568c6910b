"""The real client (`dra_gpu.kube.client.KubeClient`) end to end against a local HTTP API server.

No cluster runs here, so `ApiServer` below answers like kube-apiserver does over HTTP/1.1: the REST
paths of `dra_gpu.kube.resources`, JSON `Status` bodies with code, reason and message for errors, and
watches as a chunked stream of one JSON event per line. Behind the HTTP layer it keeps its objects in
`FakeKube`, so conflicts, preconditions and the status subresource behave as the fake (and the real
server) do. What the tests check is the client's half: the URLs, query parameters and bodies it sends,
and how it decodes answers, errors and watch streams.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from waiting import wait_for

from dra_gpu.kube import (
    AlreadyExists,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    builders,
    objects,
)
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.resources import RESOURCES

kubernetes = pytest.importorskip("kubernetes", reason="the real client is built on the kubernetes package")

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


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    yield s
    s.close()


@pytest.fixture
def client(server: ApiServer) -> KubeClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = server.url
    return KubeClient(kubernetes.client.ApiClient(configuration))


def claim(name: str = "c") -> Obj:
    return builders.claim(name, "gpu", namespace="team-a")


def last(server: ApiServer, method: str) -> Request:
    return [r for r in server.requests if r.method == method][-1]


# --- verbs ----------------------------------------------------------------------------------------


def test_create_get_list_use_the_api_servers_paths_and_parameters(
    server: ApiServer, client: KubeClient
) -> None:
    created = client.create("ResourceClaim", claim())
    assert last(server, "POST").path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
    assert last(server, "POST").query == {"fieldManager": ["dra-gpu"]}
    assert client.get("ResourceClaim", "c", "team-a")["metadata"]["uid"] == created["metadata"]["uid"]
    assert last(server, "GET").path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c"

    client.create("Node", {"metadata": {"name": "node-1", "labels": {"gpu": "yes"}}})
    client.create("Node", {"metadata": {"name": "node-2"}})
    items, rv = client.list("Node", field_selector="metadata.name=node-1", label_selector="gpu=yes")
    listed = last(server, "GET")
    assert listed.path == "/api/v1/nodes"
    assert listed.query == {"fieldSelector": ["metadata.name=node-1"], "labelSelector": ["gpu=yes"]}
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in items] == [("Node", "v1", "node-1")]
    assert rv == server.fake.list("Node")[1]


def test_update_and_status_update_put_the_object_and_its_status_subresource(
    server: ApiServer, client: KubeClient
) -> None:
    created = client.create("ResourceClaim", claim())
    created["metadata"]["labels"] = {"x": "y"}
    updated = client.update("ResourceClaim", created)
    assert last(server, "PUT").path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c"
    updated["status"] = {"allocation": {"devices": {"results": []}}}
    stored = client.update_status("ResourceClaim", updated)
    assert last(server, "PUT").path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c/status"
    assert stored["status"]["allocation"] == {"devices": {"results": []}}
    with pytest.raises(Conflict, match="the object has been modified"):
        client.update("ResourceClaim", created)  # the resourceVersion read before the label update


def test_delete_sends_delete_options_with_preconditions(server: ApiServer, client: KubeClient) -> None:
    node = client.create("Node", {"metadata": {"name": "node-1"}})
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: wrong"):
        client.delete("Node", "node-1", uid="wrong")
    assert last(server, "DELETE").body == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": "wrong"},
    }
    meta = node["metadata"]
    client.delete("Node", "node-1", uid=meta["uid"], resource_version=meta["resourceVersion"])
    assert last(server, "DELETE").body["preconditions"] == {
        "uid": meta["uid"],
        "resourceVersion": meta["resourceVersion"],
    }
    assert server.fake.objects("Node") == []
    client.create("Node", {"metadata": {"name": "node-2"}})
    client.delete("Node", "node-2")
    assert last(server, "DELETE").body is None  # no preconditions: no body


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.get("Node", "nope"), NotFound, 'nodes "nope" not found'),
        (lambda c: c.create("Node", {"metadata": {"name": "n"}}), AlreadyExists, 'nodes "n" already exists'),
        (
            lambda c: c.create("ResourceSlice", {"metadata": {"name": "s"}, "spec": {"driver": "d"}}),
            Invalid,
            "spec.pool.name: Required value",
        ),
    ],
)
def test_status_bodies_become_the_matching_errors(
    client: KubeClient, call: Callable[[KubeClient], Any], error: type[ApiError], message: str
) -> None:
    client.create("Node", {"metadata": {"name": "n"}})
    with pytest.raises(error) as err:
        call(client)
    assert message in err.value.message


# --- watch ----------------------------------------------------------------------------------------


def test_watch_streams_events_after_the_lists_resource_version(server: ApiServer, client: KubeClient) -> None:
    client.create("Node", {"metadata": {"name": "before"}})
    _, rv = client.list("Node")
    client.create("Node", {"metadata": {"name": "after"}})
    client.delete("Node", "before")
    events = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in client.watch("Node", resource_version=rv, timeout_s=1)
    ]
    assert events == [("ADDED", "after"), ("DELETED", "before")]
    watched = last(server, "GET")
    assert watched.query == {
        "watch": ["true"],
        "timeoutSeconds": ["1"],
        "allowWatchBookmarks": ["true"],
        "resourceVersion": [rv],
    }


def test_watch_passes_bookmarks_on_and_decodes_events_split_over_chunks(
    server: ApiServer, client: KubeClient
) -> None:
    added = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "n", "resourceVersion": "5"}}})
    bookmark = json.dumps(
        {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "9"}}}
    )
    server.watch_lines = [added[:20].encode(), added[20:].encode() + b"\n", bookmark.encode() + b"\n"]
    events = list(client.watch("Node", timeout_s=1))
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("ADDED", "5"),
        ("BOOKMARK", "9"),
    ]


def test_watch_error_event_with_410_is_gone(server: ApiServer, client: KubeClient) -> None:
    status = json.loads(status_body(410, "Expired", "too old resource version: 1 (5)"))
    server.watch_lines = [json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"]
    with pytest.raises(Gone, match="too old resource version"):
        list(client.watch("Node", resource_version="1", timeout_s=1))


@pytest.mark.parametrize(
    ("code", "reason", "error"),
    [(403, "Forbidden", Forbidden), (410, "Gone", Gone), (500, "InternalError", ApiError)],
)
def test_a_watch_the_server_refuses_raises_instead_of_ending_quietly(
    server: ApiServer, client: KubeClient, code: int, reason: str, error: type[ApiError]
) -> None:
    # An informer that took a refused watch for an empty one would re-watch at once, forever.
    message = 'nodes is forbidden: User "system:serviceaccount:x:y" cannot watch resource "nodes"'
    server.watch_status = (code, reason, message)
    with pytest.raises(error) as err:
        list(client.watch("Node", timeout_s=1))
    assert err.value.status == code
    assert err.value.message == message


def test_an_error_body_that_is_not_json_is_reported_as_text(client: KubeClient) -> None:
    err = KubeClient._error(503, b"upstream connect error", "https://api:6443/api/v1/nodes")
    assert (type(err), err.status) == (ApiError, 503)
    assert (
        err.message
        == "https://api:6443/api/v1/nodes answered HTTP 503 Service Unavailable: upstream connect error"
    )


def test_the_controllers_informer_works_over_the_real_client(server: ApiServer, client: KubeClient) -> None:
    from dra_gpu.controller.cache import Informer

    client.create("Node", {"metadata": {"name": "node-1"}})
    informer = Informer(client, "Node", watch_timeout_s=1, retry_s=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert informer.wait_synced(10)
        assert informer.get("", "node-1") is not None
        client.create("Node", {"metadata": {"name": "node-2"}})
        wait_for(lambda: informer.get("", "node-2"), what="node-2 delivered to the informer by the watch")
    finally:
        stop.set()
        thread.join(5)


def deep_json(levels: int) -> str:
    """Opaque parameters nested `levels` deep (2 bytes a level: valid for the API server, whose limit is
    10,000 levels and 1.5 MiB)."""
    return '{"a":' * levels + "1" + "}" * levels


def test_one_claim_nested_a_thousand_levels_fails_itself_never_the_list(
    server: ApiServer, client: KubeClient
) -> None:
    good = [
        json.dumps({"metadata": {"name": f"ok-{i}", "namespace": "a", "uid": f"u{i}"}, "spec": {"x": "[{"}})
        for i in range(3)
    ]
    odd = (
        '{"metadata":{"name":"odd","namespace":"a","uid":"u9"},"spec":{"devices":{"config":[{"opaque":'
        '{"driver":"other.example.com","parameters":' + deep_json(1000) + "}}]}}}"
    )
    server.raw_lists["ResourceClaim"] = (
        '{"kind":"ResourceClaimList","metadata":{"resourceVersion":"7"},"items":['
        + ",".join([good[0], odd, *good[1:]])
        + "]}"
    ).encode()
    items, rv = client.list("ResourceClaim")
    assert rv == "7" and [objects.name(i) for i in items] == ["ok-0", "odd", "ok-1", "ok-2"]
    assert [i["spec"] for i in items if objects.name(i) != "odd"] == [{"x": "[{"}] * 3
    _, parameters = objects.opaque_parameters(objects.claim_configs(items[1])[0])
    depth = 0
    while isinstance(parameters, dict):
        parameters, depth = parameters["a"], depth + 1
    assert parameters == objects.TOO_DEEP and depth < objects.MAX_DEPTH

    server.watch_lines = [b'{"type":"ADDED","object":' + odd.encode() + b"}\n"]
    events = list(client.watch("ResourceClaim", timeout_s=5))
    assert [objects.name(e["object"]) for e in events] == ["odd"]
