"""Where pods can run: the container sees the environment and the files of its share."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import Agent, Objects, claim_spec, node_devices, results, unique, wait_for

from dra_gpu.kube import KubeAPI

PROBE = (
    "env | sort; "
    "for f in $(cat /etc/ld.so.preload 2>/dev/null) $(echo \"$LD_PRELOAD\" | tr ': ' '  '); do "
    'test -r "$f" && echo "readable-preload $f"; done; '
    'test -n "$CUDA_MPS_PIPE_DIRECTORY" && test -d "$CUDA_MPS_PIPE_DIRECTORY" && echo "mps-pipe-dir-present"; '
    "echo probe-done; sleep 3600"
)


@pytest.fixture(autouse=True)
def _pods_must_run(agent: Agent) -> None:
    if not agent.run_pods:
        pytest.skip(
            "pods do not run in this setup; set E2E_RUN_PODS=1 where the agent's CDI specs reach the runtime"
        )


def run_probe(
    api: KubeAPI, objects: Objects, core: Any, device_class: str, capacity: dict[str, str] | None
) -> tuple[str, dict[str, Any]]:
    name = unique("probe")
    objects.claim(name, claim_spec(device_class, capacity))
    objects.pod(name, {"gpu": {"resourceClaimName": name}}, PROBE)
    (result,) = results(objects.allocated(name))
    device = next(d for d in node_devices(api, objects.node) if d["name"] == result["device"])

    def logs() -> str | None:
        phase = (objects.get("Pod", name).get("status") or {}).get("phase")
        if phase != "Running":
            return None
        text: str = core.read_namespaced_pod_log(name, objects.namespace)
        return text if "probe-done" in text else None

    return wait_for(f"pod {name} to run its probe", logs), device


def uuid_of(device: dict[str, Any]) -> str:
    return str(device["attributes"]["uuid"]["string"])


def test_a_limiter_share_preloads_the_limiter_and_names_its_gpu(
    api: KubeAPI, objects: Objects, core: Any
) -> None:
    log, device = run_probe(api, objects, core, "limiter.gpu.dra-gpu.io", {"memory": "1Gi", "cores": "10"})
    assert "readable-preload" in log and "libdragpu-limiter" in log, log
    assert uuid_of(device) in log, "the container's environment does not name its GPU"


def test_a_whole_gpu_is_not_limited(api: KubeAPI, objects: Objects, core: Any, agent: Agent) -> None:
    if not any(d["attributes"]["sharing"]["string"] == "Exclusive" for d in node_devices(api, agent.node)):
        pytest.skip(f"node {agent.node} has no Exclusive GPU (whole-GPU claims get only those)")
    log, device = run_probe(api, objects, core, "gpu.dra-gpu.io", None)
    assert uuid_of(device) in log
    assert "libdragpu-limiter" not in log


def test_an_mps_share_reaches_its_daemon(api: KubeAPI, objects: Objects, core: Any, agent: Agent) -> None:
    if not any(d["attributes"]["sharing"]["string"] == "MPS" for d in node_devices(api, agent.node)):
        pytest.skip(f"node {agent.node} has no MPS GPU")
    log, device = run_probe(api, objects, core, "mps.gpu.dra-gpu.io", {"memory": "1Gi", "cores": "10"})
    assert "CUDA_MPS_PIPE_DIRECTORY=" in log and "mps-pipe-dir-present" in log, log
    assert uuid_of(device) in log
