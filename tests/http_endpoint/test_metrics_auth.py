"""`/metrics` names every tenant of the node, so the agent serves it only to a bearer token the API server
says may `get /metrics` (a TokenReview, then a SubjectAccessReview that RBAC answers from the install's
`nonResourceURLs` rule), as kube-rbac-proxy does; health checks stay open to the kubelet's probes.

The agent runs for real (HTTP on loopback, gRPC sockets), the in-memory API server answers the reviews
from the ClusterRole and ClusterRoleBinding that `dra-gpu manifests` renders for Prometheus.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import yaml
from plugin_harness import PluginDirs, running_plugin

from dra_gpu.kube.fake import FakeKube
from dra_gpu.kube.reviews import PathAccess
from dra_gpu.manifests import load_values, render
from dra_gpu.node_agent import NodeAgent

PROMETHEUS = "system:serviceaccount:monitoring:prometheus-k8s"
NOSY = "system:serviceaccount:default:curious-pod"


def scrape(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def cluster() -> FakeKube:
    """The install's metrics RBAC, a token for Prometheus and one for a pod of another tenant."""
    api = FakeKube()
    for doc in yaml.safe_load_all(render(load_values())["rbac-kubelet-plugin.yaml"]):
        if (
            doc
            and doc["kind"] in ("ClusterRole", "ClusterRoleBinding")
            and "metrics" in doc["metadata"]["name"]
        ):
            api.create(doc["kind"], doc)
    api.tokens["prometheus-token"] = {
        "username": PROMETHEUS,
        "uid": "1",
        "groups": ["system:serviceaccounts"],
    }
    api.tokens["nosy-token"] = {"username": NOSY, "uid": "2", "groups": ["system:serviceaccounts"]}
    return api


@pytest.fixture
def agent(dirs: PluginDirs) -> Iterator[tuple[NodeAgent, FakeKube]]:
    api = cluster()
    with running_plugin(dirs, api, http_address="127.0.0.1:0", metrics_auth=True) as plugin:
        yield plugin, api


def test_an_unauthenticated_scrape_is_refused_and_an_authorised_one_answered(
    agent: tuple[NodeAgent, FakeKube],
) -> None:
    plugin, _ = agent
    url = f"http://127.0.0.1:{plugin.http_port}/metrics"
    code, body = scrape(url)
    assert code == 401 and "dra_gpu_" not in body
    assert scrape(url, "forged-token")[0] == 401
    code, body = scrape(url, "nosy-token")
    assert code == 403 and "dra_gpu_" not in body
    assert NOSY in body
    code, body = scrape(url, "prometheus-token")
    assert code == 200 and "dra_gpu_" in body


def test_health_checks_answer_the_kubelets_probe_without_a_token(agent: tuple[NodeAgent, FakeKube]) -> None:
    plugin, _ = agent
    code, _ = scrape(f"http://127.0.0.1:{plugin.http_port}/livez")
    assert code in (200, 503)  # answered (its verdict is the probe's business), never 401


def test_answers_are_cached_briefly_and_a_revoked_binding_stops_working() -> None:
    api = cluster()
    now = [0.0]
    access = PathAccess(api, allowed_ttl_s=60, denied_ttl_s=10, clock=lambda: now[0])
    assert access.check("Bearer prometheus-token").status == 200
    reviews = len([c for c in api.calls if c[1].endswith("Review")])
    assert access.check("Bearer prometheus-token").status == 200
    assert len([c for c in api.calls if c[1].endswith("Review")]) == reviews  # from the cache
    api.delete("ClusterRoleBinding", "dra-gpu-metrics-reader")
    now[0] = 61.0
    assert access.check("Bearer prometheus-token").status == 403
    assert access.check(None).status == 401
    assert access.check("Basic dXNlcjpwYXNz").status == 401


def test_an_api_server_that_cannot_be_asked_refuses_rather_than_passes() -> None:
    class Down(FakeKube):
        def create(self, kind: str, obj: dict) -> dict:
            raise ConnectionRefusedError("connection refused")

    assert PathAccess(Down()).check("Bearer prometheus-token").status == 503
