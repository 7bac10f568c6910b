"""The real client (`dra_gpu.kube.client.KubeClient`) end to end against a local HTTP API server
(`tests/http_api_server.py`'s `ApiServer`, which answers as kube-apiserver does). What the tests check is the
client's half: the URLs, query parameters and bodies it sends, and how it decodes answers, errors and watch
streams.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
from http_api_server import ApiServer, Obj, Request, status_body
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


def test_server_version_reads_the_version_endpoint(server: ApiServer, client: KubeClient) -> None:
    """A managed cluster's minor carries a `+` ("37+"); the version decides what the driver publishes."""
    answers = {"/version": {"major": "1", "minor": "37+", "gitVersion": "v1.37.3-gke.100"}}
    plain = server.route
    server.route = lambda method, path, query, body: (  # type: ignore[method-assign]
        (200, answers[path]) if path in answers else plain(method, path, query, body)
    )
    assert client.server_version() == (1, 37)
    assert last(server, "GET").path == "/version"


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
