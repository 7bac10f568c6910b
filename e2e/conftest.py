"""The cluster the e2e tests run against (`KUBECONFIG`) and the node agent they use.

Settings (environment):

| variable | meaning | default |
|---|---|---|
| `KUBECONFIG` | the cluster; without it every test is skipped | none |
| `E2E_AGENT` | `daemonset` (installed from deploy/) or `local` (started here for one node) | `local` if `E2E_NODE_NAME` is set |
| `E2E_NODE_NAME` | the node whose pool the tests use (required for `local`) | first node with our slices |
| `E2E_KUBELET_DIR` | `local`: the kubelet directory the agent's sockets go to | `/var/lib/kubelet` |
| `E2E_CDI_DIR`, `E2E_STATE_DIR` | `local`: CDI and state directories | `/var/run/cdi`, a temporary directory |
| `E2E_GPUS` | `local`: simulated GPU profile | `3xH100-80GB` |
| `E2E_SHARING` | `local`: per-GPU sharing modes | `*=Shared,1=MPS,2=Exclusive` |
| `E2E_RUN_PODS` | `1`: also check what running containers see | `1` for `daemonset`, `0` for `local` |
| `E2E_IMAGE` | the test pods' image (needs `sh`) | `busybox:1.36` |
| `E2E_TIMEOUT` | seconds to wait for one thing | `120` |
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import Agent, Objects, node_slices, unique, wait_for

from dra_gpu import DRIVER_NAME
from dra_gpu.kube import KubeAPI, NotFound
from dra_gpu.kube.client import KubeClient
from dra_gpu.manifests import load_values, render

KUBECONFIG = os.environ.get("KUBECONFIG", "")
REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    if not KUBECONFIG:
        reason = "no cluster: set KUBECONFIG to run the end-to-end tests (see e2e/README.md)"
    elif not all(Path(p).is_file() for p in KUBECONFIG.split(os.pathsep) if p):
        reason = f"KUBECONFIG={KUBECONFIG} names no readable file"
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def api() -> KubeClient:
    client = KubeClient.from_kubeconfig(KUBECONFIG.split(os.pathsep)[0])
    try:
        client.list("DeviceClass")
    except NotFound:
        pytest.skip("the cluster does not serve resource.k8s.io/v1 (Kubernetes 1.34 or later is needed)")
    return client


@pytest.fixture(scope="session")
def core() -> Any:
    from kubernetes import client

    from dra_gpu.kube.client import load_api_client

    return client.CoreV1Api(load_api_client(KUBECONFIG.split(os.pathsep)[0]))


@pytest.fixture(scope="session")
def device_classes(api: KubeAPI) -> list[dict[str, Any]]:
    """Apply the DeviceClasses exactly as deploy/resourceclass.yaml has them."""
    classes = [d for d in yaml.safe_load_all(render(load_values())["resourceclass.yaml"]) if d]
    for device_class in classes:
        try:
            current = api.get("DeviceClass", device_class["metadata"]["name"])
        except NotFound:
            api.create("DeviceClass", device_class)
            continue
        device_class["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.update("DeviceClass", device_class)
    return classes


@contextlib.contextmanager
def _local_agent(node: str) -> Iterator[subprocess.Popen[bytes]]:
    kubelet_dir = Path(os.environ.get("E2E_KUBELET_DIR", "/var/lib/kubelet"))
    state = os.environ.get("E2E_STATE_DIR") or tempfile.mkdtemp(prefix="dra-gpu-e2e-state-")
    limiter = REPO / "native/limiter/build/libdragpu-limiter.so.1"
    command = [
        sys.executable,
        "-m",
        "dra_gpu.cli",
        "--log-format",
        "text",
        "kubelet-plugin",
        "--node-name",
        node,
        "--kubeconfig",
        KUBECONFIG.split(os.pathsep)[0],
        "--registration-dir",
        str(kubelet_dir / "plugins_registry"),
        "--plugins-dir",
        str(kubelet_dir / "plugins"),
        "--cdi-dir",
        os.environ.get("E2E_CDI_DIR", "/var/run/cdi"),
        "--state-dir",
        state,
        "--gpu-backend",
        "simulated:" + os.environ.get("E2E_GPUS", "3xH100-80GB"),
        "--sharing",
        os.environ.get("E2E_SHARING", "*=Shared,1=MPS,2=Exclusive"),
        "--http-address",
        "",
    ]
    if os.environ.get("E2E_LIMITER_LIBRARY") or limiter.exists():
        command += ["--limiter-library", os.environ.get("E2E_LIMITER_LIBRARY") or str(limiter)]
    log_path = Path(state) / "agent.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    sys.stderr.write(f"\nnode agent log: {log_path}\n")


@pytest.fixture(scope="session")
def agent(api: KubeAPI, device_classes: list[dict[str, Any]]) -> Iterator[Agent]:
    node = os.environ.get("E2E_NODE_NAME", "")
    mode = os.environ.get("E2E_AGENT", "local" if node else "daemonset")
    if mode not in ("local", "daemonset"):
        raise pytest.UsageError(f"E2E_AGENT={mode!r}: use 'local' or 'daemonset'")
    run_pods = os.environ.get("E2E_RUN_PODS", "1" if mode == "daemonset" else "0") == "1"
    if mode == "local":
        if not node:
            raise pytest.UsageError("E2E_AGENT=local needs E2E_NODE_NAME, the node the agent stands in for")
        with _local_agent(node) as process:
            wait_for(f"the local agent to publish node {node}'s slices", lambda: node_slices(api, node))
            if process.poll() is not None:
                pytest.fail(f"the local node agent exited with {process.returncode}")
            yield Agent(node, mode, run_pods)
        return
    if not node:
        items, _ = api.list("ResourceSlice", field_selector=f"spec.driver={DRIVER_NAME}")
        nodes = sorted({s["spec"].get("nodeName") for s in items if s["spec"].get("nodeName")})
        if not nodes:
            pytest.skip(
                "no node publishes our ResourceSlices: install deploy/ (e2e/README.md) or use E2E_AGENT=local"
            )
        node = nodes[0]
    wait_for(f"node {node}'s slices", lambda: node_slices(api, node))
    yield Agent(node, mode, run_pods)


@pytest.fixture(scope="session")
def namespace(core: Any, agent: Agent) -> Iterator[str]:
    from kubernetes import client

    name = unique("dra-gpu-e2e")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):  # the kubernetes client's ApiException: already gone
            core.delete_namespace(name)


@pytest.fixture
def objects(api: KubeAPI, core: Any, namespace: str, agent: Agent) -> Iterator[Objects]:
    made = Objects(api, core, namespace, agent.node)
    try:
        yield made
    finally:
        made.cleanup()
