"""docs/security.md says what the node agent is given: the host paths mounted (read-only where it only
reads), privileges, and who reaches its HTTP port. Here the rendered install is held to that list, so
that a mount, a capability or a port added to a template without its reason in the docs fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from repo_paths import ROOT

from dra_gpu.manifests import load_values, render
from dra_gpu.usage.live import AGENT_NAMESPACE

DOC = ROOT / "docs" / "security.md"
Obj = dict[str, Any]


def objects(values_text: str | None = None, tmp_path: Path | None = None) -> list[Obj]:
    path = None
    if values_text is not None and tmp_path is not None:
        path = tmp_path / "values.yaml"
        path.write_text(values_text)
    return [d for text in render(load_values(path)).values() for d in yaml.safe_load_all(text) if d]


def the(docs: list[Obj], kind: str, name: str) -> Obj:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def documented_mounts() -> set[tuple[str, str, str, str]]:
    """(host path, mounted at, access, container) of the table under "Host paths mounted into the agent"."""
    text = DOC.read_text().split("### Host paths mounted into the agent", 1)[1]
    rows = set()
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("| `"):
            rows.add((cells[0], cells[1], cells[2], cells[3]))
        elif rows and not line.startswith("|"):
            break
    return rows


def rendered_mounts(pod: Obj) -> set[tuple[str, str, str, str]]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    found = set()
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        for mount in container.get("volumeMounts", []):
            host = volumes[mount["name"]].get("hostPath")
            if host is not None:
                access = "read-only" if mount.get("readOnly") else "read-write"
                found.add((host["path"], mount["mountPath"], access, container["name"]))
    return found


def agent_pod(docs: list[Obj]) -> Obj:
    pod: Obj = the(docs, "DaemonSet", "dra-gpu-kubelet-plugin")["spec"]["template"]["spec"]
    return pod


def test_the_agent_mounts_exactly_the_documented_host_paths_and_never_the_root() -> None:
    pod = agent_pod(objects())
    mounts = rendered_mounts(pod)
    assert mounts == documented_mounts()
    assert all(host != "/" for host, *_ in mounts)
    assert {m for m in mounts if m[2] == "read-write"} == {
        m for m in documented_mounts() if m[2] == "read-write"
    }


def test_only_the_agent_is_privileged_with_real_gpus_and_nothing_with_simulated_ones(tmp_path: Path) -> None:
    doc = DOC.read_text()
    for values, privileged in (
        (None, {"plugin"}),
        ("kubeletPlugin: {gpuBackend: 'simulated:1xA100-40GB'}\n", set()),
    ):
        docs = objects(values, tmp_path)
        pod = agent_pod(docs)
        containers = [*pod.get("initContainers", []), *pod["containers"]]
        assert {c["name"] for c in containers if c["securityContext"].get("privileged")} == privileged
        for c in containers:
            if not c["securityContext"].get("privileged"):
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
        controller = the(docs, "Deployment", "dra-gpu-controller")["spec"]["template"]["spec"]
        assert controller["securityContext"]["runAsNonRoot"] is True
        assert "volumes" not in controller
    assert "Why privileged, and not a list of capabilities" in doc and "hostPID" in doc


def test_only_the_scrapers_namespaces_reach_the_http_port() -> None:
    docs = objects()
    policy = the(docs, "NetworkPolicy", "dra-gpu-http")
    assert "`dra-gpu-http`" in DOC.read_text()
    selected = {e["key"]: e["values"] for e in policy["spec"]["podSelector"]["matchExpressions"]}
    assert selected == {
        "app.kubernetes.io/name": ["dra-gpu"],
        "app.kubernetes.io/component": ["kubelet-plugin", "controller"],
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": load_values().metrics.scraperNamespaces,
        }
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": "http"}]
    for pod in (agent_pod(docs), the(docs, "Deployment", "dra-gpu-controller")["spec"]["template"]["spec"]):
        for container in pod["containers"]:
            assert [p["name"] for p in container.get("ports", [])] == ["http"]
            assert {e["name"]: e.get("value") for e in container["env"]}["DRA_GPU_METRICS_AUTH"] == "true"


def test_no_scraper_namespace_means_no_pod_reaches_the_port(tmp_path: Path) -> None:
    policy = the(objects("metrics: {scraperNamespaces: []}\n", tmp_path), "NetworkPolicy", "dra-gpu-http")
    assert policy["spec"]["ingress"] == []


def test_the_agent_has_a_privileged_namespace_of_its_own_and_the_rest_is_restricted() -> None:
    docs = objects()
    values = load_values()
    levels = {
        d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for d in docs
        if d["kind"] == "Namespace"
    }
    assert levels == {values.kubeletPlugin.namespace: "privileged", values.namespace: "restricted"}
    placed = {d["metadata"].get("namespace") for d in docs if d["kind"] in ("DaemonSet", "ServiceAccount")}
    assert (
        the(docs, "DaemonSet", "dra-gpu-kubelet-plugin")["metadata"]["namespace"]
        == values.kubeletPlugin.namespace
    )
    assert the(docs, "Deployment", "dra-gpu-controller")["metadata"]["namespace"] == values.namespace
    assert placed == {values.kubeletPlugin.namespace, values.namespace}
    assert values.kubeletPlugin.namespace == AGENT_NAMESPACE  # where `dra-gpu usage` looks for the agents
